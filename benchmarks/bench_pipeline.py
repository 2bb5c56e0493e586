"""bench_pipeline: a 2-layer MLP served request by request: runner.map vs a hand-written loop vs
await runner.run vs numpy, per request, and how far each is above the request's device time.

The graph: y = relu(x @ W1 + b1) @ W2 + b2 with x batch x d_in (32 x 128 by default), W1 d_in x
d_hidden (128 x 256), W2 d_hidden x d_out (256 x 64), weights and biases marked constant
(MatMul + BiasAdd + ReLU, then MatMul + BiasAdd). N requests (200; --quick 20), each a fresh x
generated before timing, are served these ways:

  (a) ``runner.map(..., max_in_flight=4)``, weights given once (``compile_graph(constants=)``);
  (b) a hand-written loop: 4 tasks pulling requests from a trio memory channel, each with its
      own tensors, doing upload (``stream.write``) + ``CompiledPartition.execute`` (every
      partition of the runner, in order) + ``stream.read``, awaiting the read;
  (c) ``await runner.run`` one request at a time, weights given once;
  (d) numpy: ``np.maximum(x @ W1 + b1, 0) @ W2 + b2`` in float32;
  (e) ``runner.map`` with the weights passed as arrays in every request: the constant tensor
      cache uploads them once (a hit per weight per request after the first);
  (f) dynamic batching: 8 tasks each awaiting ``DynamicBatcher.run`` for its next request
      (``max_batch=8``, 2 runs in flight, no added delay), the batcher opened (every batch size
      compiled) before timing;
  (g) on a CUDA GPU with torch: torch eager, one request at a time (x to the GPU, the MLP,
      y back to numpy; TF32 off), weights resident;
  (h) the same in a CUDA graph: x copied into the graph's input, ``replay()``, y back.

(a), (b), (c), (e) share one out-of-order stream. Every sample of every variant is checked
against a float64 numpy reference, outside the timed region. Variants are interleaved in
rotating order inside each repetition; the table gives medians of the per-request time (total /
N). Device time per request: a few requests run one at a time under ``triodnn.trace.record()``
on a profiling stream, summing the device spans of their kernels (and, apart, of their copies);
"above device" is a variant's time per request minus the kernel time of one request.

    python benchmarks/bench_pipeline.py [--engine gpu:0] [--requests 200] [--reps 15] [--quick]
"""

from __future__ import annotations

import time

import _common as common
import numpy as np
import trio

import triodnn
from triodnn import StreamFlags

try:  # optional peer, compared on a CUDA GPU
    import torch
except ImportError:  # pragma: no cover - depends on the machine
    torch = None
from triodnn.graph import DynamicBatcher, Graph, LogicalTensor, Op, Tensor, compile_graph

X, W1, B1, W2, B2, Y = 0, 1, 2, 3, 4, 9
IN_FLIGHT = 4
BATCHERS = 8  # concurrent requesters of the dynamic-batching variant, and its max_batch


def extra_args(parser) -> None:
    parser.add_argument("--requests", type=int, default=None, help="requests per sample (default 200, quick 20)")
    parser.add_argument("--reps", type=int, default=None, help="timed repetitions (default 15, quick 3)")
    parser.add_argument("--batch", type=int, default=32, help="rows of x (default 32)")
    parser.add_argument("--sizes", default="128,256,64", help="d_in,d_hidden,d_out (default 128,256,64)")


def lt(i, shape, prop="variable"):
    return LogicalTensor(i, "f32", shape, layout_type="strided", property_type=prop)


def mlp_graph(batch: int, d_in: int, d_hidden: int, d_out: int) -> Graph:
    g = Graph("cpu")
    g.add_op(Op(0, "MatMul", [lt(X, [batch, d_in]), lt(W1, [d_in, d_hidden], "constant")], [lt(5, [batch, d_hidden])]))
    g.add_op(Op(1, "BiasAdd", [lt(5, [batch, d_hidden]), lt(B1, [d_hidden], "constant")], [lt(6, [batch, d_hidden])]))
    g.add_op(Op(2, "ReLU", [lt(6, [batch, d_hidden])], [lt(7, [batch, d_hidden])]))
    g.add_op(Op(3, "MatMul", [lt(7, [batch, d_hidden]), lt(W2, [d_hidden, d_out], "constant")], [lt(8, [batch, d_out])]))
    g.add_op(Op(4, "BiasAdd", [lt(8, [batch, d_out]), lt(B2, [d_out], "constant")], [lt(Y, [batch, d_out])]))
    return g


class HandLoop:
    """(b): ``IN_FLIGHT`` worker tasks, each with its own input, intermediate and output tensors,
    pulling requests from a memory channel: write x, execute every partition (each after its
    producers' events), read y, await the read, store the result."""

    def __init__(self, runner, engine, stream, weights: dict[int, Tensor]) -> None:
        self.partitions = runner.compiled_partitions
        self.stream = stream
        self.weights = weights
        by_id = {x.id: x for x in runner.inputs}
        for cp in self.partitions:
            by_id.update({x.id: x for x in cp.inputs})
            by_id.update({x.id: x for x in cp.outputs})
        self.y_lt = next(x for x in runner.outputs if x.id == Y)
        # Per worker: a tensor for every logical tensor that is not a weight.
        self.tensors = [
            {i: weights[i] if i in weights else Tensor(x, engine) for i, x in by_id.items()}
            for _ in range(IN_FLIGHT)
        ]

    async def __call__(self, xs: list[np.ndarray], results: list) -> None:
        send, recv = trio.open_memory_channel(0)

        async def feed():
            async with send:
                for i, x in enumerate(xs):
                    await send.send((i, x))

        async def worker(tensors):
            stream = self.stream
            y = tensors[Y]
            async for i, x in recv:
                events = {X: stream.write(tensors[X].memory, x)}
                for cp in self.partitions:
                    deps = [events[t.id] for t in cp.inputs if t.id in events]
                    done = cp.execute(stream, [tensors[t.id] for t in cp.inputs],
                                      [tensors[t.id] for t in cp.outputs], deps=deps)
                    for t in cp.outputs:
                        events[t.id] = done
                out = np.empty(y.memory.desc.dims, np.float32)
                await stream.read(y.memory, out, deps=[events[Y]])
                results[i] = out.reshape(self.y_lt.shape)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(feed)
            for tensors in self.tensors:
                nursery.start_soon(worker, tensors)


async def device_time(runner, engine, xs, k: int) -> tuple[float, float]:
    """Median over ``k`` requests, each run alone on a profiling stream under a trace, of the
    device time (seconds) of its kernels and of its copies."""
    stream = await engine.stream(StreamFlags.in_order | StreamFlags.profiling)
    await runner.run(stream, {X: xs[0]})       # warm: first launches out of the trace
    kernels, copies = [], []
    for x in xs[:k]:
        with triodnn.trace.record() as trace:
            await runner.run(stream, {X: x})
            await stream.wait()
        spans = [e for e in trace.to_chrome()["traceEvents"] if e.get("ph") == "X" and e.get("cat") == "device"]
        kernels.append(sum(e["dur"] for e in spans if e["args"]["op"] in ("kernel", "sequence")) * 1e-6)
        copies.append(sum(e["dur"] for e in spans if e["args"]["op"] in ("write", "read")) * 1e-6)
    return common.median(kernels), common.median(copies)


async def run(args):
    n = args.requests or (20 if args.quick else 200)
    reps = args.reps or (3 if args.quick else 15)
    d_in, d_hidden, d_out = (int(v) for v in args.sizes.split(","))
    batch = args.batch
    rng = np.random.default_rng(0)
    w1 = rng.uniform(-0.1, 0.1, (d_in, d_hidden)).astype(np.float32)
    b1 = rng.uniform(-0.1, 0.1, d_hidden).astype(np.float32)
    w2 = rng.uniform(-0.1, 0.1, (d_hidden, d_out)).astype(np.float32)
    b2 = rng.uniform(-0.1, 0.1, d_out).astype(np.float32)
    weights = {W1: w1, B1: b1, W2: w2, B2: b2}
    xs = [rng.uniform(-1, 1, (batch, d_in)).astype(np.float32) for _ in range(n)]
    want = [np.maximum(x.astype(np.float64) @ w1 + b1, 0) @ w2 + b2 for x in xs]
    results: dict = {"batch": batch, "sizes": [d_in, d_hidden, d_out], "requests": n, "reps": reps,
                     "max_in_flight": IN_FLIGHT}

    async with triodnn.open_runtime() as rt:
        engine = await common.open_engine(rt, args)
        stream = await engine.stream(StreamFlags.out_of_order)
        common.print_header(
            "bench_pipeline: a 2-layer MLP per request: runner.map vs hand loop vs await run vs numpy",
            engine, args,
            [f"y = relu(x @ W1 + b1) @ W2 + b2, x {batch}x{d_in}, W1 {d_in}x{d_hidden}, W2 {d_hidden}x{d_out}, "
             "weights constant",
             f"{n} requests per sample, {IN_FLIGHT} in flight; {reps} repetitions, variants interleaved in "
             "rotating order; median of total / requests"])
        runner = await compile_graph(mlp_graph(batch, d_in, d_hidden, d_out), engine, constants=weights)
        array_runner = await compile_graph(mlp_graph(batch, d_in, d_hidden, d_out), engine)
        hand = HandLoop(runner, engine, stream, runner.constants)
        print(f"   partitions: {len(runner.partitions)} ({len(runner.compiled_partitions)} compiled)\n")
        batcher = DynamicBatcher(runner, stream, max_batch=BATCHERS)
        await batcher.__aenter__()

        async def pipelined(r, requests):
            got = []
            async with r.map(requests, stream=stream, max_in_flight=IN_FLIGHT) as outputs:
                async for out in outputs:
                    got.append(out[Y])
            return got

        async def map_given_once():
            return await pipelined(runner, ({X: x} for x in xs))

        async def map_weight_arrays():
            return await pipelined(array_runner, ({X: x, **weights} for x in xs))

        async def hand_loop():
            got: list = [None] * n
            await hand(xs, got)
            return got

        async def sequential():
            return [(await runner.run(stream, {X: x}))[Y] for x in xs]

        async def batched():
            got: list = [None] * n
            next_request = iter(range(n))

            async def requester():
                for i in next_request:
                    got[i] = (await batcher.run({X: xs[i]}))[Y]

            async with trio.open_nursery() as nursery:
                for _ in range(BATCHERS):
                    nursery.start_soon(requester)
            return got

        async def numpy_loop():
            return [np.maximum(x @ w1 + b1, np.float32(0)) @ w2 + b2 for x in xs]

        variants = {
            "(a) map, weights given once": map_given_once,
            "(b) hand loop, 4 tasks": hand_loop,
            "(c) await run, one at a time": sequential,
            "(d) numpy": numpy_loop,
            "(e) map, weights as arrays (cache)": map_weight_arrays,
            f"(f) dynamic batching, {BATCHERS} requesters": batched,
        }

        if args.engine_kind == "gpu" and torch is not None and torch.cuda.is_available():
            variants.update(torch_variants(weights, xs))

        def check(name, got) -> None:
            assert len(got) == n, (name, len(got))
            for i, (out, ref) in enumerate(zip(got, want)):
                np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4, err_msg=f"{name}, request {i}")

        for name, fn in variants.items():   # warm-up: builds, first launches, the cache's uploads
            check(name, await fn())
        cache0 = triodnn.graph.constant_tensor_cache_statistics(engine)
        uploads0 = array_runner.statistics().uploads
        samples: dict[str, list[float]] = {name: [] for name in variants}
        for rep in range(reps):
            for name, fn in common.rotated(list(variants.items()), rep):
                t0 = time.perf_counter()
                got = await fn()
                samples[name].append((time.perf_counter() - t0) / n)
                check(name, got)
        cache1 = triodnn.graph.constant_tensor_cache_statistics(engine)
        kernel_s, copy_s = await device_time(runner, engine, xs, 5 if args.quick else 20)

        per = {name: common.median(s) for name, s in samples.items()}
        numpy_s, hand_s = per["(d) numpy"], per["(b) hand loop, 4 tasks"]
        rows = []
        for name, t in per.items():
            device = not name.startswith(("(d)", "(g)", "(h)"))  # triodnn's variants
            rows.append([name, t * 1e6, t / numpy_s, t / hand_s if device else float("nan"),
                         (t - kernel_s) * 1e6 if device else float("nan")])
            results.setdefault("variants", {})[name] = {
                "us_per_request": t * 1e6, "x_numpy": t / numpy_s, "x_hand_loop": t / hand_s,
                "us_above_device": (t - kernel_s) * 1e6 if device else None,
                "samples_us": [s * 1e6 for s in samples[name]],
            }
        common.print_table(["variant", "µs / request", "x numpy", "x hand loop", "µs above device"], rows,
                           "Per request (median of total / requests; x: time / numpy's or the hand loop's)")
        results["device_us_per_request"] = {"kernels": kernel_s * 1e6, "copies": copy_s * 1e6}
        print(f"device time of one request: kernels {kernel_s * 1e6:.1f} µs, copies (x up, y down) "
              f"{copy_s * 1e6:.1f} µs (median of {5 if args.quick else 20} requests run alone, profiled)")
        hits = cache1.hits - cache0.hits
        misses = cache1.misses - cache0.misses + cache1.uncached - cache0.uncached
        uploads = array_runner.statistics().uploads - uploads0
        timed = reps * n
        print(f"(e) constant tensor cache over the timed requests: {hits} hits, {misses} uploads of weights; "
              f"the runner wrote {uploads} arrays for {timed} requests")
        results["cache_e"] = {"hits": hits, "weight_uploads": misses, "uploads": uploads, "requests": timed}
        stats = batcher.statistics()
        await batcher.__aexit__(None, None, None)
        f, c = per[f"(f) dynamic batching, {BATCHERS} requesters"], per["(c) await run, one at a time"]
        print(f"(f) {stats.requests} requests in {stats.batches} runs ({stats.requests / stats.batches:.1f} a run, "
              f"{stats.padded} padded slots); requests/s {c / f:.2f}x (c), one at a time (goal >= 4)")
        results["batching"] = {"requests": stats.requests, "runs": stats.batches, "padded": stats.padded,
                               "x_one_at_a_time": c / f}
        graph_s = per.get("(h) torch CUDA graph, one at a time")
        if graph_s is not None:
            print(f"one at a time: (c) {c / graph_s:.2f}x the time of torch's CUDA graph (h), "
                  f"{c / per['(g) torch eager, one at a time']:.2f}x torch eager (g)")
            results["x_torch_cuda_graph"] = c / graph_s
        a = per["(a) map, weights given once"]
        print(f"goals: (a) above device {(a - kernel_s) * 1e6:.0f} µs (<= 100), {a / numpy_s:.2f}x numpy (<= 2), "
              f"{a / hand_s:.2f}x the hand loop (<= 1)")
        return results, engine


def torch_variants(weights: dict, xs: list) -> dict:
    """(g) and (h): the MLP in torch on CUDA, one request at a time, the weights resident."""
    torch.backends.cuda.matmul.allow_tf32 = False
    dev = torch.device("cuda")
    w1, b1, w2, b2 = (torch.from_numpy(weights[k]).to(dev) for k in (W1, B1, W2, B2))

    def mlp(x):
        return torch.relu(x @ w1 + b1) @ w2 + b2

    static_x = torch.zeros(xs[0].shape, device=dev)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):  # warm-up on a side stream, as torch's CUDA graph capture asks
            mlp(static_x)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_y = mlp(static_x)

    async def eager():
        return [mlp(torch.from_numpy(x).to(dev)).cpu().numpy() for x in xs]

    async def cuda_graph():
        got = []
        for x in xs:
            static_x.copy_(torch.from_numpy(x))
            graph.replay()
            got.append(static_y.cpu().numpy())
        return got

    return {"(g) torch eager, one at a time": eager, "(h) torch CUDA graph, one at a time": cuda_graph}


def main() -> None:
    args = common.parse_args(__doc__.splitlines()[0], extra_args)
    results, engine = trio.run(run, args)
    common.write_json(args.json, "bench_pipeline", engine, args, results)


if __name__ == "__main__":
    main()

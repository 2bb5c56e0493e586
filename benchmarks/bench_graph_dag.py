"""bench_graph_dag: a whole graph run as a DAG (GraphRunner) on an out-of-order stream vs in order,
and pipelines of requests (runner.map) with 1, 2, 4, 8 in flight vs one request at a time.

The graph: B independent branches off one input x (M x K), branch i = MatMul(x, W_i (K x N)) ->
Tanh -> MatMul(., V_i (N x N)) -> ReLU, each its own output. The default shapes make kernels that
each keep one core busy for a while (a long dot product, a small output): what overlapping
independent partitions can win on a 2-core CPU device. Policy fusion gives one partition per branch (two
matmuls with eltwise post-ops); policy debug one per op. Weights are uploaded once (Tensors);
every run uploads x and reads the B outputs back.

Part 1, one request, each path on an in-order and on an out-of-order stream (where each partition
waits only for its producers, so the branches overlap): the runner with x as an array and the
outputs read back as arrays; the runner with x as a Tensor and Tensor outputs; and, for
reference, the driver's loop (``run_graph``: every partition submitted in topological order, one
wait at the end, no uploads, reads, allocations or releases). Variants are interleaved in
rotating order; medians.

Part 2, throughput: N requests through the fused graph on an out-of-order stream, sequential
(``await runner.run`` per request) and ``runner.map(..., max_in_flight=k)``; requests per second.

    python benchmarks/bench_graph_dag.py [--engine gpu:0] [--branches 8] [--m 8] [--k 32768] [--n 32]
"""

from __future__ import annotations

import time

import _common as common
import numpy as np
import trio

import triodnn
from triodnn import StreamFlags
from triodnn.graph import Graph, LogicalTensor, Op, Tensor, compile_graph


def extra_args(parser) -> None:
    parser.add_argument("--branches", type=int, default=8, help="independent branches (default 8)")
    parser.add_argument("--m", type=int, default=8, help="rows of x (default 8)")
    parser.add_argument("--k", type=int, default=32768, help="features of x (default 32768)")
    parser.add_argument("--n", type=int, default=32, help="features of each branch (default 32)")
    parser.add_argument("--reps", type=int, default=None, help="timed repetitions (default 30, quick 5)")
    parser.add_argument("--requests", type=int, default=None,
                        help="requests per pipeline measurement (default 64, quick 16)")


def lt(i, shape, prop="variable"):
    return LogicalTensor(i, "f32", shape, layout_type="strided", property_type=prop)


def branches_graph(b: int, m: int, k: int, n: int) -> Graph:
    g = Graph("cpu")
    x = lt(0, [m, k])
    for i in range(b):
        base, op = 100 * (i + 1), 10 * i
        w, v = lt(base, [k, n], "constant"), lt(base + 1, [n, n], "constant")
        h, t, y, r = (lt(base + j, [m, n]) for j in (2, 3, 4, 5))
        g.add_op(Op(op, "MatMul", [x, w], [h]))
        g.add_op(Op(op + 1, "Tanh", [h], [t]))
        g.add_op(Op(op + 2, "MatMul", [t, v], [y]))
        g.add_op(Op(op + 3, "ReLU", [y], [r]))
    return g


async def driver_style(graph, engine, tensors, policy):
    """Compiled partitions with their tensors, for run_graph's loop (no uploads, no reads)."""
    tensors = dict(tensors)
    runs = []
    for p in graph.get_partitions(policy):
        cp = await p.compile(engine, [tensors[x.id].logical_tensor for x in p.input_ports], None)
        outs = [Tensor(x, engine) for x in cp.outputs]
        tensors.update({t.logical_tensor.id: t for t in outs})
        runs.append((cp, [tensors[x.id] for x in p.input_ports], outs))
    return runs


async def run_driver(stream, runs) -> None:
    for cp, ins, outs in runs:
        cp.execute(stream, ins, outs)
    await stream.marker()   # every partition: on an out-of-order stream the last may not end last


async def time_it(fn) -> float:
    t0 = time.perf_counter()
    await fn()
    return time.perf_counter() - t0


async def run(args):
    reps = args.reps or (5 if args.quick else 30)
    n_requests = args.requests or (16 if args.quick else 64)
    b, m, k, n = args.branches, args.m, args.k, args.n
    rng = np.random.default_rng(0)
    results: dict = {"branches": b, "m": m, "k": k, "n": n, "reps": reps, "requests": n_requests}
    async with triodnn.open_runtime() as rt:
        engine = await common.open_engine(rt, args)
        in_order = await engine.stream(StreamFlags.in_order)
        ooo = await engine.stream(StreamFlags.out_of_order)
        common.print_header(
            "bench_graph_dag: graph as a DAG on an out-of-order stream vs in order; pipelines", engine, args,
            [f"{b} branches off x {m}x{k}: MatMul(x, W {k}x{n}) -> Tanh -> MatMul(., V {n}x{n}) -> ReLU",
             f"{reps} repetitions, variants interleaved in rotating order; median"])
        graph = branches_graph(b, m, k, n)
        x = rng.uniform(-1, 1, (m, k)).astype(np.float32)
        weights = {lt_.id: rng.uniform(-0.1, 0.1, lt_.shape).astype(np.float32)
                   for lt_ in graph.input_tensors() if lt_.id != 0}
        weight_tensors = {i: await Tensor.from_numpy(graph.tensor(i), engine, a) for i, a in weights.items()}

        rows = []
        runners = {}
        for policy in ("fusion", "debug"):
            runner = await compile_graph(branches_graph(b, m, k, n), engine, policy=policy)
            runners[policy] = runner
            x_tensor = await Tensor.from_numpy(runner.inputs[0], engine, x)
            driver = await driver_style(branches_graph(b, m, k, n), engine, {0: x_tensor, **weight_tensors}, policy)
            inputs = {0: x, **weight_tensors}
            tensor_inputs = {0: x_tensor, **weight_tensors}

            async def tensors_run(stream, runner=runner, tensor_inputs=tensor_inputs):
                outs = await runner.run(stream, tensor_inputs, as_tensors=True)
                for t in outs.values():
                    t.memory.release()

            paths = {
                "runner, arrays in/out": lambda stream, r=runner, inputs=inputs: r.run(stream, inputs),
                "runner, tensors in/out": tensors_run,
                "driver loop (no upload/read)": lambda stream, d=driver: run_driver(stream, d),
            }
            variants = {(path, name): (lambda fn=fn, stream=stream: fn(stream))
                        for path, fn in paths.items()
                        for name, stream in (("in-order", in_order), ("out-of-order", ooo))}
            # Same results every way, bit for bit.
            a = await runner.run(in_order, inputs)
            c = await runner.run(ooo, inputs)
            for i in a:
                np.testing.assert_array_equal(a[i], c[i])
            for fn in variants.values():
                await fn()
            samples = {key: [] for key in variants}
            for rep in range(reps):
                for key, fn in common.rotated(list(variants.items()), rep):
                    samples[key].append(await time_it(fn))
            for path in paths:
                t_in = common.median(samples[(path, "in-order")])
                t_ooo = common.median(samples[(path, "out-of-order")])
                rows.append([policy, len(runner.partitions), path, t_in * 1e6, t_ooo * 1e6, t_in / t_ooo])
                results.setdefault(policy, {})[path] = {"in_order_us": t_in * 1e6, "out_of_order_us": t_ooo * 1e6}
        common.print_table(["policy", "partitions", "path", "in-order µs", "out-of-order µs", "x (DAG overlap)"],
                           rows, "One request, per run (x: in-order time / out-of-order time)")

        runner = runners["fusion"]
        requests = [{0: rng.uniform(-1, 1, (m, k)).astype(np.float32), **weight_tensors} for _ in range(n_requests)]

        async def sequential():
            for request in requests:
                await runner.run(ooo, request)

        def pipelined(flight):
            async def go():
                count = 0
                async with runner.map(requests, stream=ooo, max_in_flight=flight) as outputs:
                    async for _ in outputs:
                        count += 1
                assert count == n_requests
            return go

        variants = {"sequential (await run)": sequential}
        for flight in (1, 2, 4, 8):
            variants[f"map, max_in_flight={flight}"] = pipelined(flight)
        for fn in variants.values():
            await fn()
        pipe_reps = max(3, reps // 3)
        samples = {name: [] for name in variants}
        for rep in range(pipe_reps):
            for name, fn in common.rotated(list(variants.items()), rep):
                samples[name].append(await time_it(fn))
        seq = common.median(samples["sequential (await run)"])
        rows = []
        for name, s in samples.items():
            t = common.median(s)
            rows.append([name, n_requests / t, seq / t])
            results.setdefault("pipeline", {})[name] = {"requests_per_s": n_requests / t, "x_sequential": seq / t}
        common.print_table(["variant", "requests / s", "x sequential"], rows,
                           f"Pipeline: {n_requests} requests through the fused graph ({len(runner.partitions)} "
                           f"partitions), out-of-order stream; median of {pipe_reps}")
        return results, engine


def main() -> None:
    args = common.parse_args(__doc__.splitlines()[0], extra_args)
    results, engine = trio.run(run, args)
    common.write_json(args.json, "bench_graph_dag", engine, args, results)


if __name__ == "__main__":
    main()

"""bench_graph: whole graphs fused (policy fusion) vs op by op (policy debug), side by side.

Graphs, built with triodnn's Graph API: an MLP of 3 dense layers (batch 64, 1024 features, bias
and ReLU), scaled-dot-product attention 1x8x128x64 (Q @ K^T * scale + mask, softmax, @ V), a
convolution chain (3x3 conv, bias, add, swish, relu on 1x64x56x56), and the public oneDNN
graphs given with --case. Each policy's partitions are compiled once; a run executes every
partition in order on one in-order stream and awaits the last event.

Timing, named beside each table: the fused-vs-op-by-op table is wall time of one run awaited
(each run submitted and awaited before the next: what one request costs); the throughput table
is wall time over N queued runs (N runs submitted back to back, awaited once; per run = total /
N), torch eager on CUDA likewise (N calls, ``torch.cuda.synchronize()`` once). Variants take
turns within each repetition (rotating order); medians of the repetitions.

On a CUDA GPU with torch, a third table: MLP and SDPA one run at a time (each submitted and
awaited before the next, tensors on the device) against torch eager, torch eager captured in a
CUDA graph, and torch's fused SDPA in a CUDA graph, timed alike (wall time, torch synchronized).

Checks: every graph output of both policies against a numpy reference of the graph computed op
by op (``triodnn.testing.reference``, within ``triodnn.testing.tolerance`` of the ops upstream of
the output, as ``triodnn graph`` checks), before timing and again after it (the outputs are
filled with NaN in between, so the check proves the timed runs wrote them); the throughput runs
and torch's results the same way. A torch result off the reference is reported and its figure
left out, never printed.

    python benchmarks/bench_graph.py [--engine gpu:0] [--case FILE ...]
"""

from __future__ import annotations

import math
import statistics
import time
from pathlib import Path

import _common as common
import numpy as np
import trio

import triodnn
from triodnn.graph import Graph, LogicalTensor, Op, Tensor, load
from triodnn.testing import make_inputs, reference, tolerance

try:  # optional peer, compared on a CUDA GPU
    import torch
except ImportError:  # pragma: no cover - depends on the machine
    torch = None


def extra_args(parser) -> None:
    parser.add_argument("--reps", type=int, default=None, help="timed runs per policy (default 30)")
    parser.add_argument("--throughput", type=int, default=50, metavar="N",
                        help="also time N back-to-back runs awaited once (device-bound time per run); "
                             "with torch on CUDA, torch eager does the same (default 50)")
    parser.add_argument("--case", action="append", default=[], metavar="FILE", help="also time this graph JSON")


def lt(i, shape, prop="variable"):
    return LogicalTensor(i, "f32", shape, layout_type="strided", property_type=prop)


# -- the numpy reference of a graph -----------------------------------------------------------

_SUMMING = ("MatMul", "Convolution")


def graph_reference(graph: Graph, arrays: dict) -> tuple[dict, dict]:
    """Every tensor's value computed op by op in numpy (float64, each output converted to its
    dtype), and for MatMul and Convolution outputs the same op on absolute values: a dot
    product's rounding error is relative to the sum of its terms' sizes, which cancellation can
    make far larger than the result (the rule of ``triodnn graph``'s correctness mode)."""
    values, magnitudes = dict(arrays), {}
    for op in graph.ops:
        if op.kind == "End":
            continue
        inputs = [values[t.id] for t in op.inputs]
        for t, value in zip(op.outputs, reference(op.kind, op.attrs, inputs, [t.dtype for t in op.outputs])):
            values[t.id] = value
        if op.kind in _SUMMING:
            absolute = [np.abs(np.asarray(x, dtype=np.float32)) for x in inputs]
            magnitudes[op.outputs[0].id] = reference(op.kind, op.attrs, absolute, ["f32"])[0]
    return values, magnitudes


def upstream_kinds(graph: Graph, lt_id: int) -> set[str]:
    kinds, stack, seen = set(), [lt_id], set()
    while stack:
        op = graph.producer(stack.pop())
        if op is None or id(op) in seen:
            continue
        seen.add(id(op))
        kinds.add(op.kind)
        stack.extend(t.id for t in op.inputs)
    return kinds


def mismatch(graph: Graph, ref: tuple[dict, dict], lt_id: int, got) -> str | None:
    """None when ``got`` is within tolerance of the reference of output ``lt_id``, else what is off:
    elements pass when ``|got - want| <= atol + rtol * max(|want|, magnitude)``."""
    values, magnitudes = ref
    rtol, atol = tolerance(upstream_kinds(graph, lt_id), graph.tensor(lt_id).dtype)
    want = np.asarray(values[lt_id], dtype=np.float64)
    g = np.asarray(got, dtype=np.float64).reshape(want.shape)
    scale = np.abs(want)
    if lt_id in magnitudes:
        scale = np.maximum(scale, np.abs(np.asarray(magnitudes[lt_id], dtype=np.float64)))
    diff = np.abs(g - want)
    bad = ~(diff <= atol + rtol * scale)  # NaN (an unwritten, poisoned output) fails
    if not bad.any():
        return None
    return (f"output {lt_id}: {int(bad.sum())}/{bad.size} elements off the numpy reference "
            f"(max abs error {np.nanmax(diff) if not np.isnan(diff).all() else float('nan'):.3g}, "
            f"rtol {rtol:g}, atol {atol:g})")


async def check_outputs(graph: Graph, ref, tensors: dict, out_ids, who: str) -> None:
    for i in out_ids:
        problem = mismatch(graph, ref, i, await tensors[i].to_numpy())
        if problem is not None:
            raise AssertionError(f"{who}: {problem}")


async def poison_outputs(tensors: dict, out_ids) -> None:
    for i in out_ids:
        await common.poison(tensors[i].memory)


def mlp(batch=64, features=1024, layers=3) -> Graph:
    g = Graph("cpu")
    x, next_id, op_id = lt(0, [batch, features]), 1, 0
    for _ in range(layers):
        w, b = lt(next_id, [features, features], "constant"), lt(next_id + 1, [features], "constant")
        h, hb, y = lt(next_id + 2, [batch, features]), lt(next_id + 3, [batch, features]), lt(next_id + 4, [batch, features])
        g.add_op(Op(op_id, "MatMul", [x, w], [h]))
        g.add_op(Op(op_id + 1, "BiasAdd", [h, b], [hb]))
        g.add_op(Op(op_id + 2, "ReLU", [hb], [y]))
        x, next_id, op_id = y, next_id + 5, op_id + 3
    return g


def sdpa(b=1, h=8, s=128, d=64) -> Graph:
    q, k, v = lt(0, [b, h, s, d]), lt(1, [b, h, s, d]), lt(2, [b, h, s, d])
    scale, mask = lt(3, [1], "constant"), lt(4, [b, 1, s, s])
    g = Graph("cpu")
    g.add_op(Op(0, "MatMul", [q, k], [lt(10, [b, h, s, s])], {"transpose_b": True}))
    g.add_op(Op(1, "Multiply", [lt(10, [b, h, s, s]), scale], [lt(11, [b, h, s, s])]))
    g.add_op(Op(2, "Add", [lt(11, [b, h, s, s]), mask], [lt(12, [b, h, s, s])]))
    g.add_op(Op(3, "SoftMax", [lt(12, [b, h, s, s])], [lt(13, [b, h, s, s])], {"axis": -1}))
    g.add_op(Op(4, "MatMul", [lt(13, [b, h, s, s]), v], [lt(14, [b, h, s, d])]))
    return g


def conv_chain(n=1, c=64, hw=56) -> Graph:
    x, w, bias = lt(0, [n, c, hw, hw]), lt(1, [c, c, 3, 3], "constant"), lt(2, [c], "constant")
    other = lt(3, [n, c, hw, hw])
    conv_attrs = {"strides": [1, 1], "pads_begin": [1, 1], "pads_end": [1, 1], "dilations": [1, 1],
                  "data_format": "NCX", "weights_format": "OIX", "groups": 1}
    shape = [n, c, hw, hw]
    g = Graph("cpu")
    g.add_op(Op(0, "Convolution", [x, w], [lt(10, shape)], conv_attrs))
    g.add_op(Op(1, "BiasAdd", [lt(10, shape), bias], [lt(11, shape)], {"data_format": "NCX"}))
    g.add_op(Op(2, "Add", [lt(11, shape), other], [lt(12, shape)]))
    g.add_op(Op(3, "Sigmoid", [lt(12, shape)], [lt(13, shape)]))
    g.add_op(Op(4, "Multiply", [lt(12, shape), lt(13, shape)], [lt(14, shape)]))
    g.add_op(Op(5, "ReLU", [lt(14, shape)], [lt(15, shape)]))
    return g


async def prepare(build, engine, policy, arrays):
    graph = build()
    parts = graph.get_partitions(policy)
    tensors = {i: await Tensor.from_numpy(graph.tensor(i), engine, a) for i, a in arrays.items()}
    runs = []
    for p in parts:
        cp = await p.compile(engine, [tensors[lt.id].logical_tensor for lt in p.input_ports], None)
        outs = [Tensor(lt, engine) for lt in cp.outputs]
        tensors.update({t.logical_tensor.id: t for t in outs})
        runs.append((cp, [tensors[lt.id] for lt in p.input_ports], outs))
    out_ids = [lt.id for lt in graph.output_tensors()]
    return runs, tensors, out_ids, sum(len(cp.primitives) for cp, _, _ in runs)


async def checked_fused(name: str, build, engine, stream):
    """The graph's fused partitions prepared on ``engine``, run once and checked against the
    numpy reference, their outputs then poisoned (so a timed run is what a later check sees):
    (graph, arrays, reference, runs, tensors, output ids)."""
    graph = build()
    arrays = make_inputs(graph, seed=1)
    ref = graph_reference(graph, arrays)
    runs, tensors, out_ids, _ = await prepare(build, engine, "fusion", arrays)
    await run_once(stream, runs)
    await check_outputs(graph, ref, tensors, out_ids, f"{name}, fused")
    await poison_outputs(tensors, out_ids)
    return graph, arrays, ref, runs, tensors, out_ids


def memory_bytes(graph, runs) -> tuple[int, int]:
    """(every tensor of the graph in its own buffer, fused ports + planned scratch - in-place)."""
    tensors = {lt.id: lt for op in graph.ops for lt in (*op.inputs, *op.outputs)}
    naive = sum(lt.nbytes for lt in tensors.values())
    planned = 0
    for cp, _, _ in runs:
        stats = cp.memory_statistics()
        shared = sum(cp.query_logical_tensor(o).nbytes for _, o in cp.inplace_ports())
        planned += stats.scratch_bytes + stats.port_bytes - shared
    return naive, planned


async def throughput(args, engine, stream, cases, reps, results) -> None:
    """Time per run when N runs are submitted back to back and awaited once: what the device
    takes, host submission hidden behind it where the device is slower (torch eager alike: N
    calls, then ``torch.cuda.synchronize()``)."""
    n = args.throughput
    rows = []
    cuda = torch is not None and torch.cuda.is_available()
    for name, build in cases:
        graph, arrays, ref, runs, tensors, out_ids = await checked_fused(name, build, engine, stream)

        async def ours(runs=runs):
            await stream.wait()
            t0 = time.perf_counter()
            event = None
            for _ in range(n):
                for cp, ins, outs in runs:
                    event = cp.execute(stream, ins, outs)
            await event
            return (time.perf_counter() - t0) / n

        variants = {"fused": ours}
        peers = {}
        if cuda:
            peers = checked_peers(graph, ref, name, torch_steps(name, arrays), lambda fn: TorchQueued(fn, n))
            variants.update({peer: timed.sample for peer, timed in peers.items()})
        samples = await common.interleaved(variants, reps)
        await check_outputs(graph, ref, tensors, out_ids, f"{name}, fused, {n} queued runs")
        t = {k: common.median(v) for k, v in samples.items()}
        drop_off_peers(graph, ref, name, peers, t)
        nan = float("nan")
        eager, sdpa_fused = t.get("torch eager", nan), t.get("torch fused SDPA", nan)
        rows.append([name, t["fused"] * 1e6, eager * 1e6, eager / t["fused"], sdpa_fused * 1e6])
        results.setdefault(name, {}).update({"fused_throughput_us": t["fused"] * 1e6, "torch_eager_us": eager * 1e6,
                                             "torch_fused_sdpa_us": sdpa_fused * 1e6, "throughput_samples_s": samples})
    common.print_table(["graph", "fused µs/run", "torch eager µs", "speed ÷ torch eager", "torch fused SDPA µs"], rows,
                       f"throughput: wall time over {n} queued runs (submit {n}, wait once; per run = total / {n}), "
                       f"median of {reps} interleaved samples")


class TorchQueued:
    """A sample: N torch calls on CUDA, synchronised once; seconds per run (wall time)."""

    def __init__(self, fn, n: int) -> None:
        self.fn, self.n, self.last = fn, n, None

    def sample(self) -> float:
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(self.n):
            self.last = self.fn()
        torch.cuda.synchronize()
        return (time.perf_counter() - t0) / self.n


def torch_steps(name, arrays) -> dict:
    """The graph in torch eager on CUDA, by graph: {"torch eager": fn, ["torch fused SDPA": fn]}."""
    torch.backends.cuda.matmul.allow_tf32 = False
    dev = torch.device("cuda")
    t = {k: torch.from_numpy(np.ascontiguousarray(v, dtype=np.float32)).to(dev) for k, v in arrays.items()}
    if name.startswith("MLP"):
        def step():
            x = t[0]
            for i in range(3):
                x = torch.relu(x @ t[1 + 5 * i] + t[2 + 5 * i])
            return x
        return {"torch eager": step}

    def eager():
        s = (t[0] @ t[1].transpose(-1, -2)) * t[3] + t[4]
        return torch.softmax(s, -1) @ t[2]

    scale = float(t[3])  # read once: a CUDA graph cannot capture a copy to the host

    def fused():
        return torch.nn.functional.scaled_dot_product_attention(t[0], t[1], t[2], attn_mask=t[4], scale=scale)

    return {"torch eager": eager, "torch fused SDPA": fused}


async def run_once(stream, runs) -> None:
    event = None
    for cp, ins, outs in runs:
        event = cp.execute(stream, ins, outs)
    await event


async def run(args):
    reps = args.reps or (5 if args.quick else 30)
    cases = [("MLP 64x1024 x3", mlp), ("SDPA 1x8x128x64", sdpa), ("conv3x3+bias+add+swish+relu 64x56x56", conv_chain)]
    for path in args.case:
        cases.append((Path(path).name, lambda path=path: load(path)))
    results = {}
    rows = []
    async with triodnn.open_runtime() as rt:
        engine = await common.open_engine(rt, args)
        stream = await engine.stream()
        common.print_header("bench_graph: fused (policy fusion) vs op by op (policy debug)", engine, args, [
            f"timing: wall time of one run awaited (submit a run, await it, then the next); median of {reps} "
            "interleaved runs per policy",
            "outputs of both policies checked against the numpy reference of the graph, before and after timing",
        ])
        for name, build in cases:
            graph = build()
            arrays = make_inputs(graph, seed=1)
            ref = graph_reference(graph, arrays)
            fused = await prepare(build, engine, "fusion", arrays)
            debug = await prepare(build, engine, "debug", arrays)
            for policy, variant in (("fused", fused), ("debug", debug)):
                await run_once(stream, variant[0])
                await check_outputs(graph, ref, variant[1], variant[2], f"{name}, {policy}")
                await poison_outputs(variant[1], variant[2])

            def one_run(variant):
                async def sample():
                    t0 = time.perf_counter()
                    await run_once(stream, variant[0])
                    return time.perf_counter() - t0
                return sample

            samples = await common.interleaved({"fusion": one_run(fused), "debug": one_run(debug)}, reps)
            for policy, variant in (("fused", fused), ("debug", debug)):
                await check_outputs(graph, ref, variant[1], variant[2], f"{name}, {policy}, timed runs")
            t_f, t_d = common.median(samples["fusion"]), common.median(samples["debug"])
            naive, planned = memory_bytes(build(), fused[0])
            rows.append([name, fused[3], debug[3], t_f * 1e6, t_d * 1e6, t_d / t_f,
                         naive / 2**20, planned / 2**20, planned / naive])
            results[name] = {"fused_us": t_f * 1e6, "debug_us": t_d * 1e6, "fused_primitives": fused[3],
                             "debug_primitives": debug[3], "naive_bytes": naive, "planned_bytes": planned,
                             "samples_s": samples}
        common.print_table(["graph", "fused prims", "debug prims", "fused µs", "debug µs", "fused speedup",
                            "naive MiB", "planned MiB", "planned / naive"], rows,
                           f"fused vs op by op: wall time of one run awaited, median of {reps} interleaved runs")
        if args.throughput:
            await throughput(args, engine, stream, cases[:2], 3 if args.quick else 5, results)
        if torch is not None and torch.cuda.is_available():
            await latency(engine, stream, cases[:2], reps, results)
        return results, engine


# Runs per latency sample. The OpenCL context and torch's CUDA context take turns on the GPU, and
# the first run after the other's pays the switch: on an H200, sampling one run of each variant in
# turn timed the fused MLP at 277 µs a run against 73.6 µs in this script's own table.
BURST = 20


async def latency(engine, stream, cases, reps, results) -> None:
    """One run submitted and awaited at a time (wall time), every tensor on the device: the fused
    graph (its compiled partitions executed, the last event awaited) against torch eager (the
    call, then ``torch.cuda.synchronize()``), the same captured in a CUDA graph (``replay()``,
    then synchronize) and, for SDPA, torch's fused SDPA in a CUDA graph. A sample is the median
    run of a burst of ``BURST`` runs one at a time, the first dropped (it pays the GPU's switch
    from the other variant's context). Variants interleaved by sample; every result checked
    against the numpy reference before timing and after it."""
    rows = []
    for name, build in cases:
        graph, arrays, ref, runs, tensors, out_ids = await checked_fused(name, build, engine, stream)

        async def ours(runs=runs):
            times = []
            for _ in range(BURST):
                t0 = time.perf_counter()
                await run_once(stream, runs)
                times.append(time.perf_counter() - t0)
            return statistics.median(times[1:])

        calls = {}
        for peer, fn in torch_steps(name, arrays).items():
            calls[peer], calls[f"{peer}, CUDA graph"] = fn, captured(fn)
        peers = checked_peers(graph, ref, name, calls, TorchOneAtATime)
        variants: dict = {"fused": ours, **{label: timed.sample for label, timed in peers.items()}}
        samples = await common.interleaved(variants, reps)
        await check_outputs(graph, ref, tensors, out_ids, f"{name}, fused, timed runs")
        t = {k: common.median(v) for k, v in samples.items()}
        drop_off_peers(graph, ref, name, peers, t)
        nan = float("nan")
        # The faster CUDA graph whose result was right (a peer left out is NaN, which min skips).
        best_graph = min((v for k, v in t.items() if k.endswith("CUDA graph") and not math.isnan(v)), default=nan)
        rows.append([name, t["fused"] * 1e6, t.get("torch eager", nan) * 1e6, t.get("torch eager, CUDA graph", nan) * 1e6,
                     t.get("torch fused SDPA, CUDA graph", nan) * 1e6, t["fused"] / best_graph])
        results.setdefault(name, {})["one_at_a_time_us"] = {k: v * 1e6 for k, v in t.items()}
    common.print_table(["graph", "fused µs", "torch eager µs", "torch eager, CUDA graph µs",
                        "torch fused SDPA, CUDA graph µs", "fused ÷ best CUDA graph"], rows,
                       f"one run at a time: wall time of one run submitted and awaited (torch: synchronized), "
                       f"tensors on the device, median of {reps} interleaved samples (each the median of a burst of "
                       f"{BURST} runs, the first dropped)")


def checked_peers(graph, ref, name: str, calls: dict, timer) -> dict:
    """``timer(call)`` (an object with ``sample`` and ``last``) for each torch call whose result
    is right against the reference of the graph's one output; the others reported, left out."""
    (out_id,) = [lt.id for lt in graph.output_tensors()]
    peers = {}
    for label, call in calls.items():
        problem = mismatch(graph, ref, out_id, call().cpu().numpy())
        if problem is None:
            peers[label] = timer(call)
        else:
            print(f"   {name}, {label}: left out, its result is off: {problem}")
    return peers


def drop_off_peers(graph, ref, name: str, peers: dict, t: dict) -> None:
    """A peer whose last timed result is off the reference: reported, its time NaN in ``t``."""
    (out_id,) = [lt.id for lt in graph.output_tensors()]
    for label, timed in peers.items():
        problem = mismatch(graph, ref, out_id, timed.last.cpu().numpy())
        if problem is not None:
            print(f"   {name}, {label}: left out, its timed result is off: {problem}")
            t[label] = float("nan")


def captured(fn):
    """``fn`` captured in a CUDA graph (after warm-up calls on a side stream, as torch asks): a
    function that replays it and returns its output tensor."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()

    def replay():
        graph.replay()
        return out
    return replay


class TorchOneAtATime:
    """A sample: one torch call on CUDA, synchronized; seconds (wall time)."""

    def __init__(self, fn) -> None:
        self.fn, self.last = fn, None

    def sample(self) -> float:
        times = []
        for _ in range(BURST):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            self.last = self.fn()
            torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
        return statistics.median(times[1:])


def main() -> None:
    args = common.parse_args(__doc__.splitlines()[0], extra_args)
    results, engine = trio.run(run, args)
    common.write_json(args.json, "bench_graph", engine, args, results)


if __name__ == "__main__":
    main()

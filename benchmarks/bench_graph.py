"""bench_graph: whole graphs fused (policy fusion) vs op by op (policy debug), side by side.

Graphs, built with triodnn's Graph API: an MLP of 3 dense layers (batch 64, 1024 features, bias
and ReLU), scaled-dot-product attention 1x8x128x64 (Q @ K^T * scale + mask, softmax, @ V), a
convolution chain (3x3 conv, bias, add, swish, relu on 1x64x56x56), and the public oneDNN
graphs given with --case. Each policy's partitions are compiled once; a run executes every
partition in order on one in-order stream and awaits the last event. The two policies run
interleaved, median of the repetitions; outputs are compared first.

    python benchmarks/bench_graph.py [--engine gpu:0] [--case FILE ...]
"""

from __future__ import annotations

import time
from pathlib import Path

import _common as common
import numpy as np
import trio

import triodnn
from triodnn.graph import Graph, LogicalTensor, Op, Tensor, load
from triodnn.testing import make_inputs

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


async def throughput(args, engine, stream, cases, results) -> None:
    """Time per run when N runs are submitted back to back and awaited once: what the device
    takes, host submission hidden behind it (CUDA-synchronised torch eager alike)."""
    n = args.throughput
    rows = []
    cuda = torch is not None and torch.cuda.is_available()
    for name, build in cases:
        arrays = make_inputs(build(), seed=1)
        fused = await prepare(build, engine, "fusion", arrays)
        samples = []
        for _ in range(5):
            t0 = time.perf_counter()
            event = None
            for _ in range(n):
                for cp, ins, outs in fused[0]:
                    event = cp.execute(stream, ins, outs)
            await event
            samples.append((time.perf_counter() - t0) / n)
        ours = common.median(samples)
        theirs = sdpa_fused = float("nan")
        if cuda:
            theirs, sdpa_fused = torch_eager(name, arrays, n)
        rows.append([name, ours * 1e6, theirs * 1e6, theirs / ours, sdpa_fused * 1e6])
        results.setdefault(name, {}).update({"fused_throughput_us": ours * 1e6, "torch_eager_us": theirs * 1e6,
                                             "torch_fused_sdpa_us": sdpa_fused * 1e6})
    common.print_table(["graph", f"fused µs/run ({n} queued)", "torch eager µs", "x torch eager",
                        "torch fused SDPA µs"], rows)


def torch_eager(name, arrays, n):
    dev = torch.device("cuda")
    t = {k: torch.from_numpy(np.ascontiguousarray(v, dtype=np.float32)).to(dev) for k, v in arrays.items()}
    if name.startswith("MLP"):
        def step():
            x = t[0]
            for i in range(3):
                x = torch.relu(x @ t[1 + 5 * i] + t[2 + 5 * i])
            return x
        fused = None
    else:
        def step():
            s = (t[0] @ t[1].transpose(-1, -2)) * t[3] + t[4]
            return torch.softmax(s, -1) @ t[2]

        def fused():
            return torch.nn.functional.scaled_dot_product_attention(t[0], t[1], t[2], attn_mask=t[4],
                                                                    scale=float(t[3]))

    def timed(fn):
        fn()
        torch.cuda.synchronize()
        samples = []
        for _ in range(5):
            t0 = time.perf_counter()
            for _ in range(n):
                fn()
            torch.cuda.synchronize()
            samples.append((time.perf_counter() - t0) / n)
        return common.median(samples)

    torch.backends.cuda.matmul.allow_tf32 = False
    return timed(step), (timed(fused) if fused else float("nan"))


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
        common.print_header("bench_graph: fused (policy fusion) vs op by op (policy debug)", engine, args,
                            [f"{reps} timed runs per policy, interleaved; median"])
        for name, build in cases:
            arrays = make_inputs(build(), seed=1)
            fused = await prepare(build, engine, "fusion", arrays)
            debug = await prepare(build, engine, "debug", arrays)
            for variant in (fused, debug):
                await run_once(stream, variant[0])
            for i in fused[2]:
                a, b = await fused[1][i].to_numpy(), await debug[1][i].to_numpy()
                np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-3 * max(1.0, float(np.abs(b).max())))
            samples = {"fusion": [], "debug": []}
            for rep in range(reps):
                for policy, variant in common.rotated([("fusion", fused), ("debug", debug)], rep):
                    t0 = time.perf_counter()
                    await run_once(stream, variant[0])
                    samples[policy].append(time.perf_counter() - t0)
            t_f, t_d = common.median(samples["fusion"]), common.median(samples["debug"])
            naive, planned = memory_bytes(build(), fused[0])
            rows.append([name, fused[3], debug[3], t_f * 1e6, t_d * 1e6, t_d / t_f,
                         naive / 2**20, planned / 2**20, planned / naive])
            results[name] = {"fused_us": t_f * 1e6, "debug_us": t_d * 1e6, "fused_primitives": fused[3],
                             "debug_primitives": debug[3], "naive_bytes": naive, "planned_bytes": planned}
        common.print_table(["graph", "fused prims", "debug prims", "fused µs", "debug µs", "fused speedup",
                            "naive MiB", "planned MiB", "planned / naive"], rows)
        if args.throughput:
            await throughput(args, engine, stream, cases[:2], results)
        return results, engine


def main() -> None:
    args = common.parse_args(__doc__.splitlines()[0], extra_args)
    results, engine = trio.run(run, args)
    common.write_json(args.json, "bench_graph", engine, args, results)


if __name__ == "__main__":
    main()

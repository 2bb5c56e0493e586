"""bench_int8_matmul: an int8 matmul graph fused into one quantized_matmul primitive vs the same
graph op by op (Dequantize, Dequantize, f32 MatMul with its post-op chain, Quantize); int8
convolution graphs given with --case (e.g. oneDNN's int8_conv_post_ops_fusion) likewise, fused
into one convolution primitive.

The graph is oneDNN's int8_matmul_post_ops pattern: u8 src (per-tensor zero point), s8 weights
(per-channel scales and zero points), f32 bias, ReLU, Quantize to u8; plus the public oneDNN
graphs given with --case. Both lowerings compile the same partition; the op-by-op one is
compile_partition with the int8 matcher answering "no match" (so the f32 post-op chain still
fuses into the matmul, as before this fusion existed). Each variant's outputs are checked against
the graph's numpy reference (integer outputs within one step of it: the fused kernel sums exact
integers, op by op sums dequantized f32 values; float outputs by the driver's benchdnn rule), before
timing. Timing: wall time of one execution awaited, variants alternating, median of N.

    python benchmarks/bench_int8_matmul.py [--m 128 --k 1024 --n 1024] [--repeat 30] [--case FILE ...]
        [--always-fuse] [--tiled-min ELEMENTS]   (tuning: fuse whatever fusion_pays says; GPU tiling threshold)
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import _common as common
import numpy as np
import trio

import triodnn
from triodnn import StreamFlags
from triodnn.graph import Graph, LogicalTensor, Op, _int8_matmul, from_dict
from triodnn.graph import _compiled_partition as compiled_partition
from triodnn.kernels import quantized_matmul
from triodnn.testing._driver import compare, make_inputs, reference_outputs


def lt(i, shape, dtype="f32"):
    return LogicalTensor(i, dtype, shape, None, layout_type="strided")


def int8_matmul(m: int, k: int, n: int) -> Graph:
    g = Graph("cpu")
    g.add_op(Op(0, "Dequantize", [lt(0, (m, k), "u8")], [lt(10, (m, k))], {"scales": [0.05], "zps": [3]}))
    g.add_op(Op(1, "Dequantize", [lt(1, (k, n), "s8")], [lt(11, (k, n))],
                {"qtype": "per_channel", "axis": 1, "scales": [0.01 + 1e-4 * i for i in range(n)],
                 "zps": [i % 3 for i in range(n)]}))
    g.add_op(Op(2, "MatMul", [lt(10, (m, k)), lt(11, (k, n)), lt(2, (n,))], [lt(20, (m, n))]))
    g.add_op(Op(3, "ReLU", [lt(20, (m, n))], [lt(21, (m, n))]))
    g.add_op(Op(4, "Quantize", [lt(21, (m, n))], [lt(30, (m, n), "u8")], {"scales": [2.0], "zps": [0]}))
    g.finalize()
    return g


# The matchers that answer "no match" for the op-by-op variant.
INT8_MATCHERS = ("find_int8_matmuls", "find_int8_convolutions")


async def compile_all(graph, engine, fused: bool, matchers=INT8_MATCHERS):
    originals = {name: getattr(compiled_partition, name) for name in matchers}
    if not fused:
        for name in matchers:
            setattr(compiled_partition, name, lambda *args, **kwargs: {})
    try:
        out = []
        for p in graph.get_partitions():
            ins, outs = list(p.input_ports), list(p.output_ports)
            cp = await compiled_partition.compile_partition(p, engine, ins, outs, p._infer(ins, outs, declared=True))
            out.append(cp)
        return out
    finally:
        for name, matcher in originals.items():
            setattr(compiled_partition, name, matcher)


async def bench(name, graph, engine, repeat, matchers=INT8_MATCHERS):
    arrays = make_inputs(graph, seed=0)
    want, magnitudes = reference_outputs(graph, arrays)
    kinds = {op.kind for op in graph.ops}
    stream = await engine.stream(StreamFlags.in_order)
    variants = {}
    for fused in (True, False):
        variants[fused] = await common.bind_graph(graph, engine, await compile_all(graph, engine, fused, matchers), arrays)

    async def once(plan):
        event = None
        for cp, ins, outs in plan:
            event = cp.execute(stream, ins, outs)
        await event

    for fused, (_kinds, plan, tensors) in variants.items():
        await once(plan)
        for out in graph.output_tensors():
            got = np.asarray(await tensors[out.id].to_numpy(), np.float64)
            ref = np.asarray(want[out.id], np.float64)
            if out.dtype in ("s8", "u8"):
                diff = np.abs(got - ref)
                assert diff.max() <= 1 and (diff == 0).mean() > 0.9, (name, fused, diff.max())
            else:
                check = compare(out, got, ref, kinds, magnitudes.get(out.id))
                assert check.passed, (name, fused, check)
    times = {True: [], False: []}
    for _ in range(3):  # warm-up
        for _, plan, _ in variants.values():
            await once(plan)
    for i in range(repeat):
        for fused in ((True, False) if i % 2 == 0 else (False, True)):
            start = time.perf_counter()
            await once(variants[fused][1])
            times[fused].append((time.perf_counter() - start) * 1e3)
    fused_ms, unfused_ms = statistics.median(times[True]), statistics.median(times[False])
    print(f"{name}: fused {fused_ms:.3f} ms ({'+'.join(variants[True][0])}), op by op {unfused_ms:.3f} ms "
          f"({'+'.join(variants[False][0])}): op by op / fused = {unfused_ms / fused_ms:.2f}x", flush=True)


async def main(args):
    if args.always_fuse:  # measure the fused kernel where fusion_pays would say no
        _int8_matmul.fusion_pays = lambda *sizes: True
    if args.tiled_min is not None:
        quantized_matmul.TILED_MIN_DST = args.tiled_min
    async with triodnn.open_runtime() as rt:
        engine = await common.engine_named(rt, args.engine)
        graph = int8_matmul(args.m, args.k, args.n)
        await bench(f"int8_matmul {args.m}x{args.k}x{args.n}", graph, engine, args.repeat)
        for case in args.case:
            graph = from_dict(json.loads(Path(case).read_text()))
            await bench(Path(case).name, graph, engine, args.repeat)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--m", type=int, default=128)
    parser.add_argument("--k", type=int, default=1024)
    parser.add_argument("--n", type=int, default=1024)
    parser.add_argument("--repeat", type=int, default=30)
    parser.add_argument("--engine", default=None)
    parser.add_argument("--case", nargs="*", default=[])
    parser.add_argument("--always-fuse", action="store_true")
    parser.add_argument("--tiled-min", type=int, default=None, help="GPU: smallest dst (elements) to tile")
    trio.run(main, parser.parse_args())

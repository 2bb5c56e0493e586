"""bench_weights_decompression: oneDNN's int4 gated MLP with each DynamicDequantize -> MatMul fused
into one ``DequantizingMatmulDesc``, against the same graph op by op (the dequantized weights
written out in f16 and read back by the matmul); and, with --per-channel-conv, oneDNN's int8
convolution pattern with its weights' Dequantize made per channel, fused into one convolution
against op by op.

Each variant's outputs are checked against the graph's numpy reference before timing (float
outputs by the driver's benchdnn rule, integer outputs within one step, as bench_int8_matmul.py).
Timing: wall time of one execution awaited, variants alternating, median of --repeat; both
variants compile the same partitions, the op-by-op one with the matcher answering "no match".

    cd ../shared/graphs/benchdnn && python /path/to/benchmarks/bench_weights_decompression.py \
        [--engine gpu:0] [--repeat 30] [--always-fuse] [--per-channel-conv]

--always-fuse fuses where ``kernels.dequantizing_matmul.fusion_pays`` says no (a GPU
configuration), to measure the fused kernel there.
"""

from __future__ import annotations

import argparse
import copy
import json
from pathlib import Path

import _common as common
import trio
from bench_int8_matmul import INT8_MATCHERS, bench

import triodnn
from triodnn.graph import _weights_decompression, from_dict

MLP = "complex_fusion/mlp/gated-mlp-int4.json"
CONV = "pattern/int8/int8_conv_post_ops_fusion.json"


def per_channel_conv(graph: dict) -> dict:
    """The int8 convolution pattern with its weights' Dequantize per output channel: scales 0.25,
    0.5, 1 and 2 in turn (powers of two, so the fused and op-by-op roundings agree), zero points 0."""
    graph = copy.deepcopy(graph)
    for op in graph["graph"]:
        if op["kind"] == "Dequantize" and op["inputs"][0]["dtype"] == "s8":
            channels = op["inputs"][0]["shape"][0]
            op["attrs"]["qtype"] = {"type": "string", "value": "per_channel"}
            op["attrs"]["axis"] = {"type": "s64", "value": 0}
            op["attrs"]["scales"] = {"type": "f32[]", "value": [2.0 ** (i % 4 - 2) for i in range(channels)]}
            op["attrs"]["zps"] = {"type": "s64[]", "value": [0] * channels}
    return graph


async def main(args):
    if args.always_fuse:
        _weights_decompression.fusion_pays = lambda *sizes: True
    async with triodnn.open_runtime() as rt:
        engine = await common.engine_named(rt, args.engine)
        print(f"{engine.kind}:{engine.index} {engine.info.name}", flush=True)
        graph = from_dict(json.loads(Path(args.root, MLP).read_text()))
        await bench(Path(MLP).name, graph, engine, args.repeat, ("find_dequantizing_matmuls",))
        if args.per_channel_conv:
            graph = from_dict(per_channel_conv(json.loads(Path(args.root, CONV).read_text())))
            await bench("int8 conv, per-channel weight scales", graph, engine, args.repeat, INT8_MATCHERS)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--root", default=".", help="oneDNN's benchdnn graph folder (default: here)")
    parser.add_argument("--repeat", type=int, default=30)
    parser.add_argument("--engine", default=None)
    parser.add_argument("--always-fuse", action="store_true")
    parser.add_argument("--per-channel-conv", action="store_true")
    trio.run(main, parser.parse_args())

"""bench_int8_sdpa: oneDNN's int8 attention graphs with the fused quantized SDPA, against the same
graph without it (as before it existed: the int8 MatMuls fused where that pays, the softmax,
Dequantize, Quantize and TypeCast ops one by one) and against the f32 graph of the same model.

Each model is three variants in one run: ``MHA-<model>-inf-int8-bs1.json`` compiled normally
(one SdpaDesc where ``kernels.sdpa.fusion_pays`` says so), the same int8 graph with the
quantized-attention matcher answering "no match", and ``MHA-<model>-inf-fp32-bs1.json`` fused.
Outputs are checked against the graph's numpy reference before timing (u8 outputs: within one
step everywhere, equal on more than 99% of the elements; f32 outputs by the driver's tolerance).
Timing: wall time of one execution awaited, variants alternating, median of N.

    cd benchmarks && python bench_int8_sdpa.py [--engine gpu:0] [--repeat 30] [--models bert_large distill_bert GPT]
        [--always-fuse]   (fuse the quantized attention wherever the kernel can, to measure it)
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
from triodnn.graph import _compiled_partition as compiled_partition
from triodnn.graph import from_dict
from triodnn.testing._driver import compare, make_inputs, reference_outputs

MHA = Path(__file__).resolve().parents[1].parent / "shared" / "graphs" / "benchdnn" / "complex_fusion" / "mha"
QUANT_FIELDS = ("query_quant", "key_quant", "value_quant", "probs_quant", "dst_quant")


def _without_quantized(find):
    def find_float_only(ops, output_ids):
        return [m for m in find(ops, output_ids) if all(getattr(m, f) is None for f in QUANT_FIELDS)
                and m.query.dtype in ("f32", "f16", "bf16") and m.score_rounding == "f32"]
    return find_float_only


async def compile_all(graph, engine, quantized_sdpa: bool):
    original = compiled_partition.find_sdpa
    if not quantized_sdpa:
        compiled_partition.find_sdpa = _without_quantized(original)
    try:
        out = []
        for p in graph.get_partitions():
            ins, outs = list(p.input_ports), list(p.output_ports)
            out.append(await compiled_partition.compile_partition(p, engine, ins, outs,
                                                                  p._infer(ins, outs, declared=True)))
        return out
    finally:
        compiled_partition.find_sdpa = original


async def prepare(graph, engine, quantized_sdpa: bool, arrays):
    return await common.bind_graph(graph, engine, await compile_all(graph, engine, quantized_sdpa), arrays)


async def check(name, graph, tensors, want, kinds_of):
    for out in graph.output_tensors():
        got = np.asarray(await tensors[out.id].to_numpy(), np.float64)
        ref = np.asarray(want[out.id], np.float64)
        if out.dtype in ("s8", "u8"):
            diff = np.abs(got - ref)
            assert diff.max() <= 1 and (diff == 0).mean() > 0.99, (name, diff.max(), (diff == 0).mean())
        else:
            verdict = compare(out, got, ref, kinds_of)
            assert verdict.passed, (name, verdict)


async def main(args):
    if args.always_fuse:
        compiled_partition.sdpa_kernel.fusion_pays = lambda *sizes, **options: True
    async with triodnn.open_runtime() as rt:
        engine = await common.engine_named(rt, args.engine)
        print(f"engine {engine}; wall time of one execution awaited, variants alternating, median of {args.repeat}")
        stream = await engine.stream(StreamFlags.in_order)
        for model in args.models:
            variants = {}
            for label, file, quantized in (("int8 fused SDPA", "int8", True), ("int8 before", "int8", False),
                                           ("f32 fused", "fp32", True)):
                graph = from_dict(json.loads((MHA / f"MHA-{model}-inf-{file}-bs1.json").read_text()))
                arrays = make_inputs(graph, seed=0)
                want, _ = reference_outputs(graph, arrays)
                kinds, plan, tensors = await prepare(graph, engine, quantized, arrays)
                variants[label] = (kinds, plan)

                async def once(plan=plan):
                    event = None
                    for cp, ins, outs in plan:
                        event = cp.execute(stream, ins, outs)
                    await event
                await once()
                await check(f"{model} {label}", graph, tensors, want, {op.kind for op in graph.ops})
                variants[label] = (kinds, once)
            times: dict[str, list[float]] = {label: [] for label in variants}
            for _ in range(3):
                for _, once in variants.values():
                    await once()
            labels = list(variants)
            for i in range(args.repeat):
                for label in (labels if i % 2 == 0 else labels[::-1]):
                    start = time.perf_counter()
                    await variants[label][1]()
                    times[label].append((time.perf_counter() - start) * 1e6)
            med = {label: statistics.median(t) for label, t in times.items()}
            row = " | ".join(f"{label} {med[label]:.1f} us ({len(variants[label][0])} prims)" for label in labels)
            print(f"MHA-{model}: {row} | before / fused = {med['int8 before'] / med['int8 fused SDPA']:.2f}x"
                  f" | int8 fused / f32 fused time = {med['int8 fused SDPA'] / med['f32 fused']:.2f}x", flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--engine", default=None)
    parser.add_argument("--repeat", type=int, default=30)
    parser.add_argument("--models", nargs="*", default=["bert_large", "distill_bert", "GPT"])
    parser.add_argument("--always-fuse", action="store_true")
    trio.run(main, parser.parse_args())

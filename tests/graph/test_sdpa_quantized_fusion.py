"""oneDNN's quantized attention graphs (../shared/graphs/benchdnn/complex_fusion/mha; see
tests/_shared.py where absent) compile to one fused SDPA primitive each, Dequantize / DynamicDequantize /
TypeCast / Quantize included, and pass with benchdnn's verdict: the u8 outputs of the int8 MHA
graph equal the op-by-op reference exactly (the kernel rounds to bf16 where the graph does)."""

from __future__ import annotations

import pytest
from _shared import GRAPHS, require

from triodnn.graph._compiled_partition import compile_partition
from triodnn.graph._json import load
from triodnn.kernels import sdpa
from triodnn.testing import run_case

MHA = GRAPHS / "benchdnn" / "complex_fusion" / "mha"
# name: (Sq, Skv, D, Dv)
GRAPHS = {
    "MHA-distill_bert-inf-int8-bs1.json": (128, 128, 64, 64),  # u8 Q/K/V, bf16 scores, u8 probabilities and dst
    "sdpa-compressed-kv-int4-gs32.json": (32, 32, 128, 128),  # s4 K^T and V, grouped f16 scales, s4 zero points
    "sdpa-compressed-kv-implicit-causal-mask-int8-gs128.json": (32, 32, 128, 128),  # s8 groups of 128, causal
    "sdpa-fp8-f32.json": (128, 128, 64, 64),  # f8_e4m3 Q, K, V, probabilities and dst
}


@pytest.mark.parametrize("name", list(GRAPHS))
async def test_quantized_attention_is_one_fused_primitive_and_passes(engine, name):
    path = MHA / name
    require(path)
    (partition,) = load(path).get_partitions()
    ins, outs = list(partition.input_ports), list(partition.output_ports)
    compiled = await compile_partition(partition, engine, ins, outs, partition._infer(ins, outs, declared=True))
    kinds = [prim.desc.kind for prim in compiled.primitives]
    # On a GPU only the split kernel pays (D + Dv <= 192); elsewhere the ops run one by one.
    if sdpa.fusion_pays(*GRAPHS[name], engine._config, probs_quantized=name.startswith(("MHA", "sdpa-fp8"))):
        assert kinds == ["sdpa"]
    else:
        assert "sdpa" not in kinds and len(kinds) > 1
    result = await run_case(path, engine=engine)
    assert result.status == "PASSED", result
    if name.startswith("MHA"):
        (check,) = result.checks
        assert check.mismatches == 0 and check.rtol == 0.0  # u8: every element equal

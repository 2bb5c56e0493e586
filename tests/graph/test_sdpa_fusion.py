"""Attention graphs compile to ONE fused sdpa primitive (graph/_sdpa_pattern.py) and match
the op-by-op numpy reference of the graph driver (``triodnn.testing.run_case``).

Small synthetic graphs, one per pattern oneDNN's CI attention graphs use (Select masks before and
after the scale, implicit causal masks (top-left, and bottom-right with host-scalar offsets),
soft-capping, f16/bf16 probabilities with SoftMax's
statistics, the transposed JAX form, output transposes and reshapes), chains the kernel's order
cannot express (they stay op by op and still pass), and the CI graphs themselves where they run
in about a second (from ../shared: tests/_shared.py says what runs without it).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from _graph_documents import G
from _shared import GRAPHS, require

from triodnn.graph import from_dict
from triodnn.kernels import sdpa as sdpa_kernel
from triodnn.kernels import select_config
from triodnn.testing import run_case

SHARED = GRAPHS / "benchdnn" / "complex_fusion" / "mha"


B, H, SQ, SKV, D = 1, 2, 20, 33, 16
SCORES = (B, H, SQ, SKV)


def select_before_scale(dt="f32"):
    """MHA-GPT: MatMul -> Select(cond, scores, fill) -> Divide -> Add -> SoftMax -> MatMul ->
    StaticTranspose -> Reorder."""
    g = G()
    g.op("MatMul", [g.t(1, (B, H, SQ, D), dt), g.t(2, (B, H, SKV, D), dt)], [g.t(3, SCORES)], transpose_b=True)
    g.op("Select", [g.t(4, (1, 1, SQ, SKV), "boolean"), g.t(3, SCORES), g.t(5, (), "f32")], [g.t(6, SCORES)])
    g.op("Divide", [g.t(6, SCORES), g.t(7, (), "f32")], [g.t(8, SCORES)])
    g.op("Add", [g.t(8, SCORES), g.t(9, (1, 1, 1, SKV))], [g.t(10, SCORES)])
    g.op("SoftMax", [g.t(10, SCORES)], [g.t(11, SCORES, dt)], axis=3, mode="inf_as_zero")
    g.op("MatMul", [g.t(11, SCORES, dt), g.t(12, (B, H, SKV, D), dt)], [g.t(13, (B, H, SQ, D), dt)])
    g.op("StaticTranspose", [g.t(13, (B, H, SQ, D), dt)], [g.t(14, (B, SQ, H, D), dt)], order=[0, 2, 1, 3])
    g.op("Reorder", [g.t(14, (B, SQ, H, D), dt)], [g.t(15, (B, SQ, H, D), dt)])
    return g


def select_fill_first():
    """distill_bert: MatMul -> Divide -> Select(cond, fill, scores) -> SoftMax -> MatMul."""
    g = G()
    g.op("MatMul", [g.t(1, (B, H, SQ, D)), g.t(2, (B, H, SKV, D))], [g.t(3, SCORES)], transpose_b=True)
    g.op("Divide", [g.t(3, SCORES), g.t(4, (1,))], [g.t(5, SCORES)])
    g.op("Select", [g.t(6, (B, 1, 1, SKV), "boolean"), g.t(7, (1,)), g.t(5, SCORES)], [g.t(8, SCORES)])
    g.op("SoftMax", [g.t(8, SCORES)], [g.t(9, SCORES)], axis=-1, mode="inf_as_zero")
    g.op("MatMul", [g.t(9, SCORES), g.t(10, (B, H, SKV, D))], [g.t(11, (B, H, SQ, D))])
    return g


def implicit_causal(dt="f32", heads=(H,), kv_heads=(H,)):
    """MatMul -> Multiply -> GenIndex(-2), GenIndex(-1) -> GreaterEqual -> Select -> SoftMax -> MatMul."""
    s = (B, *heads, SQ, SQ)
    g = G()
    g.op("MatMul", [g.t(1, (B, *heads, SQ, D), dt), g.t(2, (B, *kv_heads, SQ, D), dt)], [g.t(3, s)], transpose_b=True)
    g.op("Multiply", [g.t(3, s), g.t(4, (1,))], [g.t(5, s)])
    g.op("GenIndex", [g.t(5, s)], [g.t(6, s, "s32")], axis=len(s) - 2)
    g.op("GenIndex", [g.t(5, s)], [g.t(7, s, "s32")], axis=-1)
    g.op("GreaterEqual", [g.t(6, s, "s32"), g.t(7, s, "s32")], [g.t(8, s, "boolean")])
    g.op("Select", [g.t(8, s, "boolean"), g.t(5, s), g.t(9, (1,))], [g.t(10, s)])
    g.op("SoftMax", [g.t(10, s)], [g.t(11, s, dt)], axis=-1, mode="inf_as_zero")
    g.op("MatMul", [g.t(11, s, dt), g.t(12, (B, *kv_heads, SQ, D), dt)], [g.t(13, (B, *heads, SQ, D), dt)])
    return g


def bottom_right_causal():
    """Host-scalar Add/Subtract on the row index (oneDNN's bottom-right implicit causal mask)."""
    s = (B, H, SQ, SKV)
    g = G()
    g.op("MatMul", [g.t(1, (B, H, SQ, D), "f16"), g.t(2, (B, H, SKV, D), "f16")], [g.t(3, s)], transpose_b=True)
    g.op("Multiply", [g.t(3, s), g.t(4, (1,), "f16")], [g.t(5, s)])
    g.op("GenIndex", [g.t(5, s)], [g.t(6, s, "s32")], axis=-2)
    scalar = dict(g.t(7, (), "s32"), property_type="host_scalar")
    g.op("Add", [g.t(6, s, "s32"), scalar], [g.t(8, s, "s32")])
    g.op("Subtract", [g.t(8, s, "s32"), dict(scalar, id=9)], [g.t(10, s, "s32")])
    g.op("GenIndex", [g.t(5, s)], [g.t(11, s, "s32")], axis=-1)
    g.op("GreaterEqual", [g.t(10, s, "s32"), g.t(11, s, "s32")], [g.t(12, s, "boolean")])
    g.op("Select", [g.t(12, s, "boolean"), g.t(5, s), g.t(13, (1,))], [g.t(14, s)])
    g.op("SoftMax", [g.t(14, s)], [g.t(15, s, "f16")], axis=-1, mode="inf_as_zero")
    g.op("MatMul", [g.t(15, s, "f16"), g.t(16, (B, H, SKV, D), "f16")], [g.t(17, (B, H, SQ, D), "f16")])
    return g


def softcap():
    """gemma2 (bf16, GQA): MatMul -> Multiply -> Tanh -> Multiply -> Select -> SoftMax(bf16) -> MatMul."""
    s = (B, 2, 2, 3, SKV)
    g = G()
    g.op("MatMul", [g.t(1, (B, 2, 2, 3, D), "bf16"), g.t(2, (B, 2, 1, SKV, D), "bf16")], [g.t(3, s)],
         transpose_b=True)
    g.op("Multiply", [g.t(3, s), g.t(4, (1,))], [g.t(5, s)])
    g.op("Tanh", [g.t(5, s)], [g.t(6, s)])
    g.op("Multiply", [g.t(6, s), g.t(7, (1,))], [g.t(8, s)])
    g.op("Select", [g.t(9, s, "boolean"), g.t(8, s), g.t(10, (1,))], [g.t(11, s)])
    g.op("SoftMax", [g.t(11, s)], [g.t(12, s, "bf16")], axis=-1)
    g.op("MatMul", [g.t(12, s, "bf16"), g.t(13, (B, 2, 1, SKV, D), "bf16")], [g.t(14, (B, 2, 2, 3, D), "bf16")])
    return g


def training_forward(dt="f16"):
    """f16 probabilities and SoftMax's statistics (a partition output)."""
    g = G()
    g.op("MatMul", [g.t(1, (B, H, SQ, D), dt), g.t(2, (B, H, SKV, D), dt)], [g.t(3, SCORES)], transpose_b=True)
    g.op("Multiply", [g.t(3, SCORES), g.t(4, (1,), dt)], [g.t(5, SCORES)])
    g.op("Add", [g.t(5, SCORES), g.t(6, SCORES, dt)], [g.t(7, SCORES)])
    g.op("SoftMax", [g.t(7, SCORES)], [g.t(8, SCORES, dt), g.t(9, (B, H, SQ, 1))], axis=-1, mode="inf_as_zero")
    g.op("MatMul", [g.t(8, SCORES, dt), g.t(10, (B, H, SKV, D), dt)], [g.t(11, (B, H, SQ, D), dt)])
    return g


def jax_transposed():
    """JAX: SoftMax -> StaticTranspose -> Reorder -> MatMul(V^T, P^T) -> StaticTranspose -> StaticReshape."""
    g = G()
    q_strides = [SQ * H * D, D, H * D, 1]  # (B, SQ, H, D) storage seen as (B, H, SQ, D)
    g.op("MatMul", [g.t(1, (B, H, SQ, D), strides=q_strides), g.t(2, (B, H, D, SKV))], [g.t(3, SCORES)])
    g.op("Divide", [g.t(3, SCORES), g.t(4, (1,))], [g.t(5, SCORES)])
    g.op("SoftMax", [g.t(5, SCORES)], [g.t(6, SCORES)], axis=3, mode="inf_as_zero")
    transposed = (B, H, SKV, SQ)
    g.op("StaticTranspose", [g.t(6, SCORES)], [g.t(7, transposed, strides=[H * SQ * SKV, SQ * SKV, 1, SKV])],
         order=[0, 1, 3, 2])
    g.op("Reorder", [g.t(7, transposed, strides=[H * SQ * SKV, SQ * SKV, 1, SKV])], [g.t(8, transposed)])
    g.op("MatMul", [g.t(9, (B, H, D, SKV)), g.t(8, transposed)], [g.t(10, (B, H, D, SQ))])
    g.op("StaticTranspose", [g.t(10, (B, H, D, SQ))], [g.t(11, (B, SQ, H, D))], order=[0, 3, 1, 2])
    g.op("StaticReshape", [g.t(11, (B, SQ, H, D))], [g.t(12, (B, SQ, H * D))], shape=[B, SQ, H * D],
         special_zero=False)
    return g


def gqa_reshaped_output():
    """GQA-f32: 5-D grouped attention whose output is reshaped back to 4-D heads."""
    s = (B, 2, 2, SQ, SKV)
    g = G()
    g.op("MatMul", [g.t(1, (B, 2, 2, SQ, D)), g.t(2, (B, 2, 1, SKV, D))], [g.t(3, s)], transpose_b=True)
    g.op("Divide", [g.t(3, s), g.t(4, (1,))], [g.t(5, s)])
    g.op("Add", [g.t(5, s), g.t(6, (B, 1, 1, 1, SKV))], [g.t(7, s)])
    g.op("SoftMax", [g.t(7, s)], [g.t(8, s)], axis=-1, mode="inf_as_zero")
    g.op("MatMul", [g.t(8, s), g.t(9, (B, 2, 1, SKV, D))], [g.t(10, (B, 2, 2, SQ, D))])
    g.op("StaticReshape", [g.t(10, (B, 2, 2, SQ, D))], [g.t(11, (B, 4, SQ, D))], shape=[B, 4, SQ, D],
         special_zero=False)
    return g


def select_after_mask():
    """Add then Select: the kernel applies the Select before the mask, so this stays op by op."""
    g = G()
    g.op("MatMul", [g.t(1, (B, H, SQ, D)), g.t(2, (B, H, SKV, D))], [g.t(3, SCORES)], transpose_b=True)
    g.op("Add", [g.t(3, SCORES), g.t(4, (1, 1, 1, SKV))], [g.t(5, SCORES)])
    g.op("Select", [g.t(6, (1, 1, SQ, SKV), "boolean"), g.t(5, SCORES), g.t(7, (1,))], [g.t(8, SCORES)])
    g.op("SoftMax", [g.t(8, SCORES)], [g.t(9, SCORES)], axis=-1)
    g.op("MatMul", [g.t(9, SCORES), g.t(10, (B, H, SKV, D))], [g.t(11, (B, H, SQ, D))])
    return g


def tanh_without_cap():
    """A Tanh with no cap Multiply after it is not soft-capping: op by op."""
    g = G()
    g.op("MatMul", [g.t(1, (B, H, SQ, D)), g.t(2, (B, H, SKV, D))], [g.t(3, SCORES)], transpose_b=True)
    g.op("Tanh", [g.t(3, SCORES)], [g.t(4, SCORES)])
    g.op("SoftMax", [g.t(4, SCORES)], [g.t(5, SCORES)], axis=-1)
    g.op("MatMul", [g.t(5, SCORES), g.t(6, (B, H, SKV, D))], [g.t(7, (B, H, SQ, D))])
    return g


FUSED = {
    "select_before_scale": select_before_scale,
    "select_before_scale_f16": lambda: select_before_scale("f16"),
    "select_fill_first": select_fill_first,
    "implicit_causal": implicit_causal,
    "implicit_causal_gqa_bf16": lambda: implicit_causal("bf16", (2, 2), (2, 1)),
    "bottom_right_causal_host_scalars": bottom_right_causal,
    "softcap": softcap,
    "training_forward_f16_stats": training_forward,
    "jax_transposed": jax_transposed,
    "gqa_reshaped_output": gqa_reshaped_output,
}


async def primitive_kinds(engine, path: Path) -> list[list[str]]:
    graph = from_dict(json.loads(path.read_text()))
    kinds = []
    for partition in graph.get_partitions():
        assert partition.is_supported
        compiled = await partition.compile(engine)
        kinds.append([p.desc.kind for p in compiled.primitives])
    return kinds


async def check(engine, path: Path, fused: bool, **options) -> None:
    kinds = await primitive_kinds(engine, path)
    if fused:
        assert kinds == [["sdpa"]], kinds
    else:
        assert len(kinds) == 1 and "sdpa" not in kinds[0] and "softmax" in kinds[0], kinds
    result = await run_case(path, engine=engine, **options)
    assert result.status == "PASSED", result.summary() if hasattr(result, "summary") else result


@pytest.mark.parametrize("name", list(FUSED))
async def test_pattern_fuses_to_one_sdpa(engine, tmp_path, name):
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(FUSED[name]().document()))
    await check(engine, path, fused=True)


@pytest.mark.parametrize("make", [select_after_mask, tanh_without_cap])
async def test_out_of_order_chains_stay_op_by_op(engine, tmp_path, make):
    path = tmp_path / "graph.json"
    path.write_text(json.dumps(make().document()))
    await check(engine, path, fused=False)


# CI graphs that take about a second each at their own shapes on 2 cores (PoCL)
CI = {
    "MHA-GPT-inf-fp32-bs1.json": None,
    "MHA-distill_bert-inf-fp32-bs1.json": None,
    "MHA-bert_large-inf-fp32-bs1.json": None,
    "codegemma-bf16-f32.json": None,
    "gemma2-bf16-f32.json": None,
    "sdpa-plain-implicit-causal-mask-fp32-bs1.json": None,
    "sdpa-plain-simplified-f16-f32.json": None,
    "gqa-plain-training-forward-bf16-f32.json": None,
    "gqa-plain-implicit-causal-mask-fp32-bs1.json": "1:1x2x8x64x64+3:1x2x1x64x64+19:1x2x1x64x64",
    "sdpa-plain-bottom-right-implicit-causal-mask-f16-f32.json": None,
}


# Head size 256 (D + Dv > 192): the GPU configuration runs these op by op, where its fused
# kernel is slower (kernels.sdpa.fusion_pays).
WIDE_HEADS = {"MHA-GPT-inf-fp32-bs1.json", "codegemma-bf16-f32.json", "gemma2-bf16-f32.json"}


@pytest.mark.parametrize("name", list(CI))
async def test_ci_graph_fuses_to_one_sdpa(engine, name):
    path = SHARED / name
    require(path)
    on_gpu_config = engine._config.vector_width == 1
    await check(engine, path, fused=not (on_gpu_config and name in WIDE_HEADS), in_shapes=CI[name])


def test_fusion_pays_everywhere_on_cpus_and_where_the_split_kernel_applies_on_gpus():
    cpu, gpu = select_config("cpu", 4096), select_config("gpu", 1024)
    assert sdpa_kernel.fusion_pays(1, 256, 256, 256, cpu)
    assert sdpa_kernel.fusion_pays(128, 128, 64, 64, gpu)
    assert sdpa_kernel.fusion_pays(384, 384, 96, 96, gpu)      # D + Dv = 192: the split kernel
    assert not sdpa_kernel.fusion_pays(1, 256, 256, 256, gpu)   # gemma2's decoding step
    assert not sdpa_kernel.fusion_pays(32, 33, 256, 256, gpu)   # MHA-GPT

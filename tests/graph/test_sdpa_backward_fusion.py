"""SDPA backward graphs compile to the two fused sdpa_backward primitives
(graph/_sdpa_backward_pattern.py) and match the op-by-op numpy reference of the graph
driver (``triodnn.testing.run_case``); variants the pattern does not take stay op by op.

``kernels.sdpa_backward.fusion_pays`` is off until the fused kernels are measured faster, so these
tests force it on (``FORCE``), with the compiled-partition cache off: its key does not know the
rule, and a plan compiled under the other setting must not come back.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from _graph_documents import G
from _shared import GRAPHS, require

import triodnn
from triodnn.graph import from_dict
from triodnn.kernels import sdpa_backward
from triodnn.testing import run_case
from triodnn.testing._driver import parse_in_shapes, rewrite

SHARED = GRAPHS / "benchdnn" / "complex_fusion" / "mha"
B, H, SQ, SKV, D = 1, 2, 20, 28, 16


def backward(dt: str = "f32", scale: str | None = "Multiply", mask: bool = True, ds_output: bool = False) -> G:
    """oneDNN's sdpa-plain-training-backward graph, small: Q 100, K 101, V 104, dO 105, O 10,
    stats 8, scale 102, mask 103; dQ 27, dK 29, dV 12. ``dt`` bf16 adds the bf16 graphs'
    TypeCasts of P and dS; ``ds_output`` makes dS a partition output too (as the dmask graphs)."""
    g = G()
    q, k, v = g.t(100, (B, H, SQ, D), dt), g.t(101, (B, H, SKV, D), dt), g.t(104, (B, H, SKV, D), dt)
    do, o = g.t(105, (B, H, SQ, D), dt), g.t(10, (B, H, SQ, D), dt)
    scores = (B, H, SQ, SKV)
    f = lambda id_, shape=scores: g.t(id_, shape)  # noqa: E731 - f32 intermediates
    g.op("MatMul", [q, k], [f(1)], transpose_b=True)
    x = f(1)
    if scale is not None:
        g.op(scale, [x, g.t(102, (1,), dt)], [f(3)])
        x = f(3)
    if mask:
        g.op("Add", [x, g.t(103, (B, H, SQ, SKV), dt)], [f(5)])
        x = f(5)
    g.op("Subtract", [x, f(8, (B, H, SQ, 1))], [f(7)])
    g.op("Exp", [f(7)], [f(9)])
    p = f(9)
    if dt != "f32":
        g.op("TypeCast", [p], [g.t(11, scores, dt)])
        p = g.t(11, scores, dt)
    g.op("MatMul", [p, do], [g.t(12, (B, H, SKV, D), dt)], transpose_a=True)
    g.op("MatMul", [do, v], [f(14)], transpose_b=True)
    g.op("Multiply", [o, do], [f(16, (B, H, SQ, D))])
    g.op("ReduceSum", [f(16, (B, H, SQ, D))], [f(18, (B, H, SQ, 1))], axes=[-1], keep_dims=True)
    g.op("Subtract", [f(14), f(18, (B, H, SQ, 1))], [f(20)])
    g.op("Multiply", [f(9), f(20)], [f(22)])
    ds = f(22)
    if scale is not None:
        g.op(scale, [ds, g.t(102, (1,), dt)], [f(24)])
        ds = f(24)
    if ds_output:
        g.op("Abs", [ds], [f(40)])
    if dt != "f32":
        g.op("TypeCast", [ds], [g.t(25, scores, dt)])
        ds = g.t(25, scores, dt)
    g.op("MatMul", [ds, k], [g.t(27, (B, H, SQ, D), dt)])
    g.op("MatMul", [ds, q], [g.t(29, (B, H, SKV, D), dt)], transpose_a=True)
    return g


@pytest.fixture(autouse=True)
def forced(monkeypatch):
    monkeypatch.setattr(sdpa_backward, "FORCE", True)
    capacity = triodnn.get_compiled_partition_cache_capacity()
    triodnn.set_compiled_partition_cache_capacity(0)
    yield
    triodnn.set_compiled_partition_cache_capacity(capacity)


async def primitive_kinds(engine, path: Path) -> list[list[str]]:
    graph = from_dict(json.loads(path.read_text()))
    kinds = []
    for partition in graph.get_partitions():
        assert partition.is_supported
        compiled = await partition.compile(engine)
        kinds.append([p.desc.kind for p in compiled.primitives])
    return kinds


async def check(engine, path: Path, fused: bool, **options) -> None:
    result = await run_case(path, engine=engine, **options)
    assert result.status == "PASSED", result
    if options:
        return  # reshaped through run_case: the file's own shapes are too slow to compile here
    kinds = await primitive_kinds(engine, path)
    if fused:
        assert kinds == [["sdpa_backward", "sdpa_backward"]], kinds
    else:
        assert len(kinds) == 1 and "sdpa_backward" not in kinds[0] and "matmul" in kinds[0], kinds


# The fused backward is off by default (kernels.sdpa_backward.fusion_pays), so the forms are
# few: bf16 casts stand for f16's (the same TypeCast handling), and the Divide scale rides on
# the mask-less form.
FUSED = {
    "f32": lambda: backward(),
    "bf16_casts": lambda: backward("bf16"),
    "divide_no_mask": lambda: backward(scale="Divide", mask=False),
    "no_scale": lambda: backward(scale=None),
}


@pytest.mark.parametrize("name", list(FUSED))
async def test_pattern_fuses_to_two_sdpa_backward_primitives(engine, tmp_path, name):
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(FUSED[name]().document()))
    await check(engine, path, fused=True)


async def test_ds_read_outside_the_pattern_stays_op_by_op(engine, tmp_path):
    path = tmp_path / "graph.json"
    path.write_text(json.dumps(backward(ds_output=True).document()))
    await check(engine, path, fused=False)


async def test_rule_off_runs_op_by_op(engine, tmp_path, monkeypatch):
    monkeypatch.setattr(sdpa_backward, "FORCE", False)
    path = tmp_path / "graph.json"
    path.write_text(json.dumps(backward().document()))
    await check(engine, path, fused=False)


SHAPES = "100:1x2x32x16+101:1x2x32x16+104:1x2x32x16+105:1x2x32x16+10:1x2x32x16+103:1x2x32x32+8:1x2x32x1"
GQA = ("100:1x2x4x32x16+101:1x2x1x32x16+104:1x2x1x32x16+105:1x2x4x32x16+10:1x2x4x32x16"
       "+103:1x2x4x32x32+8:1x2x4x32x1")


@pytest.mark.parametrize(("name", "shapes", "fused"), [
    ("sdpa-plain-training-backward-bf16-f32.json", SHAPES, True),
    # (the dmask graphs stay op by op too: test_ds_read_outside_the_pattern_stays_op_by_op)
    ("gqa-plain-training-backward-f32.json", GQA, False),
])
async def test_ci_graphs(engine, tmp_path, name, shapes, fused):
    path = SHARED / name
    require(path)
    await check(engine, path, fused=fused, in_shapes=shapes)
    # The primitive kinds at the small shapes: the file rewritten as the driver rewrites it.
    document = rewrite(json.loads(path.read_text()), parse_in_shapes(shapes), None, {})
    small = tmp_path / name
    small.write_text(json.dumps(document))
    kinds = await primitive_kinds(engine, small)
    assert len(kinds) == 1 and ("sdpa_backward" in kinds[0]) == fused, kinds

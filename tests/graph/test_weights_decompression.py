"""Weights decompression (graph/_weights_decompression.py): DynamicDequantize(int4/int8 weights)
-> MatMul (+ post-ops) compiles to one ``dequantizing_matmul`` primitive where its CPU blocks
apply, whose outputs match the op-by-op graph reference; other groupings keep the ops one by
one. The kernel's own paths are checked in tests/primitives/test_dequantizing_matmul.py; oneDNN's
int4 gated MLP runs fused with benchdnn's verdict here."""

from __future__ import annotations

import numpy as np
import pytest
from _graph_helpers import graph_of, lt, primitive_kinds, run
from _shared import GRAPHS, require

from triodnn.graph import Op, load
from triodnn.kernels import tolerance
from triodnn.testing import parse_harness, run_benchdnn
from triodnn.testing._driver import reference_outputs

M, K, N = 2, 64, 96


def decompressed_graph(*, group_n=32, group_k=1, weights="u4", zps=True):
    """f16 src @ DynamicDequantize(weights in groups of group_k x group_n, f16 scales, u8 zero
    points) to f16, f32 dst, times a gate (a binary post-op), as the gated MLP's second matmul."""
    placed = (K // group_k, N // group_n)
    deq_inputs = [lt(0, (K, N), weights), lt(1, placed, "f16")] + ([lt(2, placed, "u8")] if zps else [])
    return graph_of(
        Op(0, "DynamicDequantize", deq_inputs, [lt(3, (K, N), "f16")],
           {"qtype": "per_group", "axis": -1, "group_shape": [group_k, group_n]}),
        Op(1, "MatMul", [lt(4, (M, K), "f16"), lt(3, (K, N), "f16")], [lt(5, (M, N))], {}),
        Op(2, "Multiply", [lt(5, (M, N)), lt(6, (M, N))], [lt(7, (M, N))], {"auto_broadcast": "numpy"}),
    )


def inputs(rng, graph) -> dict[int, np.ndarray]:
    """Weights over their whole range, scales representable in f16, gates in [-2, 2)."""
    arrays = {}
    for t in graph.input_tensors():
        if t.dtype in ("u4", "s4", "u8", "s8"):
            low, high = {"u4": (0, 15), "s4": (-8, 7), "u8": (0, 255), "s8": (-128, 127)}[t.dtype]
            arrays[t.id] = rng.integers(low, high, t.shape, endpoint=True)
        elif t.id == 1:
            arrays[t.id] = rng.choice([0.0078125, 0.015625, 0.03125, 0.046875], t.shape).astype(np.float16)
        elif t.id == 2:
            arrays[t.id] = rng.integers(0, 16, t.shape).astype(np.uint8)
        else:
            arrays[t.id] = rng.uniform(-2, 2, t.shape).astype(np.float16 if t.dtype == "f16" else np.float32)
    return arrays


@pytest.mark.cpu
@pytest.mark.parametrize(("weights", "group"), [("u4", (1, 32)), ("s8", (1, 32)), ("s4", (32, 1))],
                         ids=["u4_along_n", "s8_along_n", "s4_along_k"])
async def test_fuses_to_one_matmul_and_matches_the_reference(engine, rng, weights, group):
    graph = decompressed_graph(weights=weights, group_k=group[0], group_n=group[1])
    assert await primitive_kinds(engine, graph) == ["dequantizing_matmul"]
    arrays = inputs(rng, graph)
    got = await run(engine, graph, arrays)
    want, _ = reference_outputs(graph, arrays)
    tolerance.check(got[7], want[7], tolerance.matmul(K) + 2.0 ** -10)
    assert np.count_nonzero(got[7]) > M * N // 2


@pytest.mark.cpu
async def test_without_zero_points_fused_and_unfused(engine, rng):
    graph = decompressed_graph(zps=False)
    assert await primitive_kinds(engine, graph, fuse=False) == ["dynamic_quantize", "matmul", "binary"]
    assert await primitive_kinds(engine, graph) == ["dequantizing_matmul"]
    arrays = inputs(rng, graph)
    fused = await run(engine, graph, arrays)
    want, _ = reference_outputs(graph, arrays)
    tolerance.check(fused[7], want[7], tolerance.matmul(K) + 2.0 ** -10)


async def test_groups_the_blocks_cannot_take_run_op_by_op(engine, rng):
    graph = decompressed_graph(group_n=8)
    kinds = await primitive_kinds(engine, graph)
    assert "dequantizing_matmul" not in kinds and "dynamic_quantize" in kinds
    arrays = inputs(rng, graph)
    got = await run(engine, graph, arrays)
    want, _ = reference_outputs(graph, arrays)
    tolerance.check(got[7], want[7], tolerance.matmul(K) + 2.0 ** -10)


@pytest.mark.cpu
async def test_onednns_int4_gated_mlp_runs_fused_with_benchdnns_verdict(engine, monkeypatch, tmp_path):
    shared = GRAPHS / "benchdnn"
    case = shared / "complex_fusion/mlp/gated-mlp-int4.json"
    require(case)
    kinds = await primitive_kinds(engine, load(case))
    assert kinds.count("dequantizing_matmul") == 3 and "dynamic_quantize" not in kinds, kinds
    harness = tmp_path / "harness"
    harness.write_text(f"--reset --case={case}\n")
    (found,) = parse_harness(harness)
    monkeypatch.chdir(shared)
    result = await run_benchdnn(found, engine=engine, repeat=1)
    assert result.status == "PASSED", f"{result.status} ({result.message}) {result.repro}"

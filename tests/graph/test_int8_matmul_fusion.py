"""Int8 matmul fusion (graph/_int8_matmul.py): Dequantize -> MatMul (+ post-ops)
[-> Quantize] compiles to one quantized_matmul primitive whose outputs match the op-by-op graph
reference, while patterns it does not take keep their op-by-op primitives."""

from __future__ import annotations

import numpy as np
import pytest
from _graph_helpers import deq, graph_of, int8_inputs, lt, primitive_kinds, run

from triodnn.graph import Op
from triodnn.kernels import select_config
from triodnn.testing._driver import reference_outputs


def int8_graph(*, m=6, k=24, n=10, sdt="u8", wdt="s8", per_channel=True, transpose_b=False,
               bias=True, relu=True, quantize="u8", typecast=False):
    """The graph of ``int8_matmul*`` patterns, with ids: 0 src, 1 weights, 2 bias; dst last."""
    wshape = (n, k) if transpose_b else (k, n)
    scales = [0.01 + 0.002 * i for i in range(n)] if per_channel else [0.02]
    zps = [i % 3 for i in range(n)] if per_channel else [1]
    ops = [deq(0, 0, 10, (m, k), sdt, [0.05], [3 if sdt == "u8" else -1]),
           deq(1, 1, 11, wshape, wdt, scales, zps, axis=(0 if transpose_b else 1) if per_channel else None)]
    a, w, mm_dtype = lt(10, (m, k)), lt(11, wshape), "f32"
    if typecast:
        mm_dtype = "bf16"
        ops += [Op(2, "TypeCast", [a], [lt(12, (m, k), "bf16")]), Op(3, "TypeCast", [w], [lt(13, wshape, "bf16")])]
        a, w = lt(12, (m, k), "bf16"), lt(13, wshape, "bf16")
    inputs = [a, w] + ([lt(2, (n,), mm_dtype)] if bias else [])
    current = lt(20, (m, n), mm_dtype)
    ops.append(Op(4, "MatMul", inputs, [current], {"transpose_b": transpose_b}))
    if typecast:
        ops.append(Op(5, "TypeCast", [current], [lt(21, (m, n))]))
        current = lt(21, (m, n))
    if relu:
        ops.append(Op(6, "ReLU", [current], [lt(22, (m, n))]))
        current = lt(22, (m, n))
    if quantize:
        ops.append(Op(7, "Quantize", [current], [lt(30, (m, n), quantize)], {"scales": [0.1], "zps": [10]}))
    return graph_of(*ops)


OPTIONS = {
    "per_channel_relu_u8": {},
    "per_tensor_s8_src_s8_dst": {"sdt": "s8", "per_channel": False, "quantize": "s8"},
    "transposed_weights_no_bias": {"transpose_b": True, "bias": False},
    "f32_dst": {"quantize": None},
    "bf16_typecasts": {"typecast": True, "quantize": None, "relu": False},
}


@pytest.mark.parametrize("name", list(OPTIONS))
async def test_fuses_to_one_quantized_matmul_and_matches_the_reference(engine, rng, name):
    graph = int8_graph(**OPTIONS[name])
    # The bf16 graph's TypeCast of the MatMul's bf16 output stays a reorder.
    want_kinds = ["quantized_matmul", "reorder"] if OPTIONS[name].get("typecast") else ["quantized_matmul"]
    assert await primitive_kinds(engine, graph) == want_kinds
    arrays = int8_inputs(rng, graph)
    got = await run(engine, graph, arrays)
    want, magnitudes = reference_outputs(graph, arrays)
    (out,) = [t.id for t in graph.output_tensors()]
    if graph.output_tensors()[0].dtype in ("s8", "u8"):
        # The exact integer sum against the reference's float64 op by op: ties may round apart.
        diff = np.abs(got[out].astype(np.int64) - want[out].astype(np.int64))
        assert diff.max() <= 1 and (diff == 0).mean() > 0.95, diff
        assert len(np.unique(got[out])) > 5
    else:
        # Op by op rounds each dequantized input to bf16 where the kernel sums exact integers: the
        # difference is relative to the size of the sum's terms (the MatMul's magnitude).
        tol = 2**-7 if OPTIONS[name].get("typecast") else 1e-5
        diff = np.abs(np.asarray(got[out], np.float64) - np.asarray(want[out], np.float64))
        assert (diff <= tol * (1 + np.abs(np.asarray(magnitudes[20], np.float64)))).all(), diff.max()


async def test_not_taken_runs_op_by_op(engine, rng):
    # Per-channel weights along K (axis 0 of (K, N)) are not oneDNN's int8 matmul: op by op.
    graph = graph_of(
        deq(0, 0, 10, (4, 8), "u8", [0.05], [3]),
        deq(1, 1, 11, (8, 5), "s8", [0.01 * (i + 1) for i in range(8)], [0] * 8, axis=0),
        Op(4, "MatMul", [lt(10, (4, 8)), lt(11, (8, 5))], [lt(20, (4, 5))]),
    )
    kinds = await primitive_kinds(engine, graph)
    assert "quantized_matmul" not in kinds and kinds.count("quantize") == 2 and "matmul" in kinds
    arrays = int8_inputs(rng, graph)
    got = await run(engine, graph, arrays)
    want, _ = reference_outputs(graph, arrays)
    np.testing.assert_allclose(got[20], want[20], rtol=1e-5, atol=1e-5)


async def test_fuse_false_lowers_op_by_op(engine):
    assert await primitive_kinds(engine, int8_graph(), fuse=False) == ["quantize", "quantize", "matmul", "eltwise", "quantize"]


async def test_gpu_configuration_fuses_small_products_only(engine):
    # kernels.quantized_matmul.fusion_pays: the GPU kernel is not tiled, so large products stay
    # on the tiled f32 matmul. Compiled only (the configuration is part of the primitive key).
    engine._config = select_config("gpu", engine.info.max_work_group_size)
    assert await primitive_kinds(engine, int8_graph()) == ["quantized_matmul"]
    big = int8_graph(m=512, k=512, n=512, per_channel=False)
    assert await primitive_kinds(engine, big) == ["quantize", "quantize", "matmul", "quantize"]
    engine._config = select_config("cpu", engine.info.max_work_group_size)
    assert await primitive_kinds(engine, big) == ["quantized_matmul"]

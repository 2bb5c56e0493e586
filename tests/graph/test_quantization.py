"""Quantized graphs: the low-precision storage types (f8_e4m3, f8_e5m2, s4, u4) through graph
TypeCast and StaticTranspose, static Quantize / Dequantize ops, and oneDNN's CI graphs for them
(../shared; see tests/_shared.py where absent), checked against numpy references."""

from __future__ import annotations

import numpy as np
import pytest
from _graph_helpers import graph_of, lt, run
from _shared import GRAPHS, require

from triodnn import InvalidGraphError, ShapeInferenceError
from triodnn._values import _dtypes
from triodnn.graph import Graph, Op, compile_graph
from triodnn.testing import run_case

BENCHDNN = GRAPHS / "benchdnn" / "op" / "f32"




@pytest.mark.parametrize("dtype", ["f8_e4m3", "f8_e5m2", "s4", "u4"])
async def test_typecast_through_low_precision_and_back(engine, rng, dtype):
    x = (rng.standard_normal((3, 5)) * 5).astype(np.float32)
    graph = graph_of(
        Op(0, "TypeCast", [lt(0, (3, 5))], [lt(1, (3, 5), dtype)]),
        Op(1, "StaticTranspose", [lt(1, (3, 5), dtype)], [lt(2, (5, 3), dtype)], {"order": [1, 0]}),
        Op(2, "TypeCast", [lt(2, (5, 3), dtype)], [lt(3, (5, 3))]),
    )
    out = await run(engine, graph, {0: x})
    if dtype in ("s4", "u4"):
        low, high = (-8, 7) if dtype == "s4" else (0, 15)
        want = np.clip(np.rint(x), low, high)
    else:
        want = _dtypes.from_storage(_dtypes.to_storage(x, dtype), dtype)
    np.testing.assert_array_equal(out[3], want.T)


async def test_quantize_then_dequantize_per_channel(engine, rng):
    x = (rng.standard_normal((2, 3, 4)) * 8).astype(np.float32)
    scales, zps = [0.5, 0.25, 2.0], [3, -1, 0]
    q = {"qtype": "per_channel", "axis": 1, "scales": scales, "zps": zps}
    graph = graph_of(
        Op(0, "Quantize", [lt(0, (2, 3, 4))], [lt(1, (2, 3, 4), "s8")], q),
        Op(1, "Dequantize", [lt(1, (2, 3, 4), "s8")], [lt(2, (2, 3, 4))], q),
    )
    out = await run(engine, graph, {0: x})
    s, z = np.array(scales).reshape(1, 3, 1), np.array(zps).reshape(1, 3, 1)
    quantized = np.clip(np.rint(x.astype(np.float64) / s + z), -128, 127)  # powers of two: exact
    np.testing.assert_array_equal(out[2], ((quantized - z) * s).astype(np.float32))


async def test_quantize_per_tensor_to_u8_and_f8(engine, rng):
    x = (rng.standard_normal((4, 5)) * 30).astype(np.float32)
    graph = graph_of(
        Op(0, "Quantize", [lt(0, (4, 5))], [lt(1, (4, 5), "u8")], {"scales": [0.5], "zps": [128]}),
        Op(1, "Quantize", [lt(0, (4, 5))], [lt(2, (4, 5), "f8_e4m3")], {"scales": [0.125]}),
    )
    out = await run(engine, graph, {0: x})
    np.testing.assert_array_equal(out[1], np.clip(np.rint(x.astype(np.float64) * 2 + 128), 0, 255))
    np.testing.assert_array_equal(out[2], _dtypes.from_storage(_dtypes.to_storage(x * 8, "f8_e4m3"), "f8_e4m3"))


def test_quantize_attribute_errors():
    with pytest.raises(InvalidGraphError, match="per_tensor takes one scale"):
        graph_of(Op(0, "Quantize", [lt(0, (2, 3))], [lt(1, (2, 3), "s8")], {"scales": [1.0, 2.0]}))
    with pytest.raises(InvalidGraphError, match="'zps' has 1 entries, 'scales' 3"):
        graph_of(Op(0, "Dequantize", [lt(0, (2, 3), "s8")], [lt(1, (2, 3))],
                    {"qtype": "per_channel", "axis": 1, "scales": [1.0, 2.0, 3.0], "zps": [0]}))
    with pytest.raises(InvalidGraphError, match="scales"):
        graph_of(Op(0, "Quantize", [lt(0, (2, 3))], [lt(1, (2, 3), "s8")], {}))


async def test_per_channel_scales_must_match_the_channels(engine):
    graph = Graph("cpu")
    graph.add_op(Op(0, "Quantize", [lt(0, (2, 3))], [lt(1, (-1, -1), "s8")],
                    {"qtype": "per_channel", "axis": 0, "scales": [1.0, 2.0, 3.0]}))
    with pytest.raises(ShapeInferenceError, match="3 scales for axis 0 of shape"):
        graph.finalize()
        await compile_graph(graph, engine)


async def test_dynamic_dequantize_per_channel_and_dynamic_quantize_per_tensor(engine, rng):
    x = rng.integers(-8, 8, (2, 3, 4))
    scales, zps = np.array([0.5, 2.0, 0.25], np.float32), np.array([1, -2, 0], np.int8)
    dequantize = Op(0, "DynamicDequantize", [lt(0, (2, 3, 4), "s4"), lt(1, (3,)), lt(2, (3,), "s8")],
                    [lt(3, (2, 3, 4))], {"qtype": "per_channel", "axis": -2})
    inputs = {0: x, 1: scales, 2: zps}
    out = await run(engine, graph_of(dequantize), inputs)
    want = (x - zps.reshape(1, 3, 1)) * scales.reshape(1, 3, 1)
    np.testing.assert_array_equal(out[3], want.astype(np.float32))
    both = graph_of(dequantize, Op(1, "DynamicQuantize", [lt(3, (2, 3, 4)), lt(4, (1,))], [lt(5, (2, 3, 4), "u8")], {}))
    out = await run(engine, both, {**inputs, 4: np.array([0.125], np.float32)})
    np.testing.assert_array_equal(out[5], np.clip(np.rint(want * 8), 0, 255))


async def test_dynamic_scales_shape_errors(engine):
    with pytest.raises(ShapeInferenceError, match="per_channel along axis 1 of .* takes 3 scales"):
        await compile_graph(graph_of(Op(0, "DynamicDequantize", [lt(0, (2, 3), "s8"), lt(1, (2,))], [lt(2, (-1, -1))],
                                        {"qtype": "per_channel", "axis": 1})), engine)
    with pytest.raises(ShapeInferenceError, match="are not src .* in groups of"):
        await compile_graph(graph_of(Op(0, "DynamicDequantize", [lt(0, (4, 6), "u4"), lt(1, (2, 2))], [lt(2, (-1, -1))],
                                        {"qtype": "per_group", "group_shape": [2, 2]})), engine)


@pytest.mark.parametrize("name", ["dequantize_s8.json", "dequantize_u8.json", "quantize.json", "dynamicdq_s4.json",
                                  "dynamicdq_u4.json", "../bf16/dynamicdq_s4.json"])
async def test_onednn_ci_graphs(engine, name):
    path = BENCHDNN / name
    require(path)
    result = await run_case(path, engine=engine, expected_n_partitions=1)
    assert result.status == "PASSED", result.summary()


async def test_tiny_int4_tensor_takes_a_whole_word(engine):
    """Packed stores touch the 32-bit word of their nibble: even 3 s4 values take 4 bytes."""
    assert lt(0, (3,), "s4").nbytes == 4 and lt(0, (9,), "u4").nbytes == 8
    graph = graph_of(Op(0, "TypeCast", [lt(0, (3,))], [lt(1, (3,), "s4")]))
    out = await run(engine, graph, {0: np.array([-9.0, 2.5, 6.6], np.float32)})
    assert out[1].tolist() == [-8, 2, 7]

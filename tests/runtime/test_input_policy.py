"""One input policy for every entry point that takes host arrays (docs/runtime.md, Inputs): floats round
into float memory, boolean memory takes value != 0, integer memory only values it holds exactly,
anything else
is an ArgumentMismatchError naming the argument and the fix; the same function decides for
``engine.from_numpy``, ``Memory.write``, ``Stream.write``, graph ``Tensor``s and the graph
runner's ``run``, ``map``, ``set_constants`` and constant inputs."""

from __future__ import annotations

import numpy as np
import pytest

import triodnn
from triodnn import ArgumentMismatchError, MemoryDesc, StreamFlags
from triodnn._values._dtypes import convert_input, from_storage, input_dtype_of, to_storage
from triodnn.graph import Graph, LogicalTensor, Op, Tensor, compile_graph

FRACTIONAL = np.array([[1.5, -2.0, 3.0], [4.0, 5.0, 6.0]])    # float64, not exact in an integer
EXACT = np.array([[1.0, -2.0, 3.0], [4.0, 5.0, 127.0]])       # float64 holding s8 values


# -- the policy itself -----------------------------------------------------------------------


@pytest.mark.parametrize("array, dtype, want", [
    (np.array([0.1, 3e38, -2.5]), "f32", np.array([0.1, 3e38, -2.5], np.float32)),
    (np.array([1, 2**24 + 1], np.int64), "f32", np.array([1, 2**24], np.float32)),
    (np.array([True, False]), "f16", np.array([1, 0], np.float16)),
    (np.array([7, -8], np.int64), "s8", np.array([7, -8], np.int8)),
    (np.array([0.0, 255.0]), "u8", np.array([0, 255], np.uint8)),
    (np.array([0, 2, -1], np.int32), "boolean", np.array([False, True, True])),   # value != 0
    (np.array([0.0, np.nan, 0.5]), "boolean", np.array([False, True, True])),
    (np.array([0x3F80], np.uint16), "bf16", np.array([0x3F80], np.uint16)),   # bit patterns
])
def test_conversions_the_policy_makes(array, dtype, want):
    got = convert_input(array, dtype)
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)


def test_float_into_bf16_rounds_like_the_kernels_store():
    x = np.array([1.0 + 2**-8, 1.0 + 3 * 2**-8, -3.140625])   # ties go to even
    np.testing.assert_array_equal(from_storage(convert_input(x, "bf16"), "bf16"),
                                  np.array([1.0, 1.015625, -3.140625], np.float32))


@pytest.mark.parametrize("array, dtype, needle", [
    (np.array([1.5]), "s32", r"integers in \[-2147483648, 2147483647\]"),
    (np.array([np.nan]), "s8", r"integers in \[-128, 127\]"),
    (np.array([np.inf]), "s32", "integers"),
    (np.array([256], np.int64), "u8", r"integers in \[0, 255\]"),
    (np.array([-1], np.int32), "u8", r"integers in \[0, 255\]"),
    (np.array([2**31], np.int64), "s32", r"\[-2147483648, 2147483647\]"),
])
def test_inexact_values_into_integer_memory_are_refused(array, dtype, needle):
    with pytest.raises(ArgumentMismatchError, match=f"src0 .*does not convert exactly to {dtype}.*{needle}"):
        convert_input(array, dtype, "src0")


@pytest.mark.parametrize("array", [np.array([1j]), np.array(["a"]), np.array([object()])])
def test_non_real_arrays_are_refused_everywhere(array):
    for dtype in ("f32", "s32", "boolean"):
        with pytest.raises(ArgumentMismatchError, match=f"numpy dtype {array.dtype}"):
            convert_input(array, dtype)
    with pytest.raises(ArgumentMismatchError, match=f"numpy dtype {array.dtype} has no triodnn"):
        input_dtype_of(array.dtype)


@pytest.mark.parametrize("numpy_dtype, want", [
    (np.float64, "f32"), (np.float32, "f32"), (np.float16, "f16"), (np.int64, "s32"),
    (np.uint16, "s32"), (np.int8, "s8"), (np.uint8, "u8"), (np.bool_, "boolean"),
])
def test_from_numpy_picks_a_data_type_by_kind(numpy_dtype, want):
    assert input_dtype_of(np.dtype(numpy_dtype)) == want


def test_to_storage_stays_the_unchecked_rounding_references_use():
    # References round through storage with it (tests/primitives): it must not start refusing.
    np.testing.assert_array_equal(to_storage(np.array([1.7, -1.7]), "s8"), np.array([1, -1], np.int8))


# -- every entry point applies it --------------------------------------------------------------


async def test_engine_from_numpy_converts_float64_and_int64(engine):
    x = np.linspace(-1, 1, 6).reshape(2, 3)            # float64, numpy's default
    memory = await engine.from_numpy(x)
    assert memory.desc == MemoryDesc((2, 3), "f32")
    np.testing.assert_array_equal(await memory.to_numpy(), x.astype(np.float32))
    ints = await engine.from_numpy(np.arange(6).reshape(3, 2))   # int64
    assert ints.desc == MemoryDesc((3, 2), "s32")
    np.testing.assert_array_equal(await ints.to_numpy(), np.arange(6, dtype=np.int32).reshape(3, 2))
    s8 = await engine.from_numpy(EXACT, MemoryDesc((2, 3), "s8"))
    np.testing.assert_array_equal(await s8.to_numpy(), EXACT.astype(np.int8))


async def test_every_entry_point_refuses_the_same_array_the_same_way(engine):
    """One fractional float64 array against s32 memory: each entry point raises the policy's
    ArgumentMismatchError naming its own argument, and leaves no buffer behind."""
    stream = await engine.stream(StreamFlags.in_order)
    desc = MemoryDesc((2, 3), "s32")
    memory = await engine.from_numpy(np.zeros((2, 3), np.int32))
    lt = LogicalTensor(0, "s32", [2, 3], layout_type="strided")
    runner = await compile_graph(typecast_graph(), engine)
    before = engine.statistics().live_buffers
    message = r"does not convert exactly to s32: its values must be integers"
    complex_ = np.array([[1j] * 3] * 2)
    calls = [
        (r"array for memory s32:2x3:s3:1", message, lambda: engine.from_numpy(FRACTIONAL, desc)),
        (r"array for memory s32:2x3:s3:1", message, lambda: memory.write(FRACTIONAL)),
        (r"array for memory s32:2x3:s3:1", message, lambda: Tensor.from_numpy(lt, engine, FRACTIONAL)),
        (r"inputs\[0\]", message, lambda: runner.run(stream, {0: FRACTIONAL, 2: np.zeros((2, 3))})),
        (r"constants\[0\]", message, lambda: runner.set_constants({0: FRACTIONAL})),
        (r"inputs\[2\]", "numpy dtype complex128", lambda: runner.run(stream, {0: EXACT, 2: complex_})),
    ]
    for who, needle, call in calls:
        with pytest.raises(ArgumentMismatchError, match=f"{who} .*{needle}"):
            await call()
    with pytest.raises(ArgumentMismatchError, match=f"array for memory s32:2x3.* {message}"):
        stream.write(memory, FRACTIONAL)
    assert engine.statistics().live_buffers == before
    assert runner.statistics().runs_started == 0 and runner.constants == {}
    np.testing.assert_array_equal(await memory.to_numpy(), np.zeros((2, 3), np.int32))


def typecast_graph() -> Graph:
    """out 3 = f32(x0: s32) + c2 (f32, constant)."""
    g = Graph("cpu")
    x = LogicalTensor(0, "s32", [2, 3], layout_type="strided")
    y = LogicalTensor(1, "f32", [2, 3], layout_type="strided")
    c = LogicalTensor(2, "f32", [2, 3], layout_type="strided", property_type="constant")
    g.add_op(Op(0, "TypeCast", [x], [y]))
    g.add_op(Op(1, "Add", [y, c], [LogicalTensor(3, "f32", [2, 3], layout_type="strided")]))
    return g


async def test_graph_inputs_convert_through_run_map_constants_and_tensors(engine):
    stream = await engine.stream(StreamFlags.out_of_order)
    runner = await compile_graph(typecast_graph(), engine)
    c = np.array([[0.1, 0.2, 0.3], [0.4, 0.5, 0.6]])          # float64 constant, cached
    want = EXACT.astype(np.float32) + c.astype(np.float32)
    stats0 = triodnn.graph.constant_tensor_cache_statistics(engine)
    for _ in range(2):
        out = await runner.run(stream, {0: EXACT, 2: c})
        np.testing.assert_array_equal(out[3], want)
    stats1 = triodnn.graph.constant_tensor_cache_statistics(engine)
    assert (stats1.misses - stats0.misses, stats1.hits - stats0.hits) == (1, 1)
    async with runner.map([{0: EXACT, 2: c}, {0: EXACT.astype(np.int64), 2: c}], stream=stream) as results:
        got = [out[3] async for out in results]
    for out in got:
        np.testing.assert_array_equal(out, want)
    await runner.set_constants({2: c})
    np.testing.assert_array_equal((await runner.run(stream, {0: EXACT}))[3], want)
    x = await Tensor.from_numpy(runner.inputs[0], engine, EXACT)
    np.testing.assert_array_equal((await runner.run(stream, {0: x}))[3], want)
    stats = runner.statistics()
    assert (stats.runs_started, stats.runs_finished, stats.runs_cancelled) == (6, 6, 0)


async def test_map_refuses_a_bad_request_in_its_place(engine):
    stream = await engine.stream(StreamFlags.in_order)
    runner = await compile_graph(typecast_graph(), engine)
    c = np.ones((2, 3), np.float32)
    got = []
    with pytest.raises(ArgumentMismatchError, match=r"inputs\[0\] \(float64\) does not convert exactly to s32"):
        async with runner.map([{0: EXACT, 2: c}, {0: FRACTIONAL, 2: c}], stream=stream) as results:
            async for out in results:
                got.append(out[3])
    assert len(got) == 1
    np.testing.assert_array_equal(got[0], EXACT.astype(np.float32) + 1)

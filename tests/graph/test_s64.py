"""The s64 data type (oneDNN Graph's dropout seeds and offsets): 8-byte storage, Reorder and
TypeCast to and from the other types (s64 to s64 copies exactly), a clear UnsupportedError
from every op that would compute on it."""

from __future__ import annotations

import numpy as np
import pytest
from _graph_helpers import graph_of, lt, run

from triodnn import ArgumentMismatchError, MemoryDesc, UnsupportedError
from triodnn._values._reorder_desc import ReorderDesc
from triodnn.graph import Op, compile_graph, from_dict, to_dict

BIG = np.array([[1, -2, 2**40 + 1], [-(2**62) - 3, 2**24 + 1, 7]], dtype=np.int64)




def test_s64_logical_tensors_take_eight_bytes_and_round_trip():
    t = lt(0, (2, 3), "s64")
    assert t.nbytes == 48 and t.memory_desc().dtype == "s64"
    graph = graph_of(Op(0, "TypeCast", [t], [lt(1, (2, 3))]))
    assert from_dict(to_dict(graph)).tensor(0).dtype == "s64"


async def test_reorder_and_reshape_copy_s64_exactly(engine):
    graph = graph_of(
        Op(0, "Reorder", [lt(0, (2, 3), "s64")], [lt(1, (2, 3), "s64", (1, 2))]),
        Op(1, "StaticTranspose", [lt(1, (2, 3), "s64", (1, 2))], [lt(2, (3, 2), "s64")], {"order": [1, 0]}),
        Op(2, "StaticReshape", [lt(2, (3, 2), "s64")], [lt(3, (6,), "s64")],
           {"shape": [6], "special_zero": False}),
    )
    out = await run(engine, graph, {0: BIG})
    assert out[3].dtype == np.int64
    np.testing.assert_array_equal(out[3], BIG.T.reshape(-1))


async def test_typecast_to_and_from_s64(engine):
    to_s64 = graph_of(Op(0, "TypeCast", [lt(0, (2, 3))], [lt(1, (2, 3), "s64")]))
    x = np.array([[1.0, -2.5, 3.5], [4e6, -1e12, 0.49]], np.float32)
    out = await run(engine, to_s64, {0: x})
    np.testing.assert_array_equal(out[1], np.rint(x.astype(np.float64)).astype(np.int64))
    from_s64 = graph_of(Op(0, "TypeCast", [lt(0, (2, 3), "s64")], [lt(1, (2, 3), "s32")]),
                        Op(1, "TypeCast", [lt(2, (2, 3), "s64")], [lt(3, (2, 3), "f16")]))
    small = np.array([[1, -2, 3], [4, 2049, -7]], np.int64)  # 2049: f16 rounds it to 2048
    out = await run(engine, from_s64, {0: small, 2: small})
    np.testing.assert_array_equal(out[1], small.astype(np.int32))
    np.testing.assert_array_equal(out[3], small.astype(np.float16))


async def test_primitive_reorder_between_s64_and_s32(engine):
    stream = await engine.stream()
    src = await engine.from_numpy(BIG, MemoryDesc((2, 3), "s64"))
    dst = engine.memory(MemoryDesc((2, 3), "s32"))
    await stream.execute(await engine.create_primitive(ReorderDesc(src.desc, dst.desc)), {"src": src, "dst": dst})
    got = await dst.to_numpy()
    # Through f32 and saturated: 2**40 + 1 is past s32's top, 2**24 + 1 rounds to 2**24.
    np.testing.assert_array_equal(got, [[1, -2, 2**31 - 1], [-(2**31), 2**24, 7]])


async def test_s64_memory_takes_exact_integers_only(engine):
    with pytest.raises(ArgumentMismatchError, match="does not convert exactly to s64"):
        await engine.from_numpy(np.array([0.5]), MemoryDesc((1,), "s64"))


@pytest.mark.parametrize("kind", ["Add", "Multiply"])
async def test_ops_computing_on_s64_are_unsupported(engine, kind):
    graph = graph_of(Op(0, kind, [lt(0, (2, 3), "s64"), lt(1, (2, 3), "s64")], [lt(2, (2, 3), "s64")]))
    with pytest.raises(UnsupportedError, match=f"op 0 \\({kind}\\): s64 tensor\\(s\\) \\[0, 1, 2\\]"):
        await compile_graph(graph, engine)

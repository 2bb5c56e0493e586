"""The Dropout op of oneDNN's Graph API: seed, offset and probability as host scalars (a number
per execution) or device tensors, the optional u8 mask output, probabilities 0 and near 1, the
fusion into the attention partition, the driver's filling and the typed errors of bad graphs."""

from __future__ import annotations

import numpy as np
import pytest
from _graph_helpers import graph_of, lt, run

from triodnn import InvalidArgumentError, InvalidGraphError, ShapeInferenceError, StreamFlags
from triodnn.graph import LogicalTensor, Op, Tensor
from triodnn.graph._shape_inference import infer_output_shapes
from triodnn.kernels import dropout
from triodnn.testing import make_inputs
from triodnn.testing._reference import reference

SHAPE = (2, 3, 17)


def _scalars(prop: str):
    return [LogicalTensor(i, dtype, (), layout_type="strided", property_type=prop)
            for i, dtype in ((1, "s64"), (2, "s64"), (3, "f32"))]


def _dropout_graph(prop: str = "undef", mask: bool = True, dtype: str = "f32"):
    outputs = [lt(4, SHAPE, dtype)] + ([lt(5, SHAPE, "u8")] if mask else [])
    return graph_of(Op(0, "Dropout", [lt(0, SHAPE, dtype), *_scalars(prop)], outputs))


def _inputs(rng, seed, offset, p):
    src = rng.integers(-4, 5, SHAPE).astype(np.float32)
    return {0: src, 1: np.array(seed, np.int64), 2: np.array(offset, np.int64), 3: np.array(p, np.float32)}


@pytest.mark.parametrize("prop", ["undef", "host_scalar"])
@pytest.mark.parametrize(("seed", "offset", "p"), [(42, 7, 0.5), (-3, 0, 0.3), (2**40 + 1, 2**33, 0.9)])
async def test_dst_and_mask_are_onednns(engine, rng, prop, seed, offset, p):
    graph = _dropout_graph(prop)
    arrays = _inputs(rng, seed, offset, p)
    got = await run(engine, graph, arrays)
    want_dst, want_mask = reference("Dropout", {}, list(arrays.values()), ["f32", "u8"])
    np.testing.assert_array_equal(got[5], want_mask)
    np.testing.assert_array_equal(got[5], dropout.keep_mask(SHAPE, seed, offset, p))
    np.testing.assert_allclose(got[4], want_dst, rtol=1e-6, atol=0)


async def test_a_compiled_partition_takes_a_new_seed_per_execution(engine, rng):
    graph = _dropout_graph("host_scalar", mask=True)
    (partition,) = graph.get_partitions()
    compiled = await partition.compile(engine)
    stream = await engine.stream(StreamFlags.in_order)
    src = rng.integers(-4, 5, SHAPE).astype(np.float32)
    x = await Tensor.from_numpy(compiled.inputs[0], engine, src)
    dst, mask = Tensor(compiled.outputs[0], engine), Tensor(compiled.outputs[1], engine)
    masks = []
    for seed in (1, 2):
        await compiled.execute(stream, [x, seed, 5, 0.5], [dst, mask])
        masks.append(await mask.to_numpy())
        np.testing.assert_array_equal(masks[-1], dropout.keep_mask(SHAPE, seed, 5, 0.5))
    assert (masks[0] != masks[1]).any()


async def test_probability_zero_keeps_all_and_near_one_drops_almost_all(engine, rng):
    graph = _dropout_graph("host_scalar")
    arrays = _inputs(rng, 9, 3, 0.0)
    got = await run(engine, graph, arrays)
    np.testing.assert_array_equal(got[4], arrays[0])  # every word but 0 is kept, 1 / (1 - 0) is 1
    assert got[5].all()
    near_one = float(np.nextafter(np.float32(1), np.float32(0)))
    got = await run(engine, graph, {**arrays, 3: np.array(near_one, np.float32)})
    np.testing.assert_array_equal(got[5], dropout.keep_mask(SHAPE, 9, 3, near_one))
    assert got[5].sum() <= 1
    got = await run(engine, graph, {**arrays, 3: np.array(1.0, np.float32)})
    assert not got[5].any() and not got[4].any()


@pytest.mark.parametrize("dtype", ["bf16", "f16"])
async def test_narrow_data_without_mask(engine, rng, dtype):
    graph = _dropout_graph("undef", mask=False, dtype=dtype)
    arrays = _inputs(rng, 5, 6, 0.75)
    got = await run(engine, graph, arrays)
    (want,) = reference("Dropout", {}, list(arrays.values()), [dtype])
    np.testing.assert_array_equal(np.asarray(got[4], np.float64), want)  # integers times 4: exact


def test_dropout_fuses_into_the_attention_partition():
    q, k, v = lt(10, (1, 4, 8)), lt(11, (1, 8, 4)), lt(12, (1, 4, 8))
    s, p, d, o = lt(13, (1, 4, 4)), lt(14, (1, 4, 4)), lt(15, (1, 4, 4)), lt(16, (1, 4, 8))
    graph = graph_of(
        Op(0, "MatMul", [q, k], [s]),
        Op(1, "SoftMax", [s], [p], {"axis": -1}),
        Op(2, "Dropout", [p, *_scalars("host_scalar")], [d]),
        Op(3, "MatMul", [d, v], [o]),
    )
    (partition,) = graph.get_partitions()
    assert partition.is_supported and partition.op_kinds == ("MatMul", "SoftMax", "Dropout", "MatMul")


def test_the_driver_fills_a_probability_in_range():
    arrays = make_inputs(_dropout_graph("host_scalar"), seed=3)
    assert float(arrays[3]) in (0.5, 0.75)
    assert arrays[1].dtype == np.int64 and arrays[2].dtype == np.int64


def test_shapes_and_typed_errors():
    assert infer_output_shapes("Dropout", {}, [SHAPE, (), (), (1,)], 2) == [SHAPE, SHAPE]
    with pytest.raises(ShapeInferenceError, match="seed holds one value"):
        infer_output_shapes("Dropout", {}, [SHAPE, (2,), (), ()])
    with pytest.raises(InvalidGraphError):
        infer_output_shapes("Dropout", {}, [SHAPE, (), ()])  # probability missing
    with pytest.raises(InvalidGraphError):
        infer_output_shapes("Dropout", {"p": 0.5}, [SHAPE, (), (), ()])  # Dropout has no attributes


async def test_a_seed_of_the_wrong_type_is_refused(engine):
    graph = graph_of(Op(0, "Dropout", [lt(0, SHAPE), lt(1, (), "s32"), lt(2, (), "s64"), lt(3, ())],
                        [lt(4, SHAPE)]))
    (partition,) = graph.get_partitions()
    with pytest.raises(InvalidArgumentError, match="seed and offset must be s64, got 's32'"):
        await partition.compile(engine)

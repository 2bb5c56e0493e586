"""Host scalars (``property_type`` ``host_scalar``): logical tensors whose one value the host
passes at each execution, as a Python or numpy number (or a Tensor), through
``CompiledPartition.execute`` and ``GraphRunner.run``; the benchdnn driver fills the offsets of
bottom-right causal masks with the sequence lengths, as benchdnn's graph driver does."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from _shared import GRAPHS, require

from triodnn import ArgumentMismatchError, InvalidArgumentError, StreamFlags
from triodnn.graph import Graph, LogicalTensor, Op, Tensor, compile_graph, from_dict, load, to_dict
from triodnn.testing import make_inputs

ROOT = Path(__file__).resolve().parents[2]
SHARED = GRAPHS / "benchdnn"
BOTTOM_RIGHT = SHARED / "complex_fusion" / "mha" / "sdpa-plain-bottom-right-implicit-causal-mask-f16-f32.json"


def _scaled_graph(dtype="f32", scalar_shape=()):
    """dst = x * s + y, ``s`` a host scalar."""
    x = LogicalTensor(0, dtype, (2, 3), layout_type="strided")
    s = LogicalTensor(1, dtype, scalar_shape, layout_type="strided", property_type="host_scalar")
    xs = LogicalTensor(2, dtype, (2, 3), layout_type="strided")
    y = LogicalTensor(3, dtype, (2, 3), layout_type="strided")
    dst = LogicalTensor(4, dtype, (2, 3), layout_type="strided")
    graph = Graph("cpu")
    graph.add_op(Op(0, "Multiply", [x, s], [xs]))
    graph.add_op(Op(1, "Add", [xs, y], [dst]))
    graph.finalize()
    return graph


def test_host_scalar_is_a_property_type_and_round_trips_through_json():
    graph = _scaled_graph()
    (partition,) = graph.get_partitions()
    assert [lt.id for lt in partition.input_ports] == [0, 1, 3]
    assert partition.input_ports[1].property_type == "host_scalar"
    again = from_dict(to_dict(graph))
    assert again.tensor(1).property_type == "host_scalar"


def test_a_host_scalar_of_more_than_one_value_is_refused():
    with pytest.raises(InvalidArgumentError, match="host_scalar holds one value"):
        LogicalTensor(1, "f32", (2,), property_type="host_scalar")
    assert LogicalTensor(1, "f32", (1, 1), property_type="host_scalar").numel == 1


@pytest.mark.parametrize("value", [0.5, np.float32(0.5), np.array(0.5), np.array([0.5])])
async def test_execute_takes_a_number_for_a_host_scalar(engine, value):
    graph = _scaled_graph()
    (partition,) = graph.get_partitions()
    compiled = await partition.compile(engine)
    stream = await engine.stream(StreamFlags.in_order)
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    y = np.full((2, 3), 1.0, np.float32)
    ins = [await Tensor.from_numpy(compiled.inputs[0], engine, x), value,
           await Tensor.from_numpy(compiled.inputs[2], engine, y)]
    out = Tensor(compiled.outputs[0], engine)
    live = engine.statistics().live_buffers
    await compiled.execute(stream, ins, [out])
    np.testing.assert_array_equal(await out.to_numpy(), x * 0.5 + y)
    # By id, a second value: each execution writes its own buffer, freed once it is done.
    by_id = {0: ins[0], 1: 4, 3: ins[2]}
    await compiled.execute(stream, by_id, [out])
    np.testing.assert_array_equal(await out.to_numpy(), x * 4 + y)
    await stream.wait()
    assert engine.statistics().live_buffers == live


async def test_execute_takes_a_tensor_for_a_host_scalar(engine):
    graph = _scaled_graph(scalar_shape=(1,))
    (partition,) = graph.get_partitions()
    compiled = await partition.compile(engine)
    stream = await engine.stream(StreamFlags.in_order)
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    ins = [await Tensor.from_numpy(compiled.inputs[0], engine, x),
           await Tensor.from_numpy(compiled.inputs[1], engine, np.array([2.0])),
           await Tensor.from_numpy(compiled.inputs[2], engine, x)]
    out = Tensor(compiled.outputs[0], engine)
    await compiled.execute(stream, ins, [out])
    np.testing.assert_array_equal(await out.to_numpy(), 3 * x)


async def test_host_scalar_values_that_do_not_fit_are_refused(engine):
    graph = _scaled_graph(dtype="s32")
    (partition,) = graph.get_partitions()
    compiled = await partition.compile(engine)
    stream = await engine.stream(StreamFlags.in_order)
    x = np.arange(6, dtype=np.int32).reshape(2, 3)
    t0 = await Tensor.from_numpy(compiled.inputs[0], engine, x)
    t3 = await Tensor.from_numpy(compiled.inputs[2], engine, x)
    out = Tensor(compiled.outputs[0], engine)
    live = engine.statistics().live_buffers
    with pytest.raises(ArgumentMismatchError, match="host scalar 1 takes one number"):
        compiled.execute(stream, [t0, [1, 2], t3], [out])
    with pytest.raises(ArgumentMismatchError):  # s32 takes exact integers only
        compiled.execute(stream, [t0, 0.5, t3], [out])
    assert engine.statistics().live_buffers == live
    await compiled.execute(stream, [t0, -2, t3], [out])
    np.testing.assert_array_equal(await out.to_numpy(), x * -2 + x)


async def test_graph_runner_takes_numbers_for_host_scalars(engine):
    runner = await compile_graph(_scaled_graph(), engine)
    stream = await engine.stream(StreamFlags.in_order)
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    for value in (0.25, np.array([2.0]), np.float32(-1)):
        out = await runner.run(stream, {0: x, 1: value, 3: x})
        np.testing.assert_array_equal(out[4], x * np.float32(np.asarray(value).item()) + x)
    with pytest.raises(ArgumentMismatchError):
        await runner.run(stream, {0: x, 1: np.ones(2), 3: x})


def test_driver_fills_bottom_right_causal_offsets_with_sequence_lengths():
    require(BOTTOM_RIGHT)
    graph = load(BOTTOM_RIGHT)
    assert {graph.tensor(10).property_type, graph.tensor(13).property_type} == {"host_scalar"}
    arrays = make_inputs(graph)
    # Add's offset is Skv (the scores' last dim), Subtract's Sq (dim -2): 384 both here.
    assert arrays[10].dtype == np.int32 and arrays[10].item() == 384
    assert arrays[13].item() == 384


async def test_bottom_right_causal_mask_runs_with_host_scalars(engine):
    """A small bottom-right causal mask (Sq 4 < Skv 6): row i sees keys up to i + 2."""
    require(BOTTOM_RIGHT)
    import json

    from triodnn.testing import run_benchdnn
    from triodnn.testing._benchdnn import Run

    result = await run_benchdnn(Run(BOTTOM_RIGHT.name, BOTTOM_RIGHT,
                                    in_shapes="0:1x2x4x8+1:1x2x6x8+24:1x2x6x8"), engine=engine)
    assert result.status == "PASSED", result.message
    # The mask the offsets make, computed by the reference: a lower band shifted by Skv - Sq.
    from triodnn.testing._benchdnn import rewrite
    from triodnn.testing._driver import make_inputs as fill
    from triodnn.testing._driver import reference_outputs

    document = rewrite(json.loads(BOTTOM_RIGHT.read_text()),
                       Run(BOTTOM_RIGHT.name, BOTTOM_RIGHT, in_shapes="0:1x2x4x8+1:1x2x6x8+24:1x2x6x8"))
    graph = from_dict(document)
    arrays = fill(graph)
    assert (arrays[10].item(), arrays[13].item()) == (6, 4)
    values, _ = reference_outputs(graph, arrays)
    keep = values[18][0, 0]
    assert keep.tolist() == [[j <= i + 2 for j in range(6)] for i in range(4)]

"""Messages users tripped on, each now naming the culprit and the fix: errors printed under their
public names, which request of a ``map`` failed, a read after the runtime closed, a wrapped
object used inside the portal's own run, a graph tensor without a shape."""

from __future__ import annotations

import inspect
import pickle
import traceback

import numpy as np
import pytest

import triodnn
from triodnn import ClosedError, InvalidGraphError, MemoryDesc, MissingArgumentError, StreamFlags, WrongThreadError
from triodnn.graph import Graph, LogicalTensor, Op, compile_graph, from_dict


def _relu_graph() -> Graph:
    graph = Graph("cpu")
    graph.add_op(Op(0, "Add", [LogicalTensor(0, "f32", (4,)), LogicalTensor(1, "f32", (4,))],
                    [LogicalTensor(2, "f32", (4,))], {}))
    graph.finalize()
    return graph


def test_errors_print_under_their_public_names():
    errors = [c for _, c in inspect.getmembers(triodnn, inspect.isclass)
              if issubclass(c, (triodnn.TriodnnError, triodnn.UnusableDeviceWarning))]
    assert len(errors) == 20
    for error in errors:
        assert error.__module__ == "triodnn" and getattr(triodnn, error.__name__) is error
        assert type(pickle.loads(pickle.dumps(error("why")))) is error  # Dask sends them between processes
        if issubclass(error, triodnn.TriodnnError):
            # Reduced by calling the class: tblib (Dask installs it for every exception class)
            # rebuilds one without a __reduce__ by cls.__new__, which MemoryError refuses.
            assert error("why").__reduce__()[:2] == (error, ("why",))
    with pytest.raises(triodnn.InvalidArgumentError) as info:
        triodnn.EltwiseDesc("nope", MemoryDesc((2,)))
    assert traceback.format_exception_only(info.type, info.value)[-1].startswith("triodnn.InvalidArgumentError: alg 'nope'")


async def test_a_failing_map_request_says_which_it_was(engine):
    runner = await compile_graph(_relu_graph(), engine)
    stream = await engine.stream(StreamFlags.in_order)
    x = np.ones(4, np.float32)
    got = []
    with pytest.raises(MissingArgumentError, match=r"inputs lack graph input ids \[1\]") as info:
        async with runner.map([{0: x, 1: x}, {0: x, 1: x}, {0: x}, {0: x, 1: x}], stream=stream) as results:
            async for outputs in results:
                got.append(outputs[2])
    assert info.value.__notes__ == ["raised by request 2 of the map's inputs (counting from 0)"]
    assert len(got) == 2


async def test_memory_read_after_its_runtime_closed_says_so():
    async with triodnn.open_runtime() as rt:
        engine = await rt.engine()  # the default engine: TRIODNN_ENGINE's where set
        memory = await engine.from_numpy(np.ones((2, 3), np.float32), MemoryDesc((2, 3)))
    with pytest.raises(ClosedError, match=rf"cannot read memory \[2, 3\] f32 of {engine.kind}:{engine.index} "
                                          r".*its runtime has shut down"):
        await memory.to_numpy()
    with pytest.raises(ClosedError, match=r"cannot write memory \[2, 3\] f32 .*its runtime has shut down"):
        await memory.write(np.zeros((2, 3), np.float32))


def test_a_wrapped_object_inside_the_portals_own_run_is_told_to_pass_it_in():
    with triodnn.BlockingPortal() as portal:
        engine = portal.runtime.engine()
        runner = portal.run(compile_graph, _relu_graph(), engine)
        stream = engine.stream()
        x = np.arange(4, dtype=np.float32)

        async def captured():
            return await runner.run(stream, {0: x, 1: x})

        with pytest.raises(WrongThreadError, match=r"pass the wrapped object as an argument instead, portal.run\(fn, "):
            portal.run(captured)

        async def handed(runner, stream):
            return await runner.run(stream, {0: x, 1: x})

        np.testing.assert_array_equal(portal.run(handed, runner, stream)[2], 2 * x)


def test_a_graph_tensor_without_a_shape_is_told_how_to_write_one():
    document = {"graph": [{"id": 0, "kind": "ReLU", "attrs": {},
                           "inputs": [{"id": 0, "dtype": "f32"}],
                           "outputs": [{"id": 1, "dtype": "f32", "shape": [4]}]}]}
    with pytest.raises(InvalidGraphError, match=r"lacks 'shape': write its dims \(-1 for a dim known only at run "
                                                r"time\), or null where even the rank is unknown") as info:
        from_dict(document)
    assert "9223372036854775808" not in str(info.value)

"""The Graph API: logical tensors, ops, graphs, partitions, compiled partitions, tensors, JSON."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from conftest import in_a_thread, in_another_trio_run

import triodnn
from triodnn import InvalidArgumentError, InvalidGraphError, ShapeInferenceError, StreamFlags
from triodnn.graph import ROW_MAJOR, DynamicGraphRunner, Graph, LogicalTensor, Op, Tensor, compile_graph, from_dict, load, to_dict

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "graphs"


def f32(i, shape, **kw):
    return LogicalTensor(i, "f32", shape, layout_type=kw.pop("layout_type", "strided"), **kw)


def mlp_graph(n=8, c=16, o=12, fpmath_mode="strict") -> Graph:
    x, w, b = f32(0, [n, c]), f32(1, [c, o], property_type="constant"), f32(2, [o])
    h, hb, y = f32(3, [n, o]), f32(4, [n, o]), f32(5, [n, o])
    g = Graph("cpu", fpmath_mode)
    g.add_op(Op(0, "MatMul", [x, w], [h]))
    g.add_op(Op(1, "BiasAdd", [h, b], [hb]))
    g.add_op(Op(2, "ReLU", [hb], [y]))
    return g


def ints(rng, shape):
    return rng.integers(-4, 5, shape).astype(np.float32)


# -- logical tensors --------------------------------------------------------------------------


def test_logical_tensor_strided_defaults_to_dense_strides():
    lt = LogicalTensor(3, "f32", [2, 3, 4], layout_type="strided")
    assert lt.strides == (12, 4, 1)
    assert lt.nbytes == 96
    assert lt == LogicalTensor(3, "f32", (2, 3, 4), (12, 4, 1))


def test_logical_tensor_unknown_dims_and_rank():
    lt = LogicalTensor(1, "f32", [-(2**63), 4])
    assert lt.shape == (-1, 4) and not lt.is_shape_known and lt.nbytes == 0
    assert LogicalTensor(2, "bf16").ndims == -1


@pytest.mark.parametrize("kwargs, needle", [
    ({"dtype": "f64"}, "dtype 'f64'"),
    ({"layout_type": "blocked"}, "layout_type 'blocked'"),
    ({"property_type": "mutable"}, "property_type 'mutable'"),
    ({"layout_type": "opaque"}, "layout_id"),
    ({"shape": [2, -3]}, "negative dim -3"),
    ({"shape": [2, 3], "strides": [1]}, "different lengths"),
])
def test_logical_tensor_bad_fields_name_the_field(kwargs, needle):
    with pytest.raises(InvalidArgumentError, match=needle):
        LogicalTensor(0, **kwargs)


def test_same_layout_and_dtype():
    a = LogicalTensor(0, "f32", [2, 3], layout_type="strided")
    assert a.has_same_layout_and_dtype(LogicalTensor(9, "f32", [2, 3], layout_type="strided"))
    assert not a.has_same_layout_and_dtype(LogicalTensor(9, "f32", [2, 3], [1, 2]))
    assert not a.has_same_layout_and_dtype(LogicalTensor(9, "bf16", [2, 3], layout_type="strided"))


# -- building graphs ----------------------------------------------------------------------------


def test_add_op_checks_and_leaves_nothing_behind():
    g = mlp_graph()
    n_ops = len(g.ops)
    with pytest.raises(InvalidGraphError, match="op id 1"):
        g.add_op(Op(1, "ReLU", [f32(5, [8, 12])], [f32(6, [8, 12])]))
    with pytest.raises(InvalidGraphError, match="logical tensor 5 is f32 \\[8, 13\\]"):
        g.add_op(Op(7, "ReLU", [f32(5, [8, 13])], [f32(6, [8, 13])]))
    with pytest.raises(InvalidGraphError, match="already produces"):
        g.add_op(Op(8, "Tanh", [f32(0, [8, 16])], [f32(5, [8, 12])]))
    with pytest.raises(InvalidGraphError, match="Frobnicate"):
        g.add_op(Op(9, "Frobnicate", [f32(5, [8, 12])], [f32(6, [8, 12])]))
    with pytest.raises(InvalidGraphError, match="flavour"):
        g.add_op(Op(10, "ReLU", [f32(5, [8, 12])], [f32(6, [8, 12])], {"flavour": 1}))
    with pytest.raises(InvalidGraphError, match="axis"):
        g.add_op(Op(11, "SoftMax", [f32(5, [8, 12])], [f32(6, [8, 12])], {"axis": "last"}))
    assert len(g.ops) == n_ops
    # The rejected ops left no tensor behind: id 6 can still be anything.
    g.add_op(Op(12, "Exp", [f32(5, [8, 12])], [LogicalTensor(6, "f32", [8, 12], layout_type="any")]))


def test_cycle_is_reported_at_finalize():
    g = Graph("cpu")
    g.add_op(Op(0, "ReLU", [f32(1, [4])], [f32(2, [4])]))
    g.add_op(Op(1, "Tanh", [f32(2, [4])], [f32(1, [4])]))
    with pytest.raises(InvalidGraphError, match="cycle"):
        g.finalize()


def test_no_ops_after_partitioning():
    g = mlp_graph()
    g.get_partitions()
    with pytest.raises(InvalidGraphError, match="after get_partitions"):
        g.add_op(Op(9, "Exp", [f32(5, [8, 12])], [f32(6, [8, 12])]))


def test_bad_policy_and_engine_kind():
    with pytest.raises(InvalidGraphError, match="policy 'greedy'"):
        mlp_graph().get_partitions("greedy")
    with pytest.raises(InvalidGraphError, match="engine_kind 'tpu'"):
        Graph("tpu")


# -- partitions -------------------------------------------------------------------------------


def test_fusion_and_debug_partitions_of_an_mlp():
    fused = mlp_graph().get_partitions("fusion")
    assert [p.op_kinds for p in fused] == [("MatMul", "BiasAdd", "ReLU")]
    p = fused[0]
    assert [lt.id for lt in p.input_ports] == [0, 1, 2] and [lt.id for lt in p.output_ports] == [5]
    debug = mlp_graph().get_partitions("debug")
    assert [p.op_kinds for p in debug] == [("MatMul",), ("BiasAdd",), ("ReLU",)]
    assert [[lt.id for lt in p.output_ports] for p in debug] == [[3], [4], [5]]


def test_independent_chains_are_separate_partitions():
    g = Graph("cpu")
    g.add_op(Op(0, "ReLU", [f32(0, [4])], [f32(1, [4])]))
    g.add_op(Op(1, "Exp", [f32(1, [4])], [f32(2, [4])]))
    g.add_op(Op(2, "Tanh", [f32(10, [4])], [f32(11, [4])]))
    parts = g.get_partitions()
    assert sorted(p.op_kinds for p in parts) == [("ReLU", "Exp"), ("Tanh",)]


def test_fusion_never_makes_a_cycle_through_an_unsupported_op():
    """relu -> wildcard -> add, and relu -> add: merging relu and add would wrap the wildcard."""
    g = Graph("cpu")
    g.add_op(Op(0, "ReLU", [f32(0, [4])], [f32(1, [4])]))
    g.add_op(Op(1, "Wildcard", [f32(1, [4])], [f32(2, [4])]))
    g.add_op(Op(2, "Add", [f32(1, [4]), f32(2, [4])], [f32(3, [4])]))
    parts = g.get_partitions()
    assert [(p.op_kinds, p.is_supported) for p in parts] == [
        (("ReLU",), True), (("Wildcard",), False), (("Add",), True)]


async def test_unsupported_partition_refuses_to_compile(engine):
    g = Graph("cpu")
    g.add_op(Op(0, "Wildcard", [f32(0, [4])], [f32(1, [4])]))
    (p,) = g.get_partitions()
    with pytest.raises(triodnn.UnsupportedError, match="not supported"):
        await p.compile(engine)


def test_end_ops_mark_outputs_and_are_not_partitioned():
    g = Graph("cpu")
    g.add_op(Op(0, "ReLU", [f32(0, [4])], [f32(1, [4])]))
    g.add_op(Op(1, "Exp", [f32(1, [4])], [f32(2, [4])]))
    g.add_op(Op(2, "End", [f32(1, [4])], []))
    (p,) = g.get_partitions()
    assert p.op_kinds == ("ReLU", "Exp") and [lt.id for lt in p.output_ports] == [1, 2]


# -- compile and execute ----------------------------------------------------------------------


async def test_mlp_compiles_and_matches_numpy(engine, rng):
    (p,) = mlp_graph().get_partitions()
    cp = await p.compile(engine)
    x, w, b = ints(rng, (8, 16)), ints(rng, (16, 12)), ints(rng, (12,))
    ins = [await Tensor.from_numpy(lt, engine, a) for lt, a in zip(cp.inputs, (x, w, b))]
    (out,) = [Tensor(lt, engine) for lt in cp.outputs]
    stream = await engine.stream()
    await cp.execute(stream, ins, [out])
    np.testing.assert_array_equal(await out.to_numpy(), np.maximum(x @ w + b, 0))


@pytest.mark.parametrize("mode", ["strict", "tf32", "any"])
async def test_the_graphs_fpmath_mode_reaches_its_matmuls(engine, rng, mode):
    """oneDNN's fpmath mode travels from the graph to each MatMul's descriptor, where a kernel
    may take the down-conversion it allows (TF32 on NVIDIA tensor cores); small integers are
    exact in TF32, so the result is the f32 one whatever kernel ran."""
    (p,) = mlp_graph(fpmath_mode=mode).get_partitions()
    cp = await p.compile(engine)
    assert [prim.desc.fpmath for prim in cp.primitives if prim.kind == "matmul"] == [mode]
    x, w, b = ints(rng, (8, 16)), ints(rng, (16, 12)), ints(rng, (12,))
    ins = [await Tensor.from_numpy(lt, engine, a) for lt, a in zip(cp.inputs, (x, w, b))]
    (out,) = [Tensor(lt, engine) for lt in cp.outputs]
    await cp.execute(await engine.stream(), ins, [out])
    np.testing.assert_array_equal(await out.to_numpy(), np.maximum(x @ w + b, 0))


async def test_any_layout_becomes_opaque_and_unknown_dims_are_inferred(engine, rng):
    x = f32(0, [2, 3, 8])
    y = LogicalTensor(1, "f32", [-1, -1, -1], layout_type="any")
    g = Graph("cpu")
    g.add_op(Op(0, "StaticTranspose", [x], [y], {"order": [2, 0, 1]}))
    (p,) = g.get_partitions()
    assert p.infer_shape()[0].shape == (8, 2, 3)
    cp = await p.compile(engine)
    out_lt = cp.query_logical_tensor(1)
    assert (out_lt.layout_type, out_lt.layout_id, out_lt.shape) == ("opaque", ROW_MAJOR, (8, 2, 3))
    data = ints(rng, (2, 3, 8))
    src = await Tensor.from_numpy(cp.inputs[0], engine, data)
    dst = Tensor(out_lt, engine)
    await cp.execute(await engine.stream(), [src], [dst])
    np.testing.assert_array_equal(await dst.to_numpy(), data.transpose(2, 0, 1))
    with pytest.raises(InvalidArgumentError, match="not a port"):
        cp.query_logical_tensor(7)


async def test_opaque_input_from_another_library_is_refused(engine):
    g = Graph("cpu")
    g.add_op(Op(0, "ReLU", [f32(0, [4])], [f32(1, [4])]))
    (p,) = g.get_partitions()
    foreign = LogicalTensor(0, "f32", [4], layout_type="opaque", layout_id=77)
    with pytest.raises(InvalidArgumentError, match="layout_id 77"):
        await p.compile(engine, [foreign], None)


async def test_compile_checks_ports_and_shapes(engine):
    (p,) = mlp_graph().get_partitions()
    with pytest.raises(InvalidArgumentError, match="lack logical tensor ids \\[2\\]"):
        await p.compile(engine, [f32(0, [8, 16]), f32(1, [16, 12])], None)
    with pytest.raises(ShapeInferenceError):
        await p.compile(engine, [f32(0, [8, 15]), f32(1, [16, 12]), f32(2, [12])], None)
    unknown = LogicalTensor(0, "f32", [-1, 16], layout_type="strided")
    with pytest.raises(ShapeInferenceError, match="input logical tensor 0"):
        await p.compile(engine, [unknown, f32(1, [16, 12]), f32(2, [12])], None)


def misdeclared(case: str) -> Graph:
    """A graph whose declared output shape its inputs contradict: a dim, the rank, or a
    tensor inside a fused partition."""
    g = Graph("cpu")
    if case == "dim":
        g.add_op(Op(0, "MatMul", [f32(0, [2, 3]), f32(1, [3, 5])], [f32(2, [2, 7])]))
    elif case == "rank":
        g.add_op(Op(0, "Add", [f32(0, [2, 3]), f32(1, [2, 3])], [f32(2, [6])]))
    else:  # "inside": the MatMul's output never leaves its partition
        g.add_op(Op(0, "MatMul", [f32(0, [2, 3]), f32(1, [3, 5])], [f32(2, [2, 7])]))
        g.add_op(Op(1, "ReLU", [f32(2, [2, 7])], [f32(3, [2, 5])]))
    return g


MISDECLARED = {
    "dim": "op 0 (MatMul): output logical tensor 2 is declared [2, 7] but its inputs [[2, 3], [3, 5]] give [2, 5]",
    "rank": "op 0 (Add): output logical tensor 2 is declared [6] but its inputs [[2, 3], [2, 3]] give [2, 3]",
    "inside": "op 0 (MatMul): output logical tensor 2 is declared [2, 7] but its inputs [[2, 3], [3, 5]] give [2, 5]",
}


@pytest.mark.parametrize("path", ["partition.compile", "compile_graph"])
@pytest.mark.parametrize("case", list(MISDECLARED))
async def test_a_declared_output_shape_its_inputs_contradict_is_refused(engine, case, path):
    g = misdeclared(case)
    before = triodnn.graph.compiled_partition_cache_statistics(), triodnn.primitive_cache_statistics()
    with pytest.raises(ShapeInferenceError) as caught:
        if path == "compile_graph":
            await compile_graph(g, engine)
        else:
            (p,) = g.get_partitions()
            await p.compile(engine)
    assert str(caught.value) == MISDECLARED[case]
    # Refused before any lookup or compile: neither cache saw it.
    assert (triodnn.graph.compiled_partition_cache_statistics(), triodnn.primitive_cache_statistics()) == before


async def test_a_contradicted_declaration_behind_an_unknown_input_dim_is_refused_at_first_run(engine):
    g = Graph("cpu")
    g.add_op(Op(0, "MatMul", [f32(0, [-1, 3]), f32(1, [3, 5])], [f32(2, [-1, 7])]))
    runner = await compile_graph(g, engine)
    assert isinstance(runner, DynamicGraphRunner)
    arrays = {0: np.ones((4, 3), np.float32), 1: np.ones((3, 5), np.float32)}
    with pytest.raises(ShapeInferenceError, match=r"^op 0 \(MatMul\): output logical tensor 2 is declared \[-1, 7\] "
                       r"but its inputs \[\[4, 3\], \[3, 5\]\] give \[4, 5\]$"):
        await runner.run(await engine.stream(), arrays)
    assert runner.statistics().compiled_shapes == 0


@pytest.mark.parametrize("declared", [[-1, -1], [2, -1], [-1, 5], None, [-1]], ids=str)
async def test_unknown_declared_output_dims_are_inferred_on_both_paths(engine, rng, declared):
    """-1 dims and an unknown rank take the inferred shape; so does a lone -1, oneDNN's way of
    writing an unknown rank."""
    g = Graph("cpu")
    g.add_op(Op(0, "MatMul", [f32(0, [2, 3]), f32(1, [3, 5])], [f32(2, declared)]))
    (p,) = g.get_partitions()
    assert (await p.compile(engine)).query_logical_tensor(2).shape == (2, 5)
    x, w = ints(rng, (2, 3)), ints(rng, (3, 5))
    out = await (await compile_graph(g, engine)).run(await engine.stream(), {0: x, 1: w})
    np.testing.assert_array_equal(out[2], x @ w)


async def test_compile_graph_with_new_input_shapes_reinfers_past_the_declared_ones(engine, rng):
    """New input shapes make the graph's declared downstream shapes stale, not wrong."""
    runner = await compile_graph(mlp_graph(), engine, inputs=[f32(0, [3, 16])])
    x, w, b = ints(rng, (3, 16)), ints(rng, (16, 12)), ints(rng, (12,))
    out = await runner.run(await engine.stream(), {0: x, 1: w, 2: b})
    np.testing.assert_array_equal(out[5], np.maximum(x @ w + b, 0))


async def test_new_input_shapes_at_compile_time(engine, rng):
    (p,) = mlp_graph().get_partitions()
    cp = await p.compile(engine, [f32(0, [3, 16]), f32(1, [16, 5]), f32(2, [5])], None)
    out_lt = cp.query_logical_tensor(5)
    assert (out_lt.shape, out_lt.strides) == ((3, 5), (5, 1))
    x, w, b = ints(rng, (3, 16)), ints(rng, (16, 5)), ints(rng, (5,))
    ins = [await Tensor.from_numpy(lt, engine, a) for lt, a in zip(cp.inputs, (x, w, b))]
    out = Tensor(cp.outputs[0], engine)
    await cp.execute(await engine.stream(), ins, [out])
    np.testing.assert_array_equal(await out.to_numpy(), np.maximum(x @ w + b, 0))


async def test_execute_checks_tensors(engine, rng):
    (p,) = mlp_graph().get_partitions()
    cp = await p.compile(engine)
    ins = [Tensor(lt, engine) for lt in cp.inputs]
    out = Tensor(cp.outputs[0], engine)
    stream = await engine.stream()
    with pytest.raises(InvalidArgumentError, match="lack a tensor for logical tensor 2"):
        cp.execute(stream, ins[:2], [out])
    wrong = Tensor(f32(2, [13]), engine)
    with pytest.raises(triodnn.ArgumentMismatchError, match="logical tensor 2"):
        cp.execute(stream, ins[:2] + [wrong], [out])
    with pytest.raises(InvalidArgumentError, match="not its ports"):
        cp.execute(stream, ins + [Tensor(f32(9, [1]), engine)], [out])


async def test_compile_and_execute_from_another_thread_are_refused_and_the_partition_runs_on(engine, rng):
    """Compiling goes through the runtime's compiled-partition cache actor, and a compiled
    partition submits its run as one record to the stream's actor; both belong to the runtime's
    trio run: from another thread each is a WrongThreadError, and the partition still compiles
    and runs in its own run."""
    (p,) = mlp_graph().get_partitions()
    how, error = in_another_trio_run(p.compile, engine)
    assert how == "raised" and isinstance(error, triodnn.WrongThreadError), (how, error)
    assert f"partition {p.id}: compiled for engine {engine}" in str(error)
    cp = await p.compile(engine)
    x, w, b = ints(rng, (8, 16)), ints(rng, (16, 12)), ints(rng, (12,))
    ins = [await Tensor.from_numpy(lt, engine, a) for lt, a in zip(cp.inputs, (x, w, b))]
    (out,) = [Tensor(lt, engine) for lt in cp.outputs]
    stream = await engine.stream()
    how, error = in_a_thread(cp.execute, stream, ins, [out])
    assert how == "raised" and isinstance(error, triodnn.WrongThreadError), (how, error)
    assert f"submitted to a stream of {engine}" in str(error)
    assert stream.statistics().submitted == 0
    await cp.execute(stream, ins, [out])
    np.testing.assert_array_equal(await out.to_numpy(), np.maximum(x @ w + b, 0))


async def test_out_of_order_execution_equals_in_order(engine, rng):
    """A diamond (two branches from one input) on an out-of-order stream: each primitive waits
    only for its producers, and the result is the in-order one exactly."""
    g = Graph("cpu")
    x = f32(0, [64, 64])
    g.add_op(Op(0, "Exp", [x], [f32(1, [64, 64])]))
    g.add_op(Op(1, "Tanh", [x], [f32(2, [64, 64])]))
    g.add_op(Op(2, "Multiply", [f32(1, [64, 64]), f32(2, [64, 64])], [f32(3, [64, 64])]))
    g.add_op(Op(3, "ReLU", [f32(3, [64, 64])], [f32(4, [64, 64])]))
    (p,) = g.get_partitions()
    cp = await p.compile(engine)
    data = rng.standard_normal((64, 64)).astype(np.float32)
    src = await Tensor.from_numpy(cp.inputs[0], engine, data)
    results = []
    for flags in (StreamFlags.in_order, StreamFlags.out_of_order):
        out = Tensor(cp.outputs[0], engine)
        await cp.execute(await engine.stream(flags), [src], [out])
        results.append(await out.to_numpy())
    np.testing.assert_array_equal(results[0], results[1])
    np.testing.assert_allclose(results[0], np.maximum(np.exp(data) * np.tanh(data), 0), rtol=1e-5)


async def test_bf16_matmul_and_boolean_select(engine, rng):
    """Data types the f32 kernels do not take run through reorders to and from f32."""
    a, b = LogicalTensor(0, "bf16", [4, 8], layout_type="strided"), LogicalTensor(1, "bf16", [8, 6], layout_type="strided")
    mm = LogicalTensor(2, "f32", [4, 6], layout_type="strided")
    cond = LogicalTensor(3, "boolean", [1, 6], layout_type="strided")
    fill = LogicalTensor(4, "f32", [1], layout_type="strided")
    out = LogicalTensor(5, "bf16", [4, 6], layout_type="strided")
    g = Graph("cpu")
    g.add_op(Op(0, "MatMul", [a, b], [mm]))
    g.add_op(Op(1, "Select", [cond, mm, fill], [out]))
    (p,) = g.get_partitions()
    cp = await p.compile(engine)
    x, w = ints(rng, (4, 8)), ints(rng, (8, 6))
    c = np.array([[True, False, True, True, False, False]])
    arrays = {0: x, 1: w, 3: c, 4: np.array([-1.5], np.float32)}
    ins = [await Tensor.from_numpy(lt, engine, arrays[lt.id]) for lt in cp.inputs]
    dst = Tensor(cp.outputs[0], engine)
    await cp.execute(await engine.stream(), ins, [dst])
    np.testing.assert_array_equal(await dst.to_numpy(), np.where(c, x @ w, -1.5))


# -- JSON ---------------------------------------------------------------------------------------


def test_json_round_trip_of_an_example():
    g = load(EXAMPLES / "sdpa.json")
    document = to_dict(g)
    again = from_dict(json.loads(json.dumps(document)))
    assert to_dict(again) == document
    assert [op.kind for op in again.ops] == ["MatMul", "Multiply", "Add", "SoftMax", "MatMul"]
    assert again.ops[0].attrs["transpose_b"] is True


@pytest.mark.parametrize("text, needle", [
    ("{", "malformed graph JSON"),
    ("[]", "JSON object"),
    ('{"graph": 3}', "'graph' list"),
    ('{"graph": [{"id": 0}]}', "graph\\[0\\] lacks 'kind'"),
    ('{"graph": [{"id": 0, "kind": "ReLU", "attrs": {"x": {"type": "s64"}}}]}', "graph\\[0\\].attrs.x"),
    ('{"graph": [{"id": 0, "kind": "SoftMax", "attrs": {"axis": {"type": "s64", "value": "1"}}}]}',
     "not a s64"),
    ('{"graph": [{"id": 0, "kind": "ReLU", "inputs": [{"id": 0}]}]}', "graph\\[0\\].inputs\\[0\\] lacks dtype"),
    # No shape: refused at load, naming the tensor (it used to fail only at compile).
    ('{"graph": [{"id": 0, "kind": "ReLU", "inputs": [{"id": 5, "dtype": "f32"}]}]}',
     "graph\\[0\\].inputs\\[0\\]: logical tensor 5 lacks 'shape'"),
    ('{"graph": [{"id": 0, "kind": "ReLU", "inputs": [{"id": 0, "dtype": "f32", "shape": 7}]}]}',
     "graph\\[0\\].inputs\\[0\\]"),
])
def test_malformed_json_is_a_typed_error(text, needle):
    with pytest.raises(InvalidGraphError, match=needle):
        load(text)


def test_json_rejects_duplicate_ids_and_conflicting_tensors():
    doc = to_dict(mlp_graph())
    dup = json.loads(json.dumps(doc))
    dup["graph"][1]["id"] = 0
    with pytest.raises(InvalidGraphError, match="op id 0"):
        from_dict(dup)
    conflict = json.loads(json.dumps(doc))
    conflict["graph"][1]["inputs"][0]["shape"] = [8, 99]
    with pytest.raises(InvalidGraphError, match="logical tensor 3"):
        from_dict(conflict)


def test_missing_file_is_a_typed_error(tmp_path):
    with pytest.raises(InvalidGraphError, match="cannot read graph file"):
        load(tmp_path / "absent.json")


# -- op coverage beyond the public graphs -------------------------------------------------------


async def run_single_partition(engine, g: Graph, arrays: dict) -> dict:
    (p,) = g.get_partitions()
    cp = await p.compile(engine)
    ins = [await Tensor.from_numpy(lt, engine, arrays[lt.id]) for lt in cp.inputs]
    outs = [Tensor(lt, engine) for lt in cp.outputs]
    await cp.execute(await engine.stream(), ins, outs)
    return {t.logical_tensor.id: await t.to_numpy() for t in outs}


async def test_group_norm_nxc_with_affine(engine, rng):
    from triodnn.testing import reference

    x = rng.uniform(-2, 2, (2, 5, 5, 8)).astype(np.float32)
    gamma, beta = rng.uniform(0.5, 1.5, 8).astype(np.float32), rng.uniform(-1, 1, 8).astype(np.float32)
    attrs = {"groups": 4, "use_affine": True, "keep_stats": False, "epsilon": 1e-5, "data_format": "NXC"}
    g = Graph("cpu")
    g.add_op(Op(0, "GroupNorm", [f32(0, x.shape), f32(1, [8]), f32(2, [8])], [f32(3, x.shape)], attrs))
    got = await run_single_partition(engine, g, {0: x, 1: gamma, 2: beta})
    (want,) = reference("GroupNorm", attrs, [x, gamma, beta], ["f32"])
    np.testing.assert_allclose(got[3], want, rtol=1e-5, atol=1e-5)


async def test_squared_difference(engine, rng):
    a, b = ints(rng, (3, 4)), ints(rng, (1, 4))
    g = Graph("cpu")
    g.add_op(Op(0, "SquaredDifference", [f32(0, [3, 4]), f32(1, [1, 4])], [f32(2, [3, 4])]))
    got = await run_single_partition(engine, g, {0: a, 1: b})
    np.testing.assert_array_equal(got[2], (a - b) ** 2)


def test_recognised_ops_triodnn_does_not_run_make_unsupported_partitions():
    g = Graph("cpu")
    g.add_op(Op(0, "ReLU", [f32(0, [1, 1, 4])], [f32(1, [1, 1, 4])]))
    # The recognised training ops have lowerings; nearest interpolation with
    # align_corners stays without one (no rounding rule is defined for it).
    g.add_op(Op(1, "Interpolate", [f32(1, [1, 1, 4])], [f32(3, [1, 1, 4])],
                {"mode": "nearest", "coordinate_transformation_mode": "align_corners", "sizes": [4],
                 "data_format": "NCX"}))
    # RMSNorm's optional rrms output is produced: the op after the gap is supported again.
    g.add_op(Op(2, "RMSNorm", [f32(3, [1, 1, 4])], [f32(4, [1, 1, 4]), f32(5, [1, 1])]))
    parts = g.get_partitions()
    assert [(p.op_kinds, p.is_supported) for p in parts] == [
        (("ReLU",), True), (("Interpolate",), False), (("RMSNorm",), True)]


# -- post-op fusion -------------------------------------------------------------------------------


async def test_matmul_bias_swish_mul_chain_is_one_primitive_and_matches_op_by_op(engine, rng):
    """MatMul -> BiasAdd -> x*sigmoid(x) -> Multiply(row) -> Add(full): one matmul with four
    post-ops under fusion; the same numbers as the debug policy's five primitives."""
    def build():
        g = Graph("cpu")
        g.add_op(Op(0, "MatMul", [f32(0, [16, 32]), f32(1, [32, 24])], [f32(2, [16, 24])]))
        g.add_op(Op(1, "BiasAdd", [f32(2, [16, 24]), f32(3, [24])], [f32(4, [16, 24])]))
        g.add_op(Op(2, "Sigmoid", [f32(4, [16, 24])], [f32(5, [16, 24])]))
        g.add_op(Op(3, "Multiply", [f32(4, [16, 24]), f32(5, [16, 24])], [f32(6, [16, 24])]))
        g.add_op(Op(4, "Multiply", [f32(7, [1, 24]), f32(6, [16, 24])], [f32(8, [16, 24])]))
        g.add_op(Op(5, "Add", [f32(8, [16, 24]), f32(9, [16, 24])], [f32(10, [16, 24])]))
        return g

    arrays = {0: ints(rng, (16, 32)), 1: ints(rng, (32, 24)) / 8, 3: ints(rng, (24,)),
              7: ints(rng, (1, 24)), 9: ints(rng, (16, 24))}
    (p,) = build().get_partitions("fusion")
    cp = await p.compile(engine)
    assert [pr.kind for pr in cp.primitives] == ["matmul"]
    assert [e[0] for e in cp.primitives[0].desc.post_ops] == ["binary", "eltwise", "binary", "binary"]
    fused = await run_single_partition(engine, build(), arrays)
    stream = await engine.stream()
    tensors = {i: await Tensor.from_numpy(f32(i, a.shape), engine, a) for i, a in arrays.items()}
    for part in build().get_partitions("debug"):
        c = await part.compile(engine, [tensors[lt.id].logical_tensor for lt in part.input_ports], None)
        outs = [Tensor(lt, engine) for lt in c.outputs]
        await c.execute(stream, [tensors[lt.id] for lt in part.input_ports], outs)
        tensors.update({t.logical_tensor.id: t for t in outs})
    np.testing.assert_allclose(fused[10], await tensors[10].to_numpy(), rtol=1e-6, atol=1e-5)
    x = arrays[0] @ arrays[1] + arrays[3]
    np.testing.assert_allclose(fused[10], x / (1 + np.exp(-x)) * arrays[7] + arrays[9], rtol=1e-5, atol=1e-4)


def chain_kinds(ops, outputs=()):
    from triodnn.graph._fusion import find_chains

    return {anchor: [e[:2] for e in chain.entries] for anchor, chain in find_chains(ops, set(outputs)).items()}


def test_chains_stop_at_partition_outputs_shared_values_and_late_operands():
    relu = Op(0, "ReLU", [f32(0, [4])], [f32(1, [4])])
    exp = Op(1, "Exp", [f32(1, [4])], [f32(2, [4])])
    # A partition output in the middle of the chain stops it.
    assert chain_kinds([relu, exp], outputs=[1, 2]) == {}
    assert chain_kinds([relu, exp], outputs=[2]) == {0: [("eltwise", "exp")]}
    # Subtract with the chain value on the right cannot be a post-op.
    sub = Op(2, "Subtract", [f32(5, [4]), f32(1, [4])], [f32(3, [4])])
    assert chain_kinds([relu, sub], outputs=[3]) == {}
    # An operand made after the anchor is not ready when the anchor runs.
    tanh = Op(3, "Tanh", [f32(6, [4])], [f32(7, [4])])
    add = Op(4, "Add", [f32(1, [4]), f32(7, [4])], [f32(8, [4])])
    assert chain_kinds([relu, tanh, add], outputs=[8]) == {3: [("binary", "add")]}
    # An operand that would enlarge the value (broadcasting it) is not a post-op.
    wide = Op(5, "Add", [f32(1, [4]), f32(9, [3, 4])], [f32(10, [3, 4])])
    assert chain_kinds([relu, wide], outputs=[10]) == {}


# -- memory planning and in-place ports ---------------------------------------------------------


async def compile_unfused(engine, g: Graph):
    from triodnn.graph._compiled_partition import compile_partition

    (p,) = g.get_partitions()
    ins, outs = list(p.input_ports), list(p.output_ports)
    return await compile_partition(p, engine, ins, outs, p._infer(ins, outs, declared=True), fuse=False)


async def test_temporaries_share_buffers_when_their_lives_do_not_overlap(engine, rng):
    g = Graph("cpu")
    for i in range(4):
        g.add_op(Op(i, "SoftMax", [f32(i, [8, 32])], [f32(i + 1, [8, 32])], {"axis": -1}))
    (p,) = g.get_partitions()
    cp = await p.compile(engine)
    stats = cp.memory_statistics()
    assert (stats.temporaries, stats.scratch_buffers) == (3, 2)
    assert stats.scratch_bytes == 2 * 8 * 32 * 4 and stats.unplanned_scratch_bytes == 3 * 8 * 32 * 4
    x = rng.uniform(-3, 3, (8, 32)).astype(np.float32)
    got = await run_single_partition(engine, g, {0: x})
    want = x
    for _ in range(4):
        e = np.exp(want - want.max(-1, keepdims=True))
        want = e / e.sum(-1, keepdims=True)
    np.testing.assert_allclose(got[4], want, rtol=1e-5, atol=1e-7)


async def test_elementwise_steps_write_over_a_dying_input(engine, rng):
    g = Graph("cpu")
    g.add_op(Op(0, "SoftMax", [f32(0, [4, 16])], [f32(1, [4, 16])], {"axis": -1}))
    g.add_op(Op(1, "Sqrt", [f32(1, [4, 16])], [f32(2, [4, 16])]))
    g.add_op(Op(2, "Tanh", [f32(2, [4, 16])], [f32(3, [4, 16])]))
    cp = await compile_unfused(engine, g)
    stats = cp.memory_statistics()
    assert (len(cp.primitives), stats.temporaries, stats.scratch_buffers, stats.in_place_steps) == (3, 2, 1, 1)
    x = rng.uniform(-3, 3, (4, 16)).astype(np.float32)
    src = await Tensor.from_numpy(cp.inputs[0], engine, x)
    out = Tensor(cp.outputs[0], engine)
    await cp.execute(await engine.stream(triodnn.StreamFlags.out_of_order), [src], [out])
    e = np.exp(x - x.max(-1, keepdims=True))
    np.testing.assert_allclose(await out.to_numpy(), np.tanh(np.sqrt(e / e.sum(-1, keepdims=True))), rtol=1e-5)


@pytest.mark.parametrize("flags", [StreamFlags.in_order, StreamFlags.out_of_order])
async def test_in_place_port_of_a_residual_add(engine, rng, flags):
    """MatMul + Add(residual): the residual input may share the output's buffer (the add is a
    post-op reading it at the index it writes); sharing it gives the same result."""
    g = Graph("cpu")
    g.add_op(Op(0, "MatMul", [f32(0, [16, 8]), f32(1, [8, 12], property_type="constant")], [f32(2, [16, 12])]))
    g.add_op(Op(1, "Add", [f32(2, [16, 12]), f32(3, [16, 12])], [f32(4, [16, 12])]))
    (p,) = g.get_partitions()
    cp = await p.compile(engine)
    assert cp.inplace_ports() == [(3, 4)]
    a, w, r = ints(rng, (16, 8)), ints(rng, (8, 12)), ints(rng, (16, 12))
    ins = {lt.id: await Tensor.from_numpy(lt, engine, {0: a, 1: w, 3: r}[lt.id]) for lt in cp.inputs}
    shared = Tensor(cp.query_logical_tensor(4), engine, memory=ins[3].memory)
    await cp.execute(await engine.stream(flags), list(ins.values()), [shared])
    np.testing.assert_array_equal(await shared.to_numpy(), a @ w + r)


async def test_in_place_rules_refuse_constants_shared_inputs_and_late_reads(engine):
    relu = Graph("cpu")
    relu.add_op(Op(0, "ReLU", [f32(0, [4])], [f32(1, [4])]))
    assert (await (relu.get_partitions()[0]).compile(engine)).inplace_ports() == [(0, 1)]
    const = Graph("cpu")
    const.add_op(Op(0, "ReLU", [f32(0, [4], property_type="constant")], [f32(1, [4])]))
    assert (await (const.get_partitions()[0]).compile(engine)).inplace_ports() == []
    shared = Graph("cpu")
    shared.add_op(Op(0, "ReLU", [f32(0, [4])], [f32(1, [4])]))
    shared.add_op(Op(1, "Wildcard", [f32(0, [4])], [f32(2, [4])]))
    first = shared.get_partitions()[0]
    assert first.op_kinds == ("ReLU",)
    assert (await first.compile(engine)).inplace_ports() == []
    matmul = Graph("cpu")  # a matmul reads all of src before any dst element is final
    matmul.add_op(Op(0, "MatMul", [f32(0, [4, 4]), f32(1, [4, 4])], [f32(2, [4, 4])]))
    assert (await (matmul.get_partitions()[0]).compile(engine)).inplace_ports() == []

"""The graph-op registry: every kind declared once, with all its parts, and a new kind needing
nothing but its declaration (``triodnn.graph._op_registry``, the families of ``graph.ops``)."""

from __future__ import annotations

import attrs
import numpy as np
import pytest

from triodnn import EltwiseDesc, InvalidGraphError, ShapeInferenceError, StreamFlags, UnsupportedError
from triodnn.graph import Graph, LogicalTensor, Op, compile_graph, ops
from triodnn.graph._fusion import find_chains
from triodnn.graph._lowering import is_supported
from triodnn.graph._op_registry import FILLINGS, GraphOp, Numbers, any_op, graph_op, graph_ops, register, registered
from triodnn.graph._op_schema import OP_SCHEMAS, OpSchema, check_op
from triodnn.graph._shape_inference import infer_output_shapes
from triodnn.kernels import tolerance as kt
from triodnn.kernels.tolerance import ELTWISE_TRANSCENDENTAL
from triodnn.testing import fill_input, reference, tolerance

FAMILIES = (ops.binary, ops.convolution, ops.data_movement, ops.dropout, ops.eltwise, ops.matmul,
            ops.normalization, ops.pooling, ops.quantization, ops.reduction, ops.resampling, ops.softmax)


def test_every_kind_that_runs_has_all_four_parts():
    running = [op for op in graph_ops().values() if op.runs]
    assert len(running) == 86  # 88 kinds: all but Wildcard and End (marks an output)
    for op in running:
        assert op.shapes is not None and op.reference is not None, op.kind
        assert op.schema.kind == op.kind
    not_run = sorted(op.kind for op in graph_ops().values() if not op.runs)
    assert not_run == ["End", "Wildcard"]


def test_each_family_registers_exactly_the_kinds_it_declares():
    declared = [schema.kind for family in FAMILIES for schema in family._SCHEMAS]
    assert len(declared) == len(set(declared))  # no kind in two families
    assert set(declared) | {"Wildcard", "End"} == set(graph_ops())
    assert set(OP_SCHEMAS) == set(graph_ops())


def test_a_kind_is_declared_once():
    with pytest.raises(ValueError, match="'MatMul' is registered twice"):
        register(GraphOp(OP_SCHEMAS["MatMul"]))
    assert graph_op("MatMul").lower is not None  # the first declaration stands


def test_an_unknown_kind_names_the_known_ones():
    with pytest.raises(InvalidGraphError, match="unknown op kind 'Cube'; known kinds: Abs, AbsBackward"):
        graph_op("Cube")
    with pytest.raises(InvalidGraphError, match="unknown op kind 'Cube'"):
        check_op("Cube", {}, 1, 1)


def test_kinds_that_do_not_run_say_why():
    with pytest.raises(ShapeInferenceError, match="Wildcard op's semantics are the user's"):
        infer_output_shapes("Wildcard", {}, [(2, 3)], 1)
    with pytest.raises(UnsupportedError, match="Wildcard op's semantics are the user's; there is no reference"):
        reference("Wildcard", {}, [np.zeros(3, np.float32)], ["f32"])
    assert infer_output_shapes("End", {}, [(2, 3)], 0) == []


def _cube_shapes(kind, a, shapes, num_outputs):
    return [shapes[0]]


def _lower_cube(b, op):
    b.run(op, lambda src, dst: EltwiseDesc("pow", src, dst, 1.0, 3.0),
          {"src": b.view(op.inputs[0])}, {"dst": b.output(op.outputs[0])})


def _cube_reference(kind, a, inputs, num_outputs):
    return [np.asarray(inputs[0], np.float64) ** 3]


CUBE = GraphOp(OpSchema("Cube", (1, 1), (1, 1), {}, "custom", None, ("src",)),
               shapes=_cube_shapes, lower=_lower_cube, reference=_cube_reference)


async def test_a_new_kind_needs_only_its_declaration(engine):
    """What a family module does for its kinds, done here for one: with the declaration
    registered, the kind is checked, partitioned, shaped, lowered, run and referenced, and no
    compiler pass changes."""
    x = np.linspace(-2, 2, 24, dtype=np.float32).reshape(4, 6)
    with registered(CUBE):
        graph = Graph("cpu")
        op = Op(0, "Cube", [LogicalTensor(0, "f32", (4, 6))], [LogicalTensor(1, "f32", (4, 6))], {})
        graph.add_op(op)
        graph.finalize()
        assert is_supported(op)
        runner = await compile_graph(graph, engine)
        got = await runner.run(await engine.stream(StreamFlags.in_order), {0: x})
        want = reference("Cube", {}, [x], ["f32"])[0]
    np.testing.assert_allclose(got[1], want, rtol=ELTWISE_TRANSCENDENTAL, atol=ELTWISE_TRANSCENDENTAL)
    np.testing.assert_allclose(want, x.astype(np.float64) ** 3, rtol=1e-6)
    with pytest.raises(InvalidGraphError, match="unknown op kind 'Cube'"):
        graph_op("Cube")  # gone with the block


def _cube_then_relu(shape: tuple[int, ...]) -> list[Op]:
    return [Op(0, "Cube", [LogicalTensor(0, "f32", shape)], [LogicalTensor(1, "f32", shape)], {}),
            Op(1, "ReLU", [LogicalTensor(1, "f32", shape)], [LogicalTensor(2, "f32", shape)], {})]


async def test_a_kind_declared_an_anchor_carries_the_post_ops_after_it(engine):
    """Post-op fusion asks the declaration too (``post_op_anchor``): a Cube declared an anchor
    takes the ReLU after it into its primitive; declared without one, the two run apart."""
    # Two shapes: the engine's compiled-partition cache would otherwise hand the second
    # compilation the first one's partition.
    for anchor, primitives, shape in ((any_op, 1, (4, 6)), (None, 2, (3, 8))):
        x = np.linspace(-2, 2, 24, dtype=np.float32).reshape(shape)
        with registered(attrs.evolve(CUBE, post_op_anchor=anchor)):
            found = find_chains(_cube_then_relu(shape), {2})
            assert {a: [e[:2] for e in chain.entries] for a, chain in found.items()} == \
                ({0: [("eltwise", "relu")]} if anchor else {})
            graph = Graph("cpu")
            for op in _cube_then_relu(shape):
                graph.add_op(op)
            graph.finalize()
            runner = await compile_graph(graph, engine)
            assert sum(len(c.primitives) for c in runner.compiled_partitions) == primitives
            got = await runner.run(await engine.stream(StreamFlags.in_order), {0: x})
        np.testing.assert_allclose(got[2], np.maximum(x.astype(np.float64) ** 3, 0), rtol=ELTWISE_TRANSCENDENTAL,
                                   atol=ELTWISE_TRANSCENDENTAL)


def test_every_anchor_and_filling_is_declared_by_a_family():
    """Which kinds carry post-ops and how their inputs are filled are facts of the kinds, kept
    with them; the fusion pass and the filling keep no list of kinds."""
    kinds = graph_ops()
    assert sum(op.post_op_anchor is not None for op in kinds.values()) == 34
    assert graph_op("MatMul").post_op_anchor is not None and graph_op("Concat").post_op_anchor is None
    assert {op.filling for op in kinds.values()} - {None} == set(FILLINGS)
    with pytest.raises(ValueError, match="'filling' must be in"):
        Numbers(filling="huge")


def test_the_conformance_check_fills_a_kind_as_its_declaration_says():
    rng = np.random.default_rng(0)
    with registered(attrs.evolve(CUBE, filling="positive")):
        assert fill_input("f32", (64,), ["Cube"], rng).min() > 0
    with registered(CUBE):
        assert fill_input("f32", (64,), ["Cube"], rng).min() < 0


def test_the_conformance_check_reads_a_kinds_numbers_from_its_declaration():
    """``testing.tolerance`` takes each kind's threshold and its inexact/accumulating facts from
    the registry: a kind that declares none is compared exactly."""
    assert tolerance(["ReLU"], "f32") == (0.0, 0.0)
    with registered(CUBE):
        assert tolerance(["Cube"], "f32") == (0.0, 0.0)
    with registered(attrs.evolve(CUBE, tolerance=1e-3)):
        assert tolerance(["Cube"], "f32") == (1e-3, 1e-3)
        assert tolerance(["Cube", "MatMul"], "f32") == (1e-3, 1e-3)  # not inexact: no chain
    with registered(attrs.evolve(CUBE, inexact=True)):
        # an inexact op meeting one that accumulates: benchdnn's chain check, rtol 8e-6, atol 2e-5
        assert tolerance(["Cube", "MatMul"], "f32") == (8e-6, 2e-5)
        assert tolerance(["Cube", "Add"], "f32") == (kt.BINARY, kt.BINARY)  # Add does not accumulate

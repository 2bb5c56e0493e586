"""Fuzzing the graph front end: the JSON loader, ``Graph.add_op``, the partitioner, shape inference.

Property: whatever goes in — mutated public graphs (keys dropped, duplicated, renamed, values of
the wrong type, random attributes, shapes with zeros, negatives, huge dims or INT64_MIN, dangling
ids, cycles, wrong dtypes), truncated JSON text, random bytes, random graphs built op by op —
ends in a result or a ``triodnn.TriodnnError`` subclass: never another exception type, a hang
or a crash.

The default suite runs few examples per property (the file takes a few seconds);
``TRIODNN_FUZZ_EXAMPLES=N`` runs N per property. Inputs that once broke the property live in
``tests/reliability/fuzz_corpus/*.json`` and run as explicit regression tests.
"""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path

import pytest
from _shared import GRAPHS, require
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import triodnn
from triodnn.graph import Graph, LogicalTensor, Op, from_dict, load, to_dict
from triodnn.graph._op_schema import OP_SCHEMAS

PUBLIC = GRAPHS / "public"
CORPUS = Path(__file__).resolve().parent / "fuzz_corpus"
EXAMPLES = int(os.environ.get("TRIODNN_FUZZ_EXAMPLES", "100"))

FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=2000,  # ms per example: a hang or a quadratic blow-up fails the property
    derandomize="TRIODNN_FUZZ_EXAMPLES" not in os.environ,  # the default suite is reproducible
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    database=None,
)

INT64_MIN = -(2**63)
KINDS = sorted(OP_SCHEMAS)
DTYPES = ["f32", "f16", "bf16", "s8", "u8", "s32", "boolean", "f64", "int", "", None, 3]


def _public_documents() -> dict[str, dict]:
    if not PUBLIC.is_dir():
        return {}
    return {p.name: json.loads(p.read_text()) for p in sorted(PUBLIC.glob("*.json"))}


DOCUMENTS = _public_documents()
# An f32 attribute of 1e40 becomes inf (float32 holds no more), as oneDNN stores it; numpy warns.
pytestmark = pytest.mark.filterwarnings("ignore:overflow encountered in cast:RuntimeWarning")


@pytest.fixture(scope="module")
def public_graphs():
    """Module-scoped, as hypothesis's ``@given`` tests allow: fails under CI, skips elsewhere,
    without the public graphs (tests/_shared.py)."""
    require(PUBLIC)


needs_public = pytest.mark.usefixtures("public_graphs")


# -- the property ----------------------------------------------------------------------------------


def exercise(source) -> None:
    """Load ``source`` and push it through everything the front end offers; only TriodnnErrors
    may come out (pytest reports anything else as the failure it is)."""
    try:
        graph = load(source)
    except triodnn.TriodnnError:
        return
    exercise_graph(graph)


def exercise_graph(graph: Graph) -> None:
    try:
        to_dict(graph)
    except triodnn.TriodnnError:
        pass
    for policy in ("fusion", "debug"):
        try:
            partitions = graph.get_partitions(policy)
        except triodnn.TriodnnError:
            return
        covered = sorted(op.id for p in partitions for op in p.ops)
        assert covered == sorted(op.id for op in graph.ops if op.kind != "End")
        for partition in partitions:
            repr(partition)
            try:
                partition.infer_shape()
            except triodnn.TriodnnError:
                pass
    try:
        # A graph that loaded saves and loads again (the round trip oneDNN's dumps promise).
        exercise_reload(to_dict(graph))
    except triodnn.TriodnnError:
        pass


def exercise_reload(document: dict) -> None:
    again = from_dict(json.loads(json.dumps(document)))
    assert len(again.ops) == len(document["graph"])


# -- mutations ---------------------------------------------------------------------------------------

WEIRD_VALUES = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=INT64_MIN, max_value=2**64),
    st.sampled_from([0, -1, -2, INT64_MIN, 2**63 - 1, 2**31, 10**30, float("nan"), float("inf"), 1e308]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=8), st.sampled_from(["f32", "strided", "opaque", "any", "MatMul", "numpy"]),
    st.lists(st.integers(min_value=-3, max_value=5), max_size=5),
    st.lists(st.sampled_from([0, -1, INT64_MIN, 2**62, 1, 7]), max_size=6),
    st.dictionaries(st.sampled_from(["type", "value", "id"]), st.integers(-2, 3), max_size=3),
)

DIMS = st.one_of(st.integers(min_value=0, max_value=9),
                 st.sampled_from([0, -1, -2, INT64_MIN, 2**40, 2**62, 2**63 - 1]))


def _containers(node, path=()):
    """Every (path, container) inside a JSON document."""
    yield path, node
    if isinstance(node, dict):
        for key, value in node.items():
            if isinstance(value, (dict, list)):
                yield from _containers(value, (*path, key))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            if isinstance(value, (dict, list)):
                yield from _containers(value, (*path, i))


def _tensors(doc):
    for op in doc.get("graph", []) if isinstance(doc.get("graph"), list) else []:
        if isinstance(op, dict):
            for role in ("inputs", "outputs"):
                for lt in op.get(role, []) if isinstance(op.get(role), list) else []:
                    if isinstance(lt, dict):
                        yield lt


def _ops(doc):
    return [op for op in doc.get("graph", []) if isinstance(op, dict)] if isinstance(doc.get("graph"), list) else []


def mutate(data, doc: dict) -> None:
    """One random mutation of ``doc`` in place."""
    what = data.draw(st.sampled_from([
        "drop", "duplicate", "rename", "retype", "shape", "stride", "dtype", "attr", "attr_type",
        "dangling", "cycle", "op_id", "kind", "layout", "swap_io", "ports",
    ]))
    containers = list(_containers(doc))
    tensors = list(_tensors(doc))
    ops = _ops(doc)
    if what in ("drop", "duplicate", "rename", "retype"):
        path, node = data.draw(st.sampled_from(containers))
        if not node:
            return
        if isinstance(node, dict):
            key = data.draw(st.sampled_from(sorted(node, key=str)))
            if what == "drop":
                del node[key]
            elif what == "duplicate":
                node[data.draw(st.sampled_from(["id", "kind", "shape", "extra", key + "_"]))] = copy.deepcopy(node[key])
            elif what == "rename":
                node[data.draw(st.text(max_size=6))] = node.pop(key)
            else:
                node[key] = data.draw(WEIRD_VALUES)
        else:
            i = data.draw(st.integers(0, len(node) - 1))
            if what == "drop":
                del node[i]
            elif what == "duplicate":
                node.insert(i, copy.deepcopy(node[i]))
            else:
                node[i] = data.draw(WEIRD_VALUES)
    elif what == "shape" and tensors:
        lt = data.draw(st.sampled_from(tensors))
        lt["shape"] = data.draw(st.one_of(st.lists(DIMS, max_size=6), WEIRD_VALUES))
    elif what == "stride" and tensors:
        lt = data.draw(st.sampled_from(tensors))
        lt["stride"] = data.draw(st.one_of(st.lists(DIMS, max_size=6), WEIRD_VALUES))
    elif what == "dtype" and tensors:
        data.draw(st.sampled_from(tensors))["dtype"] = data.draw(st.sampled_from(DTYPES))
    elif what in ("attr", "attr_type") and ops:
        op = data.draw(st.sampled_from(ops))
        attrs = op.setdefault("attrs", {})
        if not isinstance(attrs, dict):
            return
        schema = OP_SCHEMAS.get(op.get("kind")) if isinstance(op.get("kind"), str) else None
        names = sorted(schema.attrs) if schema is not None and schema.attrs else ["axis"]
        name = data.draw(st.sampled_from([*names, "bogus"]))
        kind = data.draw(st.sampled_from(["bool", "s64", "s64[]", "f32", "f32[]", "string", "s32"]))
        value = data.draw(WEIRD_VALUES)
        attrs[name] = {"type": kind, "value": value} if what == "attr" else value
    elif what == "dangling" and tensors:
        data.draw(st.sampled_from(tensors))["id"] = data.draw(st.sampled_from([10**6, 2**63, -1, INT64_MIN, 0, 1, 2]))
    elif what == "cycle" and len(ops) >= 1:
        # Feed an op's output back into an op upstream of it (or itself).
        src = data.draw(st.sampled_from(ops))
        dst = data.draw(st.sampled_from(ops))
        outs = src.get("outputs")
        ins = dst.get("inputs")
        if isinstance(outs, list) and outs and isinstance(ins, list):
            ins.append(copy.deepcopy(outs[0]))
    elif what == "op_id" and ops:
        data.draw(st.sampled_from(ops))["id"] = data.draw(st.sampled_from([0, 1, -1, 2**64, "3", None, True]))
    elif what == "kind" and ops:
        data.draw(st.sampled_from(ops))["kind"] = data.draw(st.sampled_from([*KINDS, "Nope", "", 7]))
    elif what == "layout" and tensors:
        lt = data.draw(st.sampled_from(tensors))
        lt["layout_type"] = data.draw(st.sampled_from(["undef", "any", "strided", "opaque", "weird", None]))
        if data.draw(st.booleans()):
            lt["layout_id"] = data.draw(WEIRD_VALUES)
    elif what == "swap_io" and ops:
        op = data.draw(st.sampled_from(ops))
        op["inputs"], op["outputs"] = op.get("outputs", []), op.get("inputs", [])
    elif what == "ports":
        doc[data.draw(st.sampled_from(["input_ports", "output_ports"]))] = data.draw(
            st.one_of(st.lists(st.integers(-2, 10**6), max_size=4), WEIRD_VALUES))


@needs_public
@FUZZ
@given(data=st.data())
def test_mutated_public_graphs(data):
    name = data.draw(st.sampled_from(sorted(DOCUMENTS)), label="graph")
    doc = copy.deepcopy(DOCUMENTS[name])
    for _ in range(data.draw(st.integers(1, 4), label="mutations")):
        mutate(data, doc)
    exercise(doc)


@needs_public
@FUZZ
@given(data=st.data())
def test_truncated_and_spliced_json_text(data):
    name = data.draw(st.sampled_from(sorted(DOCUMENTS)), label="graph")
    text = json.dumps(DOCUMENTS[name])
    cut = data.draw(st.integers(0, len(text)), label="cut")
    how = data.draw(st.sampled_from(["truncate", "splice", "bytes"]))
    if how == "truncate":
        exercise(text[:cut])
    elif how == "splice":
        exercise(text[:cut] + data.draw(st.text(max_size=20)) + text[cut:])
    else:
        raw = text.encode()
        exercise(raw[:cut] + data.draw(st.binary(max_size=20)) + raw[cut + 1:])


@FUZZ
@given(source=st.one_of(
    st.binary(max_size=200),
    st.text(max_size=200).map(lambda t: "{" + t),
    st.text(max_size=200).map(lambda t: "[" + t),
    st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
                 lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner, max_size=4),
                 max_leaves=20).map(lambda v: {"graph": v} if not isinstance(v, dict) else v),
))
def test_random_documents(source):
    exercise(source)


@pytest.mark.parametrize("source", [
    "[" * 100_000,                        # nesting deeper than the JSON parser's recursion
    b'{"graph":' + b"[" * 50_000,
    "no-such-dir/\x00graph.json",         # a path with a NUL byte
    "/",                                  # a directory
    "x" * 5000,                           # a path too long for the OS
])
def test_hostile_sources(source):
    with pytest.raises(triodnn.InvalidGraphError):
        load(source)


# -- graphs built op by op -----------------------------------------------------------------------


def _attr_value(spec_type: str):
    small = st.integers(-2, 4)
    return {
        "bool": st.one_of(st.booleans(), st.sampled_from([0, 1, 2])),
        "s64": st.one_of(small, st.sampled_from([INT64_MIN, 2**63, 10**20])),
        "s64[]": st.lists(st.one_of(small, st.sampled_from([INT64_MIN, 2**40])), max_size=5),
        "f32": st.one_of(st.floats(allow_nan=True), st.sampled_from([1e40, -0.0])),
        "f32[]": st.lists(st.floats(width=32), max_size=4),
        "string": st.one_of(st.sampled_from(["NXC", "NCX", "XIO", "OIX", "None", "SAME_UPPER", "VALID",
                                             "numpy", "none", "floor", "ceil", "gelu_tanh", "strict"]),
                            st.text(max_size=4)),
    }[spec_type]


@st.composite
def random_attrs(draw, kind: str):
    schema = OP_SCHEMAS[kind]
    out = {}
    for name, spec in schema.attrs.items():
        if spec.required or draw(st.booleans()):
            if draw(st.integers(0, 9)) == 0:
                out[name] = draw(WEIRD_VALUES)                        # a wrong type now and then
            else:
                out[name] = draw(_attr_value(spec.type))
    if draw(st.integers(0, 15)) == 0:
        out["bogus"] = 1
    return out


@st.composite
def logical_tensors(draw, ids):
    lt_id = draw(ids)
    dtype = draw(st.sampled_from(["f32", "f32", "f32", "f16", "bf16", "s8", "u8", "s32", "boolean"]))
    shape = draw(st.one_of(
        st.none(),
        st.lists(st.one_of(st.integers(1, 5), st.sampled_from([0, -1, 2**40])), min_size=0, max_size=5),
    ))
    layout = draw(st.sampled_from(["undef", "any", "strided", None]))
    return LogicalTensor(lt_id, dtype, shape, None, layout, None,
                         draw(st.sampled_from(["undef", "variable", "constant"])))


@st.composite
def random_graph_ops(draw):
    ids = st.integers(0, 12)
    ops = []
    for op_id in range(draw(st.integers(1, 8))):
        kind = draw(st.sampled_from(KINDS))
        schema = OP_SCHEMAS[kind]
        lo, hi = schema.num_inputs
        n_in = draw(st.integers(max(0, lo - 1), min(hi, lo + 2) + 1))
        lo_out = schema.num_outputs[0]  # BatchNormForwardTraining has 5: one short, or all of them
        n_out = draw(st.integers(max(0, lo_out - 1), max(lo_out, min(schema.num_outputs[1], 3))))
        ops.append(Op(
            draw(st.sampled_from([op_id, op_id, op_id, 0])),
            kind,
            [draw(logical_tensors(ids)) for _ in range(n_in)],
            [draw(logical_tensors(ids)) for _ in range(n_out)],
            draw(random_attrs(kind)),
        ))
    return draw(st.sampled_from(["cpu", "gpu", "any"])), ops


@FUZZ
@given(spec=random_graph_ops())
def test_random_graphs_built_op_by_op(spec):
    engine_kind, ops = spec
    graph = Graph(engine_kind)
    for op in ops:
        try:
            graph.add_op(op)
        except triodnn.TriodnnError:
            pass
    exercise_graph(graph)


@st.composite
def chain_graphs(draw):
    """Mostly valid graphs: a chain of shape-preserving ops on one input, with side inputs."""
    rank = draw(st.integers(1, 4))
    shape = draw(st.lists(st.integers(1, 4), min_size=rank, max_size=rank))
    unary = ["ReLU", "Sigmoid", "Tanh", "Exp", "Abs", "GELU", "SoftMax", "Clamp", "LeakyReLU"]
    binary = ["Add", "Multiply", "Subtract", "Maximum", "Minimum", "Divide"]
    ops, cur, next_id = [], 0, 1
    for op_id in range(draw(st.integers(1, 6))):
        kind = draw(st.sampled_from(unary + binary))
        attrs = {"Clamp": {"min": 0.0, "max": 6.0}, "LeakyReLU": {"alpha": 0.1},
                 "SoftMax": {"axis": -1}}.get(kind, {})
        ins = [LogicalTensor(cur, "f32", shape, layout_type="strided")]
        if kind in binary:
            side_rank = draw(st.integers(0, rank))
            ins.append(LogicalTensor(next_id, "f32", shape[rank - side_rank:], layout_type="strided"))
            next_id += 1
        out = LogicalTensor(next_id, "f32", shape, layout_type="strided")
        next_id += 1
        ops.append(Op(op_id, kind, ins, [out], attrs))
        cur = out.id
    return ops


@FUZZ
@given(ops=chain_graphs())
def test_valid_chains_partition_and_infer(ops):
    graph = Graph("cpu")
    for op in ops:
        graph.add_op(op)
    for policy in ("fusion", "debug"):
        partitions = graph.get_partitions(policy)
        if policy == "fusion":
            assert len(partitions) == 1
        for partition in partitions:
            for lt in partition.infer_shape():
                assert lt.shape == ops[0].outputs[0].shape


# -- the corpus: inputs that once broke the property ----------------------------------------------

CORPUS_FILES = sorted(CORPUS.glob("*.json")) if CORPUS.is_dir() else []


@pytest.mark.parametrize("case", CORPUS_FILES, ids=[p.stem for p in CORPUS_FILES])
def test_corpus(case):
    """Each corpus file: ``{"source": <document or string>, "bytes": false, "expect": "ErrorName"
    or null}``; ``expect`` null means it loads and partitions."""
    entry = json.loads(case.read_text())
    source = entry["source"]
    if entry.get("bytes"):
        source = source.encode("latin-1")
    expect = entry.get("expect")
    if expect is None:
        exercise(source)
        return
    with pytest.raises(getattr(triodnn, expect)):
        graph = load(source)
        for policy in ("fusion", "debug"):
            for partition in graph.get_partitions(policy):
                partition.infer_shape()


def test_file_that_is_not_utf8_is_a_graph_error(tmp_path):
    """Path.read_text raised UnicodeDecodeError (a ValueError, not an OSError) here."""
    path = tmp_path / "graph.json"
    path.write_bytes(b'{"graph": [\xff\xfe]}')
    with pytest.raises(triodnn.InvalidGraphError, match="malformed graph JSON"):
        load(path)

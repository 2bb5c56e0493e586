"""``triodnn graph`` speaking benchdnn: harness files and their options parsed into runs, each
run's options applied to a graph document, and a small harness run end to end against oneDNN's
CI graphs (../shared/graphs/benchdnn; see tests/_shared.py where absent)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from _shared import GRAPHS, require

from triodnn._cli import main
from triodnn._values._errors import InvalidArgumentError
from triodnn.testing import Run, parse_harness, rewrite_graph
from triodnn.testing._benchdnn import (
    ShapeRewrite,
    parse,
    parse_attr_fpmath,
    parse_dt,
    parse_in_shapes,
    parse_op_attrs,
    parse_tensor_property,
    tokens,
)

ROOT = Path(__file__).resolve().parents[2]
SHARED = GRAPHS / "benchdnn"
EXAMPLES = ROOT / "examples" / "graphs"


def _runs(text: str, tmp_path: Path, **kw) -> list[Run]:
    (tmp_path / "g.json").write_text("{}")
    return parse(tokens(text), base=tmp_path, **kw)


# --- harness files ---------------------------------------------------------------------------

def test_tokens_ignore_comments_lines_and_spacing():
    text = "# a comment --case=x\n--reset --mb=2   # trailing\n\n  --dt=f16\n\t--case=a.json\n"
    assert tokens(text) == ["--reset", "--mb=2", "--dt=f16", "--case=a.json"]


def test_comma_lists_run_the_cartesian_product_first_option_slowest(tmp_path):
    runs = _runs("--op-kind=0:Abs,0:Exp --dt=f32,f16,bf16 --case=g.json", tmp_path)
    assert [(r.op_kind, r.dt) for r in runs] == [
        ("0:Abs", "f32"), ("0:Abs", "f16"), ("0:Abs", "bf16"),
        ("0:Exp", "f32"), ("0:Exp", "f16"), ("0:Exp", "bf16")]
    assert all(r.path == tmp_path / "g.json" and r.case == "g.json" for r in runs)


def test_reset_restores_benchdnn_defaults_but_not_the_mode(tmp_path):
    runs = _runs("--mode=p --mb=3 --case=g.json --reset --case=g.json", tmp_path,
                 defaults={"dt": "f16"})
    assert [(r.mode, r.mb, r.dt) for r in runs] == [("P", "3", "f16"), ("P", "0", "")]
    assert runs[0].repro() == "--mode=P --mb=3 --dt=f16 --case=g.json"
    assert runs[1].repro() == "--mode=P --case=g.json"
    assert runs[1].expected_n_partitions == "1"


def test_options_span_lines_and_share_lines(tmp_path):
    runs = _runs("--reset --dt=0:f16\n    --tensor-property=1:constant\n    --case=g.json --case=g.json", tmp_path)
    assert [(r.dt, r.tensor_property) for r in runs] == [("0:f16", "1:constant")] * 2


def test_nested_batches_resolve_against_the_harness_then_its_parents(tmp_path):
    (tmp_path / "op" / "f32").mkdir(parents=True)
    (tmp_path / "op" / "f32" / "a.json").write_text("{}")
    (tmp_path / "op" / "harness").write_text("--reset --mb=2 --case=op/f32/a.json\n--case=f32/a.json\n")
    (tmp_path / "suite").write_text("--batch=op/harness\n--case=op/f32/a.json  # state carries on\n")
    runs = parse_harness(tmp_path / "suite")
    assert [(r.case, r.mb, r.path) for r in runs] == [
        ("op/f32/a.json", "2", tmp_path / "op" / "f32" / "a.json"),
        ("f32/a.json", "2", tmp_path / "op" / "f32" / "a.json"),
        ("op/f32/a.json", "2", tmp_path / "op" / "f32" / "a.json")]


def test_a_batch_folder_runs_every_graph_in_it(tmp_path):
    (tmp_path / "d").mkdir()
    for name in ("b.json", "a.json", "notes.txt"):
        (tmp_path / "d" / name).write_text("{}")
    runs = _runs("--mb=2 --batch=d", tmp_path)
    assert [(Path(r.case).name, r.mb) for r in runs] == [("a.json", "2"), ("b.json", "2")]


def test_batches_that_include_themselves_stop(tmp_path):
    (tmp_path / "loop").write_text("--batch=loop\n")
    with pytest.raises(InvalidArgumentError, match="nest deeper"):
        parse_harness(tmp_path / "loop")


@pytest.mark.parametrize("text, culprit", [
    ("--frobnicate=1 --case=g.json", "--frobnicate"),
    ("--case=missing.json", "missing.json"),
    ("--reset=1", "--reset"),
    ("--mb=-1 --case=g.json", "--mb=-1"),
    ("--mb=x", "--mb=x"),
    ("--mode=Q", "--mode=Q"),
    ("--expected-n-partitions=one", "--expected-n-partitions=one"),
    ("--in-shapes=0:2xa", "--in-shapes=0:2xa"),
    ("--in-shapes=0:2x3*abd", "--in-shapes=0:2x3*abd"),
    ("--in-shapes=0:2x3*abc", "--in-shapes=0:2x3*abc"),
    ("--in-shapes=0:2x3*1", "--in-shapes=0:2x3*1"),
    ("--in-shapes=x:2", "--in-shapes=x:2"),
    ("--in-shapes=0:2,1", "--in-shapes=1"),
    ("--op-attrs=0:kernel", "--op-attrs=0:kernel"),
    ("--op-attrs=0:auto_pad:VALID*kernel", "--op-attrs=0:auto_pad:VALID*kernel"),
    ("--op-kind=0:Ab-s", "--op-kind=0:Ab-s"),
    ("--dt=f64", "--dt=f64"),
    ("--dt=0:f33", "--dt=0:f33"),
    ("--tensor-property=0:const", "--tensor-property=0:const"),
    ("--attr-fpmath=fast", "--attr-fpmath=fast"),
    ("--attr-fpmath=bf16:maybe", "--attr-fpmath=bf16:maybe"),
    ("--mb", "--mb"),
    ("case=g.json", "case=g.json"),
])
def test_malformed_options_are_argument_errors_naming_them(tmp_path, text, culprit):
    with pytest.raises(InvalidArgumentError) as info:
        _runs(text, tmp_path)
    assert culprit in str(info.value)


# --- option values ---------------------------------------------------------------------------

def test_in_shapes_forms():
    assert parse_in_shapes("0:2x3+1:-+2:scalar+3:0x16") == {
        0: ShapeRewrite((2, 3)), 1: ShapeRewrite(()), 2: ShapeRewrite(()), 3: ShapeRewrite((0, 16))}
    assert parse_in_shapes("0:1x2x3x4*acbd+1:*ba+2:dcba") == {
        0: ShapeRewrite((1, 2, 3, 4), tag="acbd"), 1: ShapeRewrite(None, tag="ba"),
        2: ShapeRewrite(None, tag="dcba")}
    assert parse_in_shapes("0:2x3*3x1+5:1*1") == {
        0: ShapeRewrite((2, 3), strides=(3, 1)), 5: ShapeRewrite((1,), strides=(1,))}


def test_op_attrs_dt_property_and_fpmath_values():
    assert parse_op_attrs("0:data_format:NXC*kernel:2x2+3:alpha:0.5") == {
        0: {"data_format": "NXC", "kernel": "2x2"}, 3: {"alpha": "0.5"}}
    assert parse_dt("f16") == ("f16", {})
    assert parse_dt("undef") == (None, {})
    assert parse_dt("0:f32+14:bf16") == (None, {0: "f32", 14: "bf16"})
    assert parse_tensor_property("205:undef+206:host_scalar") == {205: "undef", 206: "host_scalar"}
    assert parse_attr_fpmath("bf16") == ("bf16", False)
    assert parse_attr_fpmath("tf32:true") == ("tf32", True)


# --- rewriting graph documents ---------------------------------------------------------------

def _lt(lt_id, shape, dtype="f32", prop="undef", stride=None):
    return {"id": lt_id, "dtype": dtype, "shape": list(shape), "stride": stride or [0] * len(shape),
            "layout_type": "strided", "property_type": prop}


def _op(op_id, kind, ins, outs, **attrs):
    return {"id": op_id, "name": kind, "kind": kind, "inputs": ins, "outputs": outs,
            "attrs": {k: {"type": t, "value": v} for k, (t, v) in attrs.items()}}


def _conv_relu():
    return {"version": "3.0.0", "engine_kind": "cpu", "fpmath_mode": "strict", "graph": [
        _op(0, "Convolution", [_lt(0, (2, 4, 8, 8), stride=[256, 1, 32, 4]), _lt(1, (6, 4, 3, 3), prop="constant")],
            [_lt(2, (2, 6, 6, 6))], strides=("s64[]", [1, 1]), pads_begin=("s64[]", [0, 0]),
            pads_end=("s64[]", [0, 0]), dilations=("s64[]", [1, 1]), groups=("s64", 1),
            data_format=("string", "NCX"), weights_format=("string", "OIX")),
        _op(1, "ReLU", [_lt(2, (2, 6, 6, 6))], [_lt(3, (2, 6, 6, 6))]),
    ]}


def _run(**options) -> Run:
    return Run("g.json", Path("g.json"), **options)


def _tensor(document, lt_id):
    return next(t for op in document["graph"] for t in op["inputs"] + op["outputs"] if t["id"] == lt_id)


def test_in_shapes_set_shape_and_layout_and_forget_produced_shapes():
    doc = _conv_relu()
    out = rewrite_graph(doc, _run(in_shapes="0:1x4x5x5*acdb+1:6x4x1x1"))
    assert _tensor(out, 0)["shape"] == [1, 4, 5, 5] and _tensor(out, 0)["stride"] == [100, 1, 20, 4]
    assert _tensor(out, 1)["shape"] == [6, 4, 1, 1] and _tensor(out, 1)["stride"] == [4, 1, 1, 1]
    assert _tensor(out, 2)["shape"] is None and _tensor(out, 3)["shape"] is None
    assert _tensor(doc, 0)["shape"] == [2, 4, 8, 8]  # the document given stays as it was
    strided = rewrite_graph(doc, _run(in_shapes="0:*2x1x3x4"))
    assert _tensor(strided, 0)["shape"] == [2, 4, 8, 8] and _tensor(strided, 0)["stride"] == [2, 1, 3, 4]


def test_mb_changes_the_data_batch_keeps_weights_and_layout():
    out = rewrite_graph(_conv_relu(), _run(mb="5"))
    assert _tensor(out, 0)["shape"] == [5, 4, 8, 8] and _tensor(out, 0)["stride"] == [256, 1, 32, 4]
    assert _tensor(out, 1)["shape"] == [6, 4, 3, 3]
    assert _tensor(out, 3)["shape"] is None


def test_mb_follows_benchdnn_through_consumers():
    doc = {"graph": [
        _op(0, "MatMul", [_lt(0, (4, 8)), _lt(1, (8, 3))], [_lt(2, (4, 3))]),
        _op(1, "Add", [_lt(2, (4, 3)), _lt(3, (1, 3))], [_lt(4, (4, 3))]),   # broadcast: no mb
        _op(2, "Multiply", [_lt(4, (4, 3)), _lt(5, (4, 3))], [_lt(6, (4, 3))]),  # same rank: mb
        _op(3, "Add", [_lt(7, (3,)), _lt(6, (4, 3))], [_lt(8, (4, 3))]),     # lower rank: no mb
    ]}
    out = rewrite_graph(doc, _run(mb="2"))
    assert {i: _tensor(out, i)["shape"] for i in (0, 1, 3, 5, 7)} == {
        0: [2, 8], 1: [8, 3], 3: [1, 3], 5: [2, 3], 7: [3]}
    assert _tensor(out, 0)["stride"] == [8, 1] and _tensor(out, 8)["shape"] is None


def test_mb_after_in_shapes_changes_the_new_shape_dim_0():
    out = rewrite_graph(_conv_relu(), _run(mb="3", in_shapes="0:1x4x5x5"))
    assert _tensor(out, 0)["shape"] == [3, 4, 5, 5] and _tensor(out, 0)["stride"] == [100, 25, 5, 1]


def test_op_attrs_are_typed_by_the_graph_and_undef_removes():
    out = rewrite_graph(_conv_relu(), _run(op_attrs="0:strides:2x2*groups:2*data_format:NXC*dilations:undef"
                                                     "+1:alpha:0.5*flag:true"))
    attrs0, attrs1 = out["graph"][0]["attrs"], out["graph"][1]["attrs"]
    assert attrs0["strides"] == {"type": "s64[]", "value": [2, 2]}
    assert attrs0["groups"] == {"type": "s64", "value": 2}
    assert attrs0["data_format"] == {"type": "string", "value": "NXC"}
    assert "dilations" not in attrs0
    assert attrs1["alpha"] == {"type": "f32", "value": 0.5}
    assert attrs1["flag"] == {"type": "string", "value": "true"}
    with pytest.raises(InvalidArgumentError, match="groups:two of op 0 is not a s64"):
        rewrite_graph(_conv_relu(), _run(op_attrs="0:groups:two"))
    with pytest.raises(InvalidArgumentError, match="op 7"):
        rewrite_graph(_conv_relu(), _run(op_attrs="7:groups:2"))


def test_op_attrs_integers_with_a_fraction_truncate_as_benchdnn_and_float_lists_are_guessed():
    # benchdnn reads s64 lists with atof, then truncates: sizes 6.5x12.2 are 6x12 there.
    out = rewrite_graph(_conv_relu(), _run(op_attrs="0:strides:2.5x1.9*groups:2.7+1:scales:0.5x1.25"))
    attrs0, attrs1 = out["graph"][0]["attrs"], out["graph"][1]["attrs"]
    assert attrs0["strides"]["value"] == [2, 1] and attrs0["groups"]["value"] == 2
    assert attrs1["scales"] == {"type": "f32[]", "value": [0.5, 1.25]}
    with pytest.raises(InvalidArgumentError, match="strides:2xinf of op 0 is not a s64"):
        rewrite_graph(_conv_relu(), _run(op_attrs="0:strides:2xinf"))


def test_interpolate_backward_takes_fractional_sizes_and_scales_as_benchdnn(capsys):
    """oneDNN's InterpolateBackward reads diff_dst's shape: sizes or scales set by --op-attrs
    need not give it (benchdnn passes these lines)."""
    require(GRAPHS)
    case = str(GRAPHS / "benchdnn/op/f32/interpolate_bwd.json")
    for attrs in ("0:sizes:6.5x12.2", "0:sizes:undef*scales:1.5x2.3", "0:mode:linear*sizes:undef*scales:0.9x0.87"):
        assert main(["graph", f"--op-attrs={attrs}", f"--case={case}"]) == 0
    out = capsys.readouterr().out
    assert out.count("PASSED") == 3, out


def test_op_kind_replaces_or_bypasses():
    out = rewrite_graph(_conv_relu(), _run(op_kind="1:Tanh"))
    assert [op["kind"] for op in out["graph"]] == ["Convolution", "Tanh"]
    out = rewrite_graph(_conv_relu(), _run(op_kind="1:undef"))
    assert [op["kind"] for op in out["graph"]] == ["Convolution"]
    doc = _conv_relu()
    doc["graph"].append(_op(2, "Add", [_lt(3, (2, 6, 6, 6)), _lt(4, (1, 6, 1, 1))], [_lt(5, (2, 6, 6, 6))]))
    doc["graph"].append(_op(3, "Exp", [_lt(5, (2, 6, 6, 6))], [_lt(6, (2, 6, 6, 6))]))
    out = rewrite_graph(doc, _run(op_kind="2:undef"))
    assert [op["kind"] for op in out["graph"]] == ["Convolution", "ReLU", "Exp"]
    assert [t["id"] for t in out["graph"][2]["inputs"]] == [3]  # the Add's graph input 4 is gone
    doc["graph"][2]["inputs"][1] = _lt(2, (2, 6, 6, 6))  # both Add inputs made by ops
    with pytest.raises(InvalidArgumentError, match="ambiguous"):
        rewrite_graph(doc, _run(op_kind="2:undef"))


def test_dt_graph_wide_keeps_norm_parameters_and_by_id():
    doc = {"graph": [
        _op(0, "LayerNorm", [_lt(0, (2, 8)), _lt(1, (8,)), _lt(2, (8,))], [_lt(3, (2, 8))]),
        _op(1, "Select", [_lt(4, (2, 8), "boolean"), _lt(3, (2, 8)), _lt(5, (2, 8))], [_lt(6, (2, 8))]),
    ]}
    out = rewrite_graph(doc, _run(dt="bf16"))
    assert {i: _tensor(out, i)["dtype"] for i in range(7)} == {
        0: "bf16", 1: "f32", 2: "f32", 3: "bf16", 4: "boolean", 5: "bf16", 6: "bf16"}
    out = rewrite_graph(doc, _run(dt="0:f16+6:f16"))
    assert [_tensor(out, i)["dtype"] for i in range(7)] == ["f16", "f32", "f32", "f32", "boolean", "f32", "f16"]
    with pytest.raises(InvalidArgumentError, match=r"--dt names logical tensors \[9\]"):
        rewrite_graph(doc, _run(dt="9:f16"))


def test_tensor_property_and_fpmath():
    out = rewrite_graph(_conv_relu(), _run(tensor_property="1:variable+0:constant", attr_fpmath="bf16:1"))
    assert _tensor(out, 0)["property_type"] == "constant" and _tensor(out, 1)["property_type"] == "variable"
    assert out["fpmath_mode"] == "bf16" and out["fpmath_mode_apply_to_int"] is True
    with pytest.raises(InvalidArgumentError, match="tensor-property"):
        rewrite_graph(_conv_relu(), _run(tensor_property="8:constant"))


def test_in_shapes_of_tensors_the_graph_lacks_are_left_out_and_of_internal_ones_invalid():
    """As benchdnn: it rewrites the tensors it meets among the ops, so an id the graph lacks is
    never met (a harness line shared by graphs of different ids runs); an internal one fails."""
    assert rewrite_graph(_conv_relu(), _run(in_shapes="9:2x2")) == rewrite_graph(_conv_relu(), _run())
    with pytest.raises(InvalidArgumentError, match="internal"):
        rewrite_graph(_conv_relu(), _run(in_shapes="2:1x6x6x6"))


# --- end to end ------------------------------------------------------------------------------

def test_harness_end_to_end_states_and_summary(tmp_path, capsys, monkeypatch):
    require(SHARED / "op" / "f32" / "abs.json")
    monkeypatch.chdir(SHARED)  # the cases are named as benchdnn's inputs/graph names them
    (tmp_path / "inner").write_text(
        "--reset --in-shapes=0:2x3x4x5 --op-kind=0:Abs,0:Exp --case=op/f32/abs.json\n")
    harness = tmp_path / "harness"
    harness.write_text(
        "# states benchdnn reports\n"
        "--batch=inner\n"
        # an op triodnn recognises but does not run (ConvolutionBackwardData runs now)
        "--reset --in-shapes=0:2x3x4x5 --dt=0:f4_e2m1+1:f4_e2m1 --case=op/f32/abs.json\n"
        "--reset --op-kind=7:Exp --case=op/f32/abs.json\n"
        "--reset --dt=0:f64+1:f64 --case=op/f32/abs.json\n"
        "--reset --in-shapes=0:2x2 --expected-n-partitions=2 --case=op/f32/abs.json\n")
    assert main(["graph", "--policy", "fusion", f"--batch={harness}"]) == 1
    out = capsys.readouterr().out
    lines = [line for line in out.splitlines() if line[:1].isdigit() or line.startswith("tests:")]
    assert lines[0] == "0:PASSED __REPRO: --mode=C --in-shapes=0:2x3x4x5 --op-kind=0:Abs --case=op/f32/abs.json"
    assert lines[1].startswith("1:PASSED __REPRO: --mode=C --in-shapes=0:2x3x4x5 --op-kind=0:Exp")
    assert lines[2].startswith("2:UNIMPLEMENTED (data type f4_e2m1 is not implemented) __REPRO:")
    assert lines[3].startswith("3:INVALID_ARGUMENTS (--op-kind names op 7, not in the graph)")
    assert lines[4].startswith("4:SKIPPED (data type f64 is not supported by the device)")
    assert lines[5].startswith("5:FAILED (expected 2 partition(s), got 1: Abs) __REPRO: --mode=C --in-shapes=0:2x2 "
                               "--expected-n-partitions=2 --case=op/f32/abs.json")
    assert lines[6] == ("tests:6 passed:2 skipped:1 mistrusted:0 unimplemented:1 invalid_arguments:1 failed:1 "
                        "listed:0")


async def test_malformed_graphs_and_options_that_do_not_fit_are_invalid_arguments(engine, tmp_path):
    from triodnn.testing import run_benchdnn

    bad = tmp_path / "bad.json"
    bad.write_text('{"graph": [{"id": 0, "kind": "Abs", "inputs": [{"dtype": "f32"}], "outputs": []}]}')
    result = await run_benchdnn(Run("bad.json", bad, mb="2"), engine=engine)
    assert result.status == "INVALID_ARGUMENTS" and "lacks id" in result.message
    bad.write_text("{not json")
    assert (await run_benchdnn(Run("bad.json", bad), engine=engine)).status == "INVALID_ARGUMENTS"
    mlp = EXAMPLES / "mlp.json"
    result = await run_benchdnn(Run("mlp.json", mlp, op_attrs="0:transpose_a:maybe"), engine=engine)
    assert result.status == "INVALID_ARGUMENTS"
    assert result.message == "--op-attrs: transpose_a:maybe of op 0 is not a bool"


async def test_triodnn_gaps_are_unimplemented_and_unknown_kinds_invalid(engine, tmp_path):
    import json

    from triodnn.testing import run_benchdnn

    path = tmp_path / "g.json"
    path.write_text(json.dumps({"graph": [
        _op(0, "Dropout", [_lt(0, (2, 2)), _lt(1, (), "s64", "host_scalar")], [_lt(2, (2, 2))]),
        _op(1, "Abs", [_lt(2, (2, 2))], [_lt(3, (2, 2), "f4_e2m1")])]}))
    result = await run_benchdnn(Run("g.json", path), engine=engine)
    # s64, host_scalar, f8 and Dropout are implemented: only f4 remains triodnn's gap.
    assert (result.status, result.message) == ("UNIMPLEMENTED", "data type f4_e2m1 is not implemented")
    result = await run_benchdnn(Run("g.json", path, op_kind="0:Frobnicate", dt="1:f32+3:f32",
                                    tensor_property="1:undef"), engine=engine)
    assert result.status == "INVALID_ARGUMENTS" and "Frobnicate" in result.message


def test_command_line_options_before_a_case_and_perf_mode(capsys):
    mlp = EXAMPLES / "mlp.json"
    assert main(["graph", "--mode=cp", "--repeat", "2", "--op-kind=0:MatMul", f"--case={mlp}"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out.pop(0).startswith("engine ")  # which engine runs the cases
    assert out[0] == f"0:PASSED __REPRO: --mode=CP --op-kind=0:MatMul --case={mlp}"
    kind = os.environ.get("TRIODNN_ENGINE", "cpu").split(":")[0]  # the default engine's
    assert out[1].startswith(f"perf,{kind},--mode=CP --op-kind=0:MatMul --case={mlp},min(ms):")
    assert "avg(ms):" in out[1] and ",GFLOPS:" in out[1]
    assert out[2].startswith("tests:1 passed:1 ")


def test_command_line_argument_errors_exit_2(capsys):
    assert main(["graph", "--op-kind=0:Abs", "--in-shapes=0:2xq", f"--case={EXAMPLES / 'mlp.json'}"]) == 2
    assert "--in-shapes=0:2xq" in capsys.readouterr().err


def test_list_mode_prints_each_runs_line_and_runs_nothing(tmp_path, capsys):
    """benchdnn's --mode=L: the lines of the runs a harness asks for, counted as listed; the
    case is not even read (a file that is no graph lists as well)."""
    not_a_graph = tmp_path / "not-a-graph.json"
    not_a_graph.write_text("{")
    assert main(["graph", "--mode=L", "--op-kind=0:Abs,0:Exp", f"--case={not_a_graph}"]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line[:1].isdigit() or line.startswith("tests:")]
    assert lines == [f"0:LISTED __REPRO: --mode=L --op-kind=0:Abs --case={not_a_graph}",
                     f"1:LISTED __REPRO: --mode=L --op-kind=0:Exp --case={not_a_graph}",
                     "tests:2 passed:0 skipped:0 mistrusted:0 unimplemented:0 invalid_arguments:0 failed:0 listed:2"]

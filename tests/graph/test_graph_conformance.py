"""oneDNN's own serialized graphs (../shared/graphs/public, see its SOURCES.txt) through the
``triodnn graph`` driver in correctness mode: every output equals the op-by-op numpy reference
within benchdnn's tolerances, and the partition counts are oneDNN's. Without ../shared (see
tests/_shared.py) these fail under CI and skip elsewhere; the project's own examples always run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from _shared import GRAPHS, require

from triodnn._cli import main
from triodnn.testing import run_case

ROOT = Path(__file__).resolve().parents[2]
PUBLIC = GRAPHS / "public"
PUBLIC_CASES = sorted(PUBLIC.glob("*.json")) if PUBLIC.is_dir() else []
EXAMPLES = sorted((ROOT / "examples" / "graphs").glob("*.json"))

# Graphs oneDNN compiles into one partition: every public file is a single fusion pattern or op.
ONE_PARTITION = {p.name for p in PUBLIC_CASES}

# Small enough to also run op by op (policy debug) in the suite's time budget (not
# unary_post_ops_gelu_fusion: 25M elements, 23 s op by op on a cold cache, for a GELU and a Subtract
# that the eltwise and binary tests check).
DEBUG_CASES = [p for p in PUBLIC_CASES if p.name in {
    "MHA-distill_bert-inf-fp32-bs1.json", "binary_post_ops_chain_fusion.json",
    "conv_bias_relu_depthwise_bias_relu_fusion_cpu.json", "gemma2-bf16-f32.json",
    "matmul_bias_post_ops_chain_fusion.json", "sdpa-plain-implicit-causal-mask-fp32-bs1.json",
    "shuffle_fusion.json",
}]


def _ids(paths):
    return [p.stem for p in paths]


@pytest.mark.parametrize("path", PUBLIC_CASES or [None], ids=_ids(PUBLIC_CASES) or ["absent"])
async def test_public_graph_passes_fused(engine, path):
    require(PUBLIC)
    result = await run_case(path, engine=engine, expected_n_partitions=1)
    assert result.status == "PASSED", result.summary()


@pytest.mark.parametrize("path", DEBUG_CASES or [None], ids=_ids(DEBUG_CASES) or ["absent"])
async def test_public_graph_passes_op_by_op(engine, path):
    require(PUBLIC)
    result = await run_case(path, engine=engine, policy="debug")
    assert result.status == "PASSED", result.summary()
    ops = [op for op in json.loads(path.read_text())["graph"] if op["kind"] != "End"]
    assert len(result.partitions) == len(ops)  # one op per partition


@pytest.mark.parametrize("path", EXAMPLES, ids=_ids(EXAMPLES))
async def test_shipped_examples_pass(engine, path):
    result = await run_case(path, engine=engine, expected_n_partitions=1)
    assert result.status == "PASSED", result.summary()


def _result_lines(out: str) -> list[str]:
    return [line for line in out.splitlines() if line[:1].isdigit() or line.startswith(("perf,", "tests:"))]


def test_cli_exit_status(tmp_path, capsys):
    assert main(["graph", "--case", str(EXAMPLES[0])]) == 0
    assert _result_lines(capsys.readouterr().out) == [
        f"0:PASSED __REPRO: --mode=C --case={EXAMPLES[0]}",
        "tests:1 passed:1 skipped:0 mistrusted:0 unimplemented:0 invalid_arguments:0 failed:0 listed:0"]
    bad = tmp_path / "bad.json"
    bad.write_text('{"graph": [{"id": 0, "kind": "Frobnicate"}]}')
    assert main(["graph", "--case", str(bad)]) == 0  # benchdnn's verdict: an invalid graph is no failure
    assert _result_lines(capsys.readouterr().out)[0].startswith("0:INVALID_ARGUMENTS (")


def test_cli_one_format_whatever_the_option_order(capsys):
    """The options' order decides what applies to which case, never the output's format: an
    option after the last --case applies to none, and says so."""
    assert main(["graph", "--mode=CP", "--repeat", "2", "--case", str(EXAMPLES[0])]) == 0
    captured = capsys.readouterr()
    lines = _result_lines(captured.out)
    assert lines[0] == f"0:PASSED __REPRO: --mode=CP --case={EXAMPLES[0]}"
    assert lines[1].startswith("perf,") and "avg(ms):" in lines[1] and lines[2].startswith("tests:1 passed:1 ")
    assert captured.err == ""
    assert main(["graph", "--case", str(EXAMPLES[0]), "--mode=CP", "--repeat", "2"]) == 0
    captured = capsys.readouterr()
    assert _result_lines(captured.out)[0] == f"0:PASSED __REPRO: --mode=C --case={EXAMPLES[0]}"
    assert "warning: --mode=CP comes after the last --case/--batch and applies to no case" in captured.err
    assert "--repeat" not in captured.err  # command-line options apply to the whole run wherever they stand


def test_cli_input_errors_exit_2(tmp_path, capsys):
    assert main(["graph", "--case", str(tmp_path / "missing.json")]) == 2
    assert "InvalidArgumentError: 'missing.json'" in capsys.readouterr().err.replace(str(tmp_path) + "/", "")
    assert main(["graph", "--mode=Q", "--case", str(EXAMPLES[0])]) == 2
    assert "--mode" in capsys.readouterr().err
    assert main(["graph"]) == 2
    assert "give --case FILE or --batch DIR|HARNESS" in capsys.readouterr().err


def test_cli_help_documents_every_option(capsys):
    with pytest.raises(SystemExit):
        main(["graph", "--help"])
    text = capsys.readouterr().out
    options = ["--case", "--batch", "--mode", "--engine", "--policy", "--in-shapes", "--dt", "--expected-n-partitions",
               "--reset", "--mb", "--op-attrs", "--op-kind", "--tensor-property", "--attr-fpmath", "--repeat",
               "--trace", "--verbose"]
    for option in options:
        assert option in text, option
    # Every option has a help text: argparse prints an option's metavar line then its text.
    assert "--policy {fusion,debug}\n" in text and "fusion: oneDNN's fused partitions" in text
    assert "the graph's fpmath mode" in text and "a logical tensor's property" in text
    assert "set attributes of op ID" in text


def test_cli_expected_partitions_and_perf_mode(capsys):
    assert main(["graph", "--expected-n-partitions", "5", "--case", str(EXAMPLES[0])]) == 1
    assert "expected 5 partition(s), got 1" in capsys.readouterr().out
    assert main(["graph", "--policy", "debug", "--expected-n-partitions", "5", "--mode", "P", "--repeat", "2",
                 "--case", str(EXAMPLES[0])]) == 0
    lines = _result_lines(capsys.readouterr().out)
    assert lines[1].startswith("perf,") and "avg(ms):" in lines[1]


def test_cli_in_shapes_reinfers_the_graph(capsys):
    sdpa = ROOT / "examples" / "graphs" / "sdpa.json"
    args = ["graph", "--in-shapes", "0:1x2x16x32+1:1x2x16x32+2:1x2x16x32+4:1x1x16x16", "--case", str(sdpa)]
    assert main(args) == 0
    assert _result_lines(capsys.readouterr().out)[0].startswith("0:PASSED __REPRO: --mode=C --in-shapes=0:1x2x16x32")


@pytest.mark.parametrize("name, dt", [
    ("matmul.json", "bf16"), ("softmax.json", "f16"),
    ("MHA-distill_bert-inf-fp32-bs1.json", "bf16"), ("sdpa-plain-simplified-f32.json", "0:bf16+1:bf16"),
])
async def test_public_graph_with_other_data_types(engine, name, dt):
    require(PUBLIC / name)
    result = await run_case(PUBLIC / name, engine=engine, dt=dt)
    assert result.status == "PASSED", result.summary()


def test_cli_batch_progress_summary_and_verbose(capsys, monkeypatch):
    monkeypatch.setenv("TRIODNN_VERBOSE", "0")  # restored after the test; --verbose sets it
    assert main(["graph", "--batch", str(ROOT / "examples" / "graphs"), "--verbose", "1"]) == 0
    out = capsys.readouterr().out
    assert "0:PASSED __REPRO:" in out and f"{len(EXAMPLES) - 1}:PASSED __REPRO:" in out
    assert f"tests:{len(EXAMPLES)} passed:{len(EXAMPLES)} " in out  # benchdnn's summary line
    assert "triodnn_verbose,primitive,create:" in out

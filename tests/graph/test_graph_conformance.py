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


def test_cli_exit_status(tmp_path, capsys):
    assert main(["graph", "--case", str(EXAMPLES[0])]) == 0
    assert "PASSED" in capsys.readouterr().out
    bad = tmp_path / "bad.json"
    bad.write_text('{"graph": [{"id": 0, "kind": "Frobnicate"}]}')
    assert main(["graph", "--case", str(bad)]) == 1
    out = capsys.readouterr().out
    assert "FAILED bad.json" in out and "Frobnicate" in out


def test_cli_expected_partitions_and_perf_mode(capsys):
    assert main(["graph", "--case", str(EXAMPLES[0]), "--expected-n-partitions", "5"]) == 1
    assert "expected 5 partition(s), got 1" in capsys.readouterr().out
    assert main(["graph", "--case", str(EXAMPLES[0]), "--policy", "debug",
                 "--expected-n-partitions", "5", "--mode", "P", "--repeat", "2"]) == 0
    assert "ms per run" in capsys.readouterr().out


def test_cli_in_shapes_reinfers_the_graph(capsys):
    sdpa = ROOT / "examples" / "graphs" / "sdpa.json"
    args = ["graph", "--case", str(sdpa), "--in-shapes", "0:1x2x16x32+1:1x2x16x32+2:1x2x16x32+4:1x1x16x16"]
    assert main(args) == 0
    assert "PASSED sdpa.json" in capsys.readouterr().out


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
    assert f"[1/{len(EXAMPLES)}] PASSED" in out
    assert "case" in out and "status" in out and "seconds" in out  # the summary table
    assert "triodnn_verbose,primitive,create:" in out

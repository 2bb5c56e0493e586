"""oneDNN's CI set for benchdnn's graph driver (../shared/graphs/benchdnn/test_graph_ci; see
tests/_shared.py where absent): the harness parses into its 225 runs, and a fixed sample of them,
every seventh run whose graph inputs hold at most 4M elements (the 64M-element reshapes and
transposes take 10-15 s each on 2 cores), runs with benchdnn's verdict, one test per run: every
run must pass, inference, quantized and training alike. The whole set is a command, not a test (3 minutes on 2
cores with a warm PoCL cache):
``cd ../shared/graphs/benchdnn && triodnn graph --batch=test_graph_ci``."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from _shared import GRAPHS, require

from triodnn.testing import parse_harness, rewrite_graph, run_benchdnn

SHARED = GRAPHS / "benchdnn"
SUITE = SHARED / "test_graph_ci"
SAMPLE = 7
MAX_INPUT_ELEMENTS = 1 << 22


def input_elements(run) -> int:
    """Elements of the graph inputs the run feeds (shapes after its options; unknown dims count 1)."""
    document = rewrite_graph(json.loads((SHARED / run.case).read_text()), run)
    produced = {t["id"] for op in document["graph"] for t in op["outputs"]}
    inputs = {t["id"]: t["shape"] for op in document["graph"] for t in op["inputs"] if t["id"] not in produced}
    return sum(math.prod(max(1, d) for d in shape) for shape in inputs.values())


@pytest.fixture(scope="module")
def runs():
    require(SUITE)
    return parse_harness(SUITE)


def test_the_ci_set_parses_into_every_run(runs):
    assert len(runs) == 225
    assert len({run.case for run in runs}) == 107  # the graphs SOURCES.txt counts
    assert {Path(run.case).parts[0] for run in runs} == {"op", "pattern", "complex_fusion"}


# The sample: every SAMPLE-th run whose graph inputs hold at most MAX_INPUT_ELEMENTS, one test each.
# Written out (test_the_sample_is_every_seventh_small_run keeps it equal to the rule) so that each
# run is a test of its own: a failing run names itself, and pytest-xdist's --dist loadfile, which
# hands out files with the most tests first, starts this file's ~200 s of runs early instead of
# leaving one worker on it after the other has finished.
SAMPLED = (0, 7, 14, 21, 28, 35, 49, 70, 77, 98, 105, 126, 133, 140, 147, 154, 161, 168, 175, 196, 203, 210, 224)


def test_the_sample_is_every_seventh_small_run(runs):
    assert SAMPLED == tuple(i for i in range(0, len(runs), SAMPLE) if input_elements(runs[i]) <= MAX_INPUT_ELEMENTS)
    assert len(SAMPLED) >= 20


@pytest.mark.parametrize("index", SAMPLED, ids=lambda i: f"run{i}")
async def test_a_sample_of_the_ci_set_passes_with_benchdnn_verdicts(runs, engine, monkeypatch, index):
    monkeypatch.chdir(SHARED)  # cases are named as benchdnn's inputs/graph names them
    result = await run_benchdnn(runs[index], engine=engine)
    assert result.status == "PASSED", f"{index}:{result.status} ({result.message}) {result.repro}"

"""tests/_shared.py's rule, in a pytest subprocess whose ``TRIODNN_SHARED`` names an empty folder: a
test that needs the shared data fails under CI, and skips elsewhere with the missing path in its
reason, a trio test as well as a plain one (tests/conftest.py keeps a trio test's skip reason)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPOSITORY = Path(__file__).resolve().parents[2]
# test_host_scalars' two tests of one shared graph, one plain and one trio test on an engine;
# both stop before building anything.
SELECTION = ["tests/graph/test_host_scalars.py", "-k", "bottom_right"]
MISSING = "graphs/benchdnn/complex_fusion/mha/sdpa-plain-bottom-right-implicit-causal-mask-f16-f32.json"


def run_pytest(shared: Path, ci: str | None) -> subprocess.CompletedProcess:
    env = {name: value for name, value in os.environ.items() if name != "CI"}
    env.update(TRIODNN_SHARED=str(shared), COLUMNS="1000")  # wide: the summary keeps whole reasons
    if ci is not None:
        env["CI"] = ci
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:xdist", "-p", "no:cacheprovider", "-q", "-rfEs", *SELECTION],
        cwd=REPOSITORY, env=env, capture_output=True, text=True, timeout=600,
    )


def test_absent_shared_data_fails_under_ci(tmp_path):
    result = run_pytest(tmp_path, ci="true")
    assert result.returncode == 1, result.stdout + result.stderr
    assert "2 failed" in result.stdout and "passed" not in result.stdout and "skipped" not in result.stdout
    assert f"shared test data absent: {tmp_path / MISSING} (TRIODNN_SHARED names the folder); CI runs need it" \
        in result.stdout


def test_absent_shared_data_skips_elsewhere_naming_the_path(tmp_path):
    result = run_pytest(tmp_path, ci=None)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "2 skipped" in result.stdout and "failed" not in result.stdout and "passed" not in result.stdout
    reason = f"shared test data absent: {tmp_path / MISSING} (TRIODNN_SHARED names the folder)"
    skipped = [line for line in result.stdout.splitlines() if line.startswith("SKIPPED")]
    assert len(skipped) == 2 and all(line.endswith(reason) for line in skipped), skipped
    assert all("tests/graph/test_host_scalars.py:" in line for line in skipped), skipped  # the tests' own lines

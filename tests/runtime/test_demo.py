"""``triodnn demo`` runs its pipeline and its overlap section, and checks both against numpy."""

from __future__ import annotations

from triodnn.testing import run_demo


async def test_demo_passes_and_explains_its_lanes(capsys):
    assert await run_demo(None, size=4096, requests=4, in_flight=2, rounds=1)
    out = capsys.readouterr().out
    assert "out-of-order speedup" in out
    # Each primitive's lane placement comes with its reason.
    assert "eltwise:gelu_tanh:" in out and "matmul:" in out
    assert "matmul results vs numpy" in out and "reduction results vs numpy" in out and "PASSED" in out
    # On every device the demo shows a workload that overlaps beside one that does not.
    lines = {line.split(":")[0].strip() + ":" + line.split(":")[1]: line for line in out.splitlines()
             if line.startswith("  eltwise:") or line.startswith("  reduction:")}
    assert "take lanes of their own and overlap" in lines["reduction:sum"]
    assert "keeps it on lane 0" in lines["eltwise:gelu_tanh"]

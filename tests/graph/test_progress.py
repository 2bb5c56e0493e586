"""Progress of long graph work: ``compile_graph(..., progress=)``, ``progress_bar`` and the CLI's
line, each report counted (a cold compile builds kernels for seconds and showed nothing)."""

from __future__ import annotations

import io

import numpy as np
import pytest

from triodnn import InvalidArgumentError, StreamFlags
from triodnn.graph import Graph, LogicalTensor, Op, _progress, compile_graph, progress_bar
from triodnn.testing._driver import Progress


def _three_ops() -> Graph:
    """MatMul, ReLU, Concat: a partition each under the debug policy."""
    graph = Graph("cpu")
    graph.add_op(Op(0, "MatMul", [LogicalTensor(0, "f32", (4, 8)), LogicalTensor(1, "f32", (8, 4))],
                    [LogicalTensor(2, "f32", (4, 4))], {}))
    graph.add_op(Op(1, "ReLU", [LogicalTensor(2, "f32", (4, 4))], [LogicalTensor(3, "f32", (4, 4))], {}))
    graph.add_op(Op(2, "Concat", [LogicalTensor(3, "f32", (4, 4)), LogicalTensor(3, "f32", (4, 4))],
                    [LogicalTensor(4, "f32", (8, 4))], {"axis": 0}))
    graph.finalize()
    return graph


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


async def test_compile_graph_reports_each_partition(engine):
    reports = []
    runner = await compile_graph(_three_ops(), engine, policy="debug", progress=lambda *r: reports.append(r))
    assert len(runner.steps) == 3
    assert [(done, n) for done, n, _ in reports] == [(1, 3), (2, 3), (3, 3)]
    assert {what.split(":")[0] for _, _, what in reports} == {f"partition {s.partition.id}" for s in runner.steps}
    out = await runner.run(await engine.stream(StreamFlags.in_order), {0: np.ones((4, 8), np.float32),
                                                                        1: np.ones((8, 4), np.float32)})
    np.testing.assert_array_equal(out[4], np.full((8, 4), 8.0, np.float32))


async def test_progress_true_draws_a_bar_or_a_terminal_line(engine, monkeypatch, capsys):
    if _progress._tqdm is not None:  # tqdm installed (the test extra): its bar, on stderr
        await compile_graph(_three_ops(), engine, progress=True)
        assert "compile_graph" in capsys.readouterr().err
    monkeypatch.setattr(_progress, "_tqdm", None)
    line = progress_bar("compiling")
    assert isinstance(line, _progress._Line) and not line.live  # pytest's stderr is no terminal
    terminal = _Terminal()
    line = _progress._Line("compiling", terminal)
    line(1, 2, "partition 0: MatMul+ReLU")
    assert terminal.getvalue() == "\r" + "compiling: 1/2 partition 0: MatMul+ReLU".ljust(79)
    line(2, 2, "partition 1: Concat")
    assert terminal.getvalue().endswith("\r" + " " * 79 + "\r")  # cleared at the end


async def test_a_bad_progress_value_is_refused_before_anything_compiles(engine):
    with pytest.raises(InvalidArgumentError, match="progress is str; expected True, False, None or a callable"):
        await compile_graph(_three_ops(), engine, progress="yes")


def test_the_command_lines_progress_shows_the_compile_stage():
    terminal = _Terminal()
    progress = Progress(3, terminal)
    progress.stage(2, "mlp.json")(1, 4, "partition 0: MatMul")
    assert terminal.getvalue().startswith("\r[######..............] 2/3 mlp.json compiling 1/4")

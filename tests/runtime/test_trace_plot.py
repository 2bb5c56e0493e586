"""A trace drawn as a Gantt chart (``trace.plot``, ``triodnn.trace.plot``, ``triodnn trace FILE``):
a bar per device span on its lane's row, an arrow per dependency between drawn spans."""

from __future__ import annotations

import json

import numpy as np
import pytest

import triodnn
from triodnn import EltwiseDesc, MemoryDesc, StreamFlags, UnsupportedError
from triodnn._cli import main

# matplotlib is in the test extra; a machine without it (a bare GPU image) skips the drawing.
matplotlib = pytest.importorskip("matplotlib")
matplotlib.use("Agg")


async def _diamond(engine):
    """relu and tanh of one input, then their sum: four device spans (the upload, relu, tanh, the
    add), the add waiting on both branches."""
    desc = MemoryDesc((256,))
    relu = await engine.create_primitive(EltwiseDesc("relu", desc))
    tanh = await engine.create_primitive(EltwiseDesc("tanh", desc))
    add = await engine.create_primitive(triodnn.BinaryDesc("add", desc, desc))
    with triodnn.trace.record() as trace:
        stream = await engine.stream(StreamFlags.out_of_order)
        x, a, b, out = (engine.memory(desc) for _ in range(4))
        wrote = stream.write(x, np.linspace(-1, 1, 256, dtype=np.float32))
        left = stream.execute(relu, {"src": x, "dst": a}, deps=[wrote])
        right = stream.execute(tanh, {"src": x, "dst": b}, deps=[wrote])
        await stream.execute(add, {"src0": a, "src1": b, "dst": out}, deps=[left, right]).wait()
    return trace


def _bars(figure) -> int:
    return sum(len(container) for container in figure.axes[0].containers)


async def test_a_trace_draws_its_device_spans_and_dependencies(engine, tmp_path):
    trace = await _diamond(engine)
    device = [e for e in trace.to_chrome()["traceEvents"] if e["ph"] == "X" and e["cat"] == "device"]
    figure = trace.plot(tmp_path / "gantt.png")
    assert (tmp_path / "gantt.png").stat().st_size > 0
    assert _bars(figure) == len(device) == 4
    # Arrows: write -> relu, write -> tanh, relu -> add, tanh -> add.
    assert len(figure.axes[0].texts) == 4
    rows = [label.get_text() for label in figure.axes[0].get_yticklabels()]
    assert rows and all(row.startswith("stream ") and " lane " in row for row in rows)
    plain = triodnn.trace.plot(trace, arrows=False, show=("device", "host"))
    assert len(plain.axes[0].texts) == 0 and _bars(plain) > 4  # the host's submissions too


async def test_a_saved_trace_draws_from_the_command_line(engine, tmp_path, capsys):
    trace = await _diamond(engine)
    saved = tmp_path / "run.json"
    trace.save(saved)
    assert main(["trace", str(saved)]) == 0
    assert (tmp_path / "run.png").stat().st_size > 0
    assert main(["trace", str(saved), "-o", str(tmp_path / "run.svg"), "--show", "device,tasks", "--no-arrows"]) == 0
    assert (tmp_path / "run.svg").read_text().startswith("<?xml")
    capsys.readouterr()
    assert main(["trace", str(tmp_path / "missing.json")]) == 2
    assert "cannot read" in capsys.readouterr().err


def test_what_cannot_be_drawn_says_why(tmp_path):
    empty = {"traceEvents": [], "displayTimeUnit": "ms"}
    with pytest.raises(UnsupportedError, match="no device spans to draw"):
        triodnn.trace.plot(empty)
    with pytest.raises(UnsupportedError, match=r"show \['gpu'\]: the rows are device, host, tasks"):
        triodnn.trace.plot(empty, show=("gpu",))
    path = tmp_path / "empty.json"
    path.write_text(json.dumps(empty))
    assert main(["trace", str(path)]) == 2  # a TriodnnError: the command's input error

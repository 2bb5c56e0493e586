"""TRIODNN_VERBOSE=2: an exec line per execution, with the device time, once it completes."""

from __future__ import annotations

import numpy as np
import trio
import trio.testing

from triodnn import EltwiseDesc, MemoryDesc


async def test_level_two_prints_exec_lines_with_device_time(rt, monkeypatch, capsys):
    monkeypatch.setenv("TRIODNN_VERBOSE", "2")
    engine = await rt.engine()
    stream = await engine.stream()  # opened at level 2: records device times
    desc = MemoryDesc((4099,))
    relu = await engine.create_primitive(EltwiseDesc("relu", desc))
    src = await engine.from_numpy(np.ones(4099, np.float32))
    dst = engine.memory(desc)
    for _ in range(3):
        await stream.execute(relu, {"src": src, "dst": dst})
    await stream.wait()
    monkeypatch.setenv("TRIODNN_VERBOSE", "0")
    # exec lines print from their own tasks: let every task run until it blocks
    await trio.testing.wait_all_tasks_blocked()
    exec_lines = [line for line in capsys.readouterr().out.splitlines() if ",exec," in line]
    assert len(exec_lines) == 3
    for line in exec_lines:
        fields = line.split(",")
        assert fields[:6] == [
            "triodnn_verbose", "primitive", "exec", f"{engine.kind}:{engine.index}", "eltwise", relu.impl
        ]
        assert fields[6] == "src:f32:4099:s1 dst:f32:4099:s1"
        assert float(fields[8]) >= 0.0


async def test_level_zero_prints_nothing(rt, monkeypatch, capsys):
    monkeypatch.setenv("TRIODNN_VERBOSE", "0")
    engine = await rt.engine()
    stream = await engine.stream()
    desc = MemoryDesc((64,))
    relu = await engine.create_primitive(EltwiseDesc("relu", desc))
    src = await engine.from_numpy(np.ones(64, np.float32))
    await stream.execute(relu, {"src": src, "dst": src})
    assert "triodnn_verbose" not in capsys.readouterr().out

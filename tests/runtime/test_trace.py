"""triodnn.trace: Chrome trace event JSON (Perfetto, chrome://tracing) of submissions, device
spans from OpenCL profiling, primitive creations and builds, and dependency flows."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import triodnn
from triodnn import BinaryDesc, EltwiseDesc, MemoryDesc, StreamFlags, _trace
from triodnn._cli import main

EXAMPLES = sorted((Path(__file__).resolve().parents[2] / "examples" / "graphs").glob("*.json"))
EPS = 0.002  # µs: ts and dur are each rounded to the nanosecond

REQUIRED = {
    "X": {"name", "ph", "pid", "tid", "ts", "dur"},
    "M": {"name", "ph", "pid", "tid", "args"},
    "i": {"name", "ph", "pid", "tid", "ts", "s"},
    "s": {"name", "cat", "ph", "pid", "tid", "ts", "id"},
    "f": {"name", "cat", "ph", "pid", "tid", "ts", "id", "bp"},
}


def validate(doc: dict) -> list[dict]:
    """Chrome's trace event format, as these traces use it; returns the events."""
    assert set(doc) == {"traceEvents", "displayTimeUnit"}
    assert doc["displayTimeUnit"] == "ms"
    json.dumps(doc)  # plain JSON values only
    events = doc["traceEvents"]
    for event in events:
        assert event["ph"] in REQUIRED, event
        missing = REQUIRED[event["ph"]] - set(event)
        assert not missing, (missing, event)
        assert isinstance(event["pid"], int) and isinstance(event["tid"], int)
        if "ts" in event:
            assert event["ts"] >= 0
        if event["ph"] == "X":
            assert event["dur"] >= 0
        if event["ph"] == "M":
            assert event["name"] in ("process_name", "process_sort_index", "thread_name", "thread_sort_index")
    # Complete events nest on every (pid, tid): no partial overlap.
    tracks: dict = {}
    for event in events:
        if event["ph"] == "X":
            tracks.setdefault((event["pid"], event["tid"]), []).append(event)
    for spans in tracks.values():
        spans.sort(key=lambda e: (e["ts"], -e["dur"]))
        open_ends: list[float] = []
        for span in spans:
            while open_ends and open_ends[-1] <= span["ts"] + EPS:
                open_ends.pop()
            end = span["ts"] + span["dur"]
            assert not open_ends or end <= open_ends[-1] + EPS, f"partial overlap at {span}"
            open_ends.append(end)
    # Every track of a complete event is named; so is every process.
    named_threads = {(e["pid"], e["tid"]) for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    named_processes = {e["pid"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    assert set(tracks) <= named_threads
    assert {pid for pid, _ in tracks} <= named_processes
    # Each flow start has exactly one finish of its id, not earlier, and each binds to a slice.
    starts = [e for e in events if e["ph"] == "s"]
    finishes = [e for e in events if e["ph"] == "f"]
    assert sorted(e["id"] for e in starts) == sorted(set(e["id"] for e in starts))
    assert sorted(e["id"] for e in starts) == sorted(e["id"] for e in finishes)
    finish_of = {e["id"]: e for e in finishes}
    for start in starts:
        finish = finish_of[start["id"]]
        assert finish["ts"] >= start["ts"]
        for end in (start, finish):
            assert any(s["ts"] - EPS <= end["ts"] <= s["ts"] + s["dur"] + EPS
                       for s in tracks[(end["pid"], end["tid"])]), end
    return events


def spans(events, cat):
    return [e for e in events if e["ph"] == "X" and e.get("cat") == cat]


def by_command(events, cat):
    return {e["args"]["command"]: e for e in spans(events, cat)}


def thread_names(events) -> dict:
    return {(e["pid"], e["tid"]): e["args"]["name"] for e in events
            if e["ph"] == "M" and e["name"] == "thread_name"}


async def diamond(engine, stream, prims, mems):
    """a -> (b, c) -> d on ``stream``; returns the four events."""
    gelu, add = prims
    src, a, b, c, d = mems
    e1 = stream.execute(gelu, {"src": src, "dst": a})
    e2 = stream.execute(gelu, {"src": a, "dst": b}, deps=[e1])
    e3 = stream.execute(gelu, {"src": a, "dst": c}, deps=[e1])
    e4 = stream.execute(add, {"src0": b, "src1": c, "dst": d}, deps=[e2, e3])
    await e4
    return e1, e2, e3, e4


@pytest.fixture
async def diamond_parts(engine, rng):
    desc = MemoryDesc((16, 64))
    gelu = await engine.create_primitive(EltwiseDesc("gelu_erf", desc))
    add = await engine.create_primitive(BinaryDesc("add", desc, desc))
    src = await engine.from_numpy(rng.uniform(-2, 2, (16, 64)).astype(np.float32))
    mems = (src, *(engine.memory(desc) for _ in range(4)))
    return (gelu, add), mems


async def test_diamond_on_an_out_of_order_stream(engine, diamond_parts):
    prims, mems = diamond_parts
    with triodnn.trace.record() as trace:
        stream = await engine.stream(StreamFlags.out_of_order)
        assert StreamFlags.profiling in stream.flags  # opened while tracing: device times
        await diamond(engine, stream, prims, mems)
    events = validate(trace.to_chrome())
    host, device = by_command(events, "submit"), by_command(events, "device")
    assert len(host) == len(device) == 4
    assert [host[i]["name"] for i in (1, 2, 3, 4)] == ["eltwise:gelu_erf"] * 3 + ["binary:add"]
    assert [host[i]["args"]["deps"] for i in (1, 2, 3, 4)] == [[], [1], [1], [2, 3]]
    # Device spans lie after their host submission, and on the stream's lane tracks.
    names = thread_names(events)
    for command, span in device.items():
        submitted = host[command]
        assert span["ts"] >= submitted["ts"] + submitted["dur"] - EPS
        assert names[(span["pid"], span["tid"])].startswith("stream 1 lane 0")
        assert span["pid"] == submitted["pid"]
    # One flow per dependency edge, from the dependency's device span to the dependent's.
    starts = {e["id"]: e for e in events if e["ph"] == "s"}
    finishes = {e["id"]: e for e in events if e["ph"] == "f"}
    assert len(starts) == len(finishes) == 4

    def command_at(event):
        (match,) = [c for c, s in device.items()
                    if (s["pid"], s["tid"]) == (event["pid"], event["tid"]) and s["ts"] == event["ts"]]
        return match

    edges = sorted((command_at(starts[i]), command_at(finishes[i])) for i in starts)
    assert edges == [(1, 2), (1, 3), (2, 4), (3, 4)]
    # Dependents start on the device after their dependencies end.
    for source, target in edges:
        assert device[target]["ts"] >= device[source]["ts"] + device[source]["dur"] - EPS
    processes = {e["pid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    assert processes[device[1]["pid"]] == f"{engine.kind}:{engine.index} ({engine.info.name.strip()})"


async def test_lanes_name_their_tracks(rt, monkeypatch):
    monkeypatch.setenv("TRIODNN_OOO_STRATEGY", "lanes:2:spread")  # small kernels take lanes too
    lanes_engine = await rt.engine()
    desc = MemoryDesc((16, 64))
    gelu = await lanes_engine.create_primitive(EltwiseDesc("gelu_erf", desc))
    add = await lanes_engine.create_primitive(BinaryDesc("add", desc, desc))
    src = await lanes_engine.from_numpy(np.ones((16, 64), np.float32))
    mems = (src, *(lanes_engine.memory(desc) for _ in range(4)))
    with triodnn.trace.record() as trace:
        stream = await lanes_engine.stream(StreamFlags.out_of_order)
        assert stream.strategy == "lanes"
        events = await diamond(lanes_engine, stream, (gelu, add), mems)
    doc = validate(trace.to_chrome())
    device = by_command(doc, "device")
    names = thread_names(doc)
    lanes = {command: names[(s["pid"], s["tid"])] for command, s in device.items()}
    assert lanes == {i + 1: f"stream 1 lane {e._submission.lane}" for i, e in enumerate(events)}
    assert len({e._submission.lane for e in events}) == 2  # b and c ran on different lanes
    assert sum(e["ph"] == "s" for e in doc) == 4


async def test_a_primitive_created_twice_shows_one_miss_and_one_hit(engine):
    # A descriptor no other test builds: the process-global cache cannot have it yet.
    desc = EltwiseDesc("linear", MemoryDesc((3, 1237)), alpha=0.8125, beta=-0.4375)
    with triodnn.trace.record() as trace:
        first = await engine.create_primitive(desc)
        second = await engine.create_primitive(desc)
    assert first.impl == second.impl
    events = validate(trace.to_chrome())
    created = spans(events, "create")
    assert [s["args"]["outcome"] for s in created] == ["cache_miss", "cache_hit"]
    assert [e["name"] for e in events if e["ph"] == "i"] == ["cache_miss", "cache_hit"]
    builds = spans(events, "build")
    assert [b["name"] for b in builds] == [f"build {desc.label}"]
    names = thread_names(events)
    assert names[(builds[0]["pid"], builds[0]["tid"])] == "builds"
    assert {names[(s["pid"], s["tid"])] for s in created} == {"create_primitive"}
    # The build lies within the creation that missed.
    miss = created[0]
    assert miss["ts"] - EPS <= builds[0]["ts"]
    assert builds[0]["ts"] + builds[0]["dur"] <= miss["ts"] + miss["dur"] + EPS


async def test_tracing_off_records_nothing(engine, diamond_parts):
    prims, mems = diamond_parts
    with triodnn.trace.record() as trace:
        pass
    assert _trace.recorder is None and not trace.recording
    stream = await engine.stream(StreamFlags.out_of_order)
    assert StreamFlags.profiling not in stream.flags
    events = await diamond(engine, stream, prims, mems)
    assert all(type(e) is triodnn.Event for e in events)
    await engine.create_primitive(EltwiseDesc("relu", MemoryDesc((5, 7))))
    doc = validate(trace.to_chrome())
    assert [e for e in doc if e["ph"] != "M"] == []


async def test_a_stream_opened_before_tracing_records_host_spans_only(engine, diamond_parts):
    prims, mems = diamond_parts
    stream = await engine.stream(StreamFlags.out_of_order)
    with triodnn.trace.record() as trace:
        await diamond(engine, stream, prims, mems)
    events = validate(trace.to_chrome())
    assert len(spans(events, "submit")) == 4 and spans(events, "device") == []
    # The dependency edges bind to the host spans instead.
    host = by_command(events, "submit")
    flows = [e for e in events if e["ph"] in "sf"]
    assert len(flows) == 8
    assert all((e["pid"], e["tid"]) == (host[1]["pid"], host[1]["tid"]) for e in flows)


async def test_one_trace_at_a_time_and_save(engine, tmp_path):
    with triodnn.trace.record() as trace:
        with pytest.raises(triodnn.trace.TraceError):
            with triodnn.trace.record():
                pass
        stream = await engine.stream()
        src = await engine.from_numpy(np.arange(8, dtype=np.float32))
        await stream.write(src, np.zeros(8, np.float32))
    path = tmp_path / "trace.json"
    trace.save(path)
    loaded = json.loads(path.read_text())
    assert loaded == json.loads(json.dumps(trace.to_chrome()))
    events = validate(loaded)
    # from_numpy goes through the engine's host stream (opened before: host span only); the
    # write on the stream opened while tracing has a device span too.
    host = by_command(events, "submit")
    assert [s["args"]["op"] for s in host.values()] == ["write", "write"]
    assert list(by_command(events, "device")) == [2]


def test_cli_graph_trace(tmp_path, capsys):
    path = tmp_path / "graph.json"
    assert main(["graph", "--case", str(EXAMPLES[0]), "--trace", str(path)]) == 0
    assert "PASSED" in capsys.readouterr().out
    events = validate(json.loads(path.read_text()))
    tasks = spans(events, "task")
    assert [s["name"] for s in tasks if s["name"].startswith("case ")] == [f"case {EXAMPLES[0]}"]
    assert any(s["name"].startswith("compile partition") for s in tasks)
    assert spans(events, "device") and spans(events, "submit") and spans(events, "create")


def test_public_trace_docs_point_at_no_private_module():
    """``triodnn.trace`` is the public name: its docstrings say what is recorded themselves
    instead of sending readers to ``triodnn._trace``."""
    docs = {"triodnn.trace": triodnn.trace.__doc__}
    docs.update({name: getattr(triodnn.trace, name).__doc__ for name in triodnn.trace.__all__})
    assert docs["triodnn.trace"] and "What is recorded" in docs["triodnn.trace"]
    for name, doc in docs.items():
        assert "triodnn._" not in (doc or ""), name

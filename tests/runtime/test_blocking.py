"""The blocking portal: the runtime in a background thread, driven from plain (sync) code and
from several OS threads at once."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest

import triodnn
from triodnn import EltwiseDesc, MemoryDesc
from triodnn.graph import Tensor, load

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "graphs"


def test_primitives_from_sync_code():
    x = np.linspace(-2, 2, 64, dtype=np.float32).reshape(8, 8)
    with triodnn.start_blocking() as portal:
        engine = portal.engine()
        desc = MemoryDesc((8, 8))
        relu = engine.create_primitive(EltwiseDesc("relu", desc))
        src, dst = engine.from_numpy(x), engine.memory(desc)
        stream = engine.stream(triodnn.StreamFlags.out_of_order)
        event = stream.execute(relu, {"src": src, "dst": dst})
        event.wait()
        assert event.done
        np.testing.assert_array_equal(dst.to_numpy(), np.maximum(x, 0))
        assert isinstance(engine.identity, triodnn.EngineIdentity)  # values come back unwrapped


def test_many_threads_share_one_portal():
    results, errors = {}, []
    with triodnn.start_blocking() as portal:
        engine = portal.engine()
        stream = engine.stream(triodnn.StreamFlags.out_of_order)

        def worker(i: int) -> None:
            try:
                x = np.full((256,), i - 4, dtype=np.float32)
                desc = MemoryDesc((256,))
                prim = engine.create_primitive(EltwiseDesc("linear", desc, alpha=2.0, beta=float(i)))
                src, dst = engine.from_numpy(x), engine.memory(desc)
                for _ in range(5):
                    stream.execute(prim, {"src": src, "dst": dst}).wait()
                results[i] = dst.to_numpy()
            except BaseException as exc:  # reported below, not lost in the thread
                errors.append(exc)

        threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert errors == []
    for i in range(8):
        np.testing.assert_array_equal(results[i], np.full((256,), 2.0 * (i - 4) + i, np.float32))


def test_graph_through_the_portal():
    rng = np.random.default_rng(3)
    graph = load(EXAMPLES / "mlp.json")
    (partition,) = graph.get_partitions()
    with triodnn.start_blocking() as portal:
        engine = portal.engine()
        compiled = portal.run(partition.compile, engine)
        arrays = {lt.id: rng.integers(-2, 3, lt.shape).astype(np.float32) for lt in compiled.inputs}
        ins = [portal.run(Tensor.from_numpy, lt, engine, arrays[lt.id]) for lt in compiled.inputs]
        out = portal.run_sync(Tensor, compiled.outputs[0], engine)
        compiled.execute(engine.stream(), ins, [out]).wait()
        got = out.to_numpy()
    h = np.maximum(arrays[0] @ arrays[1] + arrays[2], 0)
    np.testing.assert_array_equal(got, h @ arrays[3] + arrays[4])


def test_closing_finishes_work_and_refuses_new_calls():
    portal = triodnn.start_blocking()
    engine = portal.engine()
    desc = MemoryDesc((1 << 16,))
    prim = engine.create_primitive(EltwiseDesc("exp", desc))
    src, dst = engine.from_numpy(np.zeros(1 << 16, np.float32)), engine.memory(desc)
    stream = engine.stream()
    for _ in range(20):
        stream.execute(prim, {"src": src, "dst": dst})
    portal.close()
    portal.close()  # idempotent
    with pytest.raises(triodnn.ClosedError, match="portal is closed"):
        portal.engine()


def test_errors_cross_the_portal_with_their_type():
    with triodnn.start_blocking() as portal:
        with pytest.raises(triodnn.EngineNotFoundError):
            portal.engine("gpu", 99)
        engine = portal.engine()
        with pytest.raises(triodnn.InvalidArgumentError, match="alg 'nope'"):
            engine.create_primitive(EltwiseDesc("nope", MemoryDesc((4,))))

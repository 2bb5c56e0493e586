"""triodnn.dask on a LocalCluster of worker processes on this machine: workers warm-started from
a cache blob build nothing and compute what numpy computes, ``client.map`` / ``as_completed`` and
batches work as Dask users write them, errors come back typed through futures, and unregistering
the plugin or closing the cluster shuts the runtimes down."""

from __future__ import annotations

import os

import numpy as np
import pytest

from triodnn import InvalidArgumentError, MissingArgumentError
from triodnn.graph import Graph, LogicalTensor, Op

distributed = pytest.importorskip("distributed")
triodnn_dask = pytest.importorskip("triodnn.dask")

ENGINE = os.environ.get("TRIODNN_ENGINE") or "cpu:0"


def f32(i, shape):
    return LogicalTensor(i, "f32", shape, layout_type="strided")


def mlp_graph() -> Graph:
    """x (8 x 32) @ w (32 x 16) + b -> ReLU -> Tanh."""
    g = Graph("cpu")
    g.add_op(Op(0, "MatMul", [f32(0, [8, 32]), f32(1, [32, 16])], [f32(2, [8, 16])]))
    g.add_op(Op(1, "Add", [f32(2, [8, 16]), f32(3, [1, 16])], [f32(4, [8, 16])]))
    g.add_op(Op(2, "ReLU", [f32(4, [8, 16])], [f32(5, [8, 16])]))
    g.add_op(Op(3, "Tanh", [f32(5, [8, 16])], [f32(6, [8, 16])]))
    return g


W = ((np.arange(32 * 16).reshape(32, 16) % 9 - 4) / 16).astype(np.float32)
B = ((np.arange(16).reshape(1, 16) % 5 - 2) / 4).astype(np.float32)


def request(i: int) -> dict:
    return {0: ((np.arange(8 * 32).reshape(8, 32) % 7 - 3 + i) / 8).astype(np.float32)}


def reference(inputs: dict) -> np.ndarray:
    return np.tanh(np.maximum(inputs[0] @ W + B, 0))


@pytest.fixture
def client():
    """Two worker processes of their own: the primitive cache is process-wide, so a worker that
    ran an earlier test's graph would not be cold."""
    with distributed.LocalCluster(n_workers=2, threads_per_worker=2, processes=True, dashboard_address=":0",
                                  worker_dashboard_address=None) as cluster, distributed.Client(cluster) as c:
        yield c


def test_warm_workers_build_nothing_and_match_numpy(client):
    blob = triodnn_dask.cache_blob({"mlp": mlp_graph()}, engine=ENGINE)
    plugin = triodnn_dask.TriodnnPlugin({"mlp": mlp_graph()}, engines=[ENGINE], cache_blobs={ENGINE: blob},
                                        constants={"mlp": {1: W, 3: B}})
    client.register_plugin(plugin)
    try:
        stats = client.run(triodnn_dask.worker_statistics)
        assert len(stats) == 2
        for worker_stats in stats.values():
            assert worker_stats.programs_built == 0 and worker_stats.programs_loaded > 0
            assert worker_stats.engines and worker_stats.engines[0].startswith(ENGINE.split(":")[0])
        inputs = [request(i) for i in range(16)]
        futures = client.map(triodnn_dask.run_graph, ["mlp"] * len(inputs), inputs, pure=False)
        done = {}
        for future in distributed.as_completed(futures):
            done[futures.index(future)] = future.result()
        for i, outputs in done.items():
            np.testing.assert_allclose(outputs[6], reference(inputs[i]), rtol=1e-5, atol=1e-5)
        assert len(done) == 16
        batches = [inputs[:5], inputs[5:]]
        results = client.gather(client.map(triodnn_dask.map_graph, ["mlp", "mlp"], batches, pure=False))
        flat = [outputs for batch in results for outputs in batch]
        for x, outputs in zip(inputs, flat):
            np.testing.assert_allclose(outputs[6], reference(x), rtol=1e-5, atol=1e-5)
        stats = client.run(triodnn_dask.worker_statistics)
        assert sum(s.requests for s in stats.values()) == 32
        assert all(s.programs_built == 0 for s in stats.values())
    finally:
        client.unregister_worker_plugin("triodnn")


def test_cold_workers_compile_and_errors_come_back_typed(client):
    plugin = triodnn_dask.TriodnnPlugin({"mlp": mlp_graph()}, engines=[ENGINE], constants={"mlp": {1: W, 3: B}})
    client.register_plugin(plugin)
    try:
        assert all(s.programs_built > 0 for s in client.run(triodnn_dask.worker_statistics).values())
        with pytest.raises(MissingArgumentError, match="no graph named 'nope'"):
            client.submit(triodnn_dask.run_graph, "nope", request(0)).result()
        with pytest.raises(MissingArgumentError, match="lack graph input ids"):
            client.submit(triodnn_dask.run_graph, "mlp", {}).result()
        outputs = client.submit(triodnn_dask.run_graph, "mlp", request(3)).result()
        np.testing.assert_allclose(outputs[6], reference(request(3)), rtol=1e-5, atol=1e-5)
    finally:
        client.unregister_worker_plugin("triodnn")
    # Torn down: the workers' runtimes are closed, and a task says so.
    with pytest.raises(InvalidArgumentError, match="no triodnn plugin"):
        client.submit(triodnn_dask.run_graph, "mlp", request(0)).result()


def test_plugin_arguments_are_checked_on_the_client():
    with pytest.raises(InvalidArgumentError, match="non-empty dict"):
        triodnn_dask.TriodnnPlugin({})
    with pytest.raises(InvalidArgumentError, match="KIND"):
        triodnn_dask.TriodnnPlugin({"mlp": mlp_graph()}, engines=["cpu:x"])
    with pytest.raises(InvalidArgumentError, match="does not open"):
        triodnn_dask.TriodnnPlugin({"mlp": mlp_graph()}, engines=["cpu:0"], cache_blobs={"gpu:0": b""})
    with pytest.raises(InvalidArgumentError, match="constants name graphs"):
        triodnn_dask.TriodnnPlugin({"mlp": mlp_graph()}, constants={"other": {}})
    with pytest.raises(InvalidArgumentError, match="not in a Dask worker"):
        triodnn_dask.run_graph("mlp", request(0))

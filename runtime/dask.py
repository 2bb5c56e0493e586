"""triodnn on Dask distributed workers: a worker plugin that starts a runtime in each worker
process, warm-started from engine cache blobs, and task functions that run compiled graphs there.

    from dask.distributed import Client, LocalCluster
    import triodnn.dask

    graph = triodnn.graph.load("mlp.json")
    blob = triodnn.dask.cache_blob({"mlp": graph}, engine="cpu:0")   # compiles once, here
    with LocalCluster(n_workers=2, threads_per_worker=1) as cluster, Client(cluster) as client:
        client.register_plugin(triodnn.dask.TriodnnPlugin({"mlp": graph}, engines=["cpu:0"],
                                                           cache_blobs={"cpu:0": blob}))
        futures = client.map(triodnn.dask.run_graph, ["mlp"] * 64, batches)
        for future in dask.distributed.as_completed(futures):
            outputs = future.result()                                  # {output id: array}

Why Dask: its workers are processes on one machine or many, its ``client.map`` / ``submit`` /
``as_completed`` are what its users already write, and a worker plugin is its hook for per-
process state that outlives tasks (a runtime, compiled graphs, device memory). Ray would serve
as well for actors; Dask is the one the PyData stack reaches for with numpy batches, and it
needs no cluster service of its own.

In each worker process, ``TriodnnPlugin.setup`` starts a blocking portal (``start_blocking``: a
runtime on a thread of its own, so the worker's event loop is never blocked by it), opens the
named engines with their cache blobs (``Runtime.engine(..., cache_blob=)``: the primitives'
binaries, so compiling the graphs builds nothing, and the device facts the blob records, so the
engine skips its probe builds) and compiles every graph into an
``EnginePool`` over the worker's engines. Task functions (``run_graph``, ``map_graph``) find the
plugin through ``distributed.get_worker()`` and run requests through the portal; any number of
the worker's threads may do so at once. ``teardown`` (the worker closing, the cluster shutting
down, the plugin unregistered) closes the portal, which finishes submitted work and ends the
runtime. ``worker_statistics`` (through ``client.run``) reports what setup cost and built.

Graphs travel to the workers as oneDNN graph JSON; blobs as bytes. A blob is for one device
kind and one triodnn version (``CacheBlobError`` otherwise, raised in setup): build it on a
machine whose engines match the workers'.
"""

from __future__ import annotations

import collections.abc
import json
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from . import graph as _graph
from ._blocking import BlockingPortal, start_blocking
from ._runtime import parse_engine_spec
from ._values._errors import InvalidArgumentError, MissingArgumentError

try:
    import distributed
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError("triodnn.dask needs dask's distributed scheduler: pip install 'triodnn[dask]'") from exc

__all__ = ["TriodnnPlugin", "WorkerStatistics", "cache_blob", "map_graph", "run_graph", "worker_statistics"]

PLUGIN_NAME = "triodnn"


@attrs.frozen
class WorkerStatistics:
    """One worker's triodnn runtime: its engines, how long setup took (runtime start, blob
    loads, graph compiles) and the programs it built (0 when the blobs covered every primitive)
    and loaded from the blobs; requests run so far."""

    engines: tuple[str, ...]
    setup_seconds: float
    programs_built: int
    programs_loaded: int
    requests: int


def _graph_json(value) -> str:
    """The graph as JSON, read through ``from_dict`` on the client: a bad graph fails here."""
    if isinstance(value, _graph.Graph):
        return _graph.dumps(value)
    if isinstance(value, str):
        value = json.loads(value)
    if isinstance(value, Mapping):
        return _graph.dumps(_graph.from_dict(dict(value)))
    raise InvalidArgumentError(f"a graph is {type(value).__name__}; expected a triodnn.graph.Graph, its JSON or dict")


def _graph_from_json(text: str) -> _graph.Graph:
    return _graph.from_dict(json.loads(text))


class TriodnnPlugin(distributed.WorkerPlugin):
    """A triodnn runtime in each Dask worker: ``client.register_plugin(TriodnnPlugin(graphs))``.

    ``graphs``: ``{name: Graph, its JSON or dict}``, compiled in every worker with ``policy``.
    ``engines``: engine specs (``"cpu:0"``, ``"gpu:1"``; default the default engine) each worker
    opens; requests spread over them as ``EnginePool`` spreads them. ``{name}`` in a spec is the
    worker's name: ``"gpu:{name}"`` gives LocalCluster's workers 0, 1, ... a GPU each. ``cache_blobs``:
    ``{engine spec: bytes}`` from ``cache_blob`` (or ``Engine.primitive_cache_blob``), loaded
    before the graphs compile so that no worker compiles cold. ``constants``: ``{name: {input id:
    array}}``, given to each graph's pool once (``set_constants``). ``capacity``: requests
    running at once per engine."""

    name = PLUGIN_NAME

    def __init__(self, graphs: Mapping[str, Any], *, engines: Sequence[str] | None = None,
                 cache_blobs: Mapping[str, bytes] | None = None, policy: str = "fusion",
                 constants: Mapping[str, Mapping[int, Any]] | None = None, capacity: int = 4) -> None:
        if not isinstance(graphs, Mapping) or not graphs:
            raise InvalidArgumentError("graphs must be a non-empty dict of name -> graph")
        self.graphs = {str(k): _graph_json(v) for k, v in graphs.items()}
        self.engines = tuple(engines) if engines is not None else (None,)
        for spec in self.engines:
            if spec is not None:  # a typed error here, on the client, not in every worker
                parse_engine_spec(spec.replace("{name}", "0"))
        self.cache_blobs = {str(k): bytes(v) for k, v in (cache_blobs or {}).items()}
        unknown = set(self.cache_blobs) - {s for s in self.engines if s is not None}
        if unknown:
            raise InvalidArgumentError(f"cache_blobs name engines {sorted(unknown)} that engines {list(self.engines)} "
                                       "does not open")
        unknown_constants = set(constants or {}) - set(self.graphs)
        if unknown_constants:
            raise InvalidArgumentError(f"constants name graphs {sorted(unknown_constants)} not in graphs")
        self.constants = {k: dict(v) for k, v in (constants or {}).items()}
        self.policy, self.capacity = policy, capacity
        self._portal: BlockingPortal | None = None
        self._pools: dict[str, Any] = {}
        self._requests = 0
        self._lock = threading.Lock()
        self._stats: WorkerStatistics | None = None

    def __getstate__(self):
        state = dict(self.__dict__)
        state.update(_portal=None, _pools={}, _lock=None, _stats=None, _requests=0)
        return state

    def __setstate__(self, state) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    # -- in the worker -------------------------------------------------------------------------

    def setup(self, worker=None) -> None:
        start = time.perf_counter()
        portal = self._portal = start_blocking()
        try:
            # An engine opened with its blob loads it and skips the device probes it answers.
            worker_name = str(getattr(worker, "name", 0))
            engines = [portal.engine() if spec is None else
                       portal.runtime.engine(*_split(spec.replace("{name}", worker_name)),
                                             cache_blob=self.cache_blobs.get(spec))
                       for spec in self.engines]
            for name, text in self.graphs.items():
                pool = portal.run(_graph.compile_graph_pool, _graph_from_json(text), engines,
                                  policy=self.policy, capacity=self.capacity)
                if name in self.constants:
                    pool.set_constants(self.constants[name])
                self._pools[name] = pool
            built = loaded = 0
            for engine in engines:
                stats = engine.statistics()
                built += stats.programs_built
                loaded += stats.programs_loaded
            self._stats = WorkerStatistics(tuple(portal.run_sync(str, e) for e in engines),
                                           time.perf_counter() - start, built, loaded, 0)
        except BaseException:
            self.teardown(worker)
            raise

    def teardown(self, worker=None) -> None:
        portal, self._portal = self._portal, None
        self._pools = {}
        if portal is not None:
            portal.close()

    def run(self, name: str, inputs) -> dict:
        """One request of graph ``name`` on this worker: ``{output id: array}``."""
        pool = self._pool(name)
        with self._lock:
            self._requests += 1
        return pool.run(inputs)

    def map(self, name: str, batch) -> list[dict]:
        """Requests of graph ``name`` pipelined over this worker's engines: outputs in order.
        A request's error is raised (after the requests before it ran)."""
        pool = self._pool(name)
        batch = list(batch)
        with self._lock:
            self._requests += len(batch)
        return [result.unwrap() for result in pool.map(batch)]

    def statistics(self) -> WorkerStatistics:
        if self._stats is None:
            raise InvalidArgumentError("the triodnn plugin has not been set up in this process")
        return attrs.evolve(self._stats, requests=self._requests)

    def _pool(self, name: str):
        if self._portal is None:
            raise InvalidArgumentError("the triodnn plugin is not set up in this process (or was torn down)")
        pool = self._pools.get(name)
        if pool is None:
            raise MissingArgumentError(f"no graph named {name!r} on this worker (graphs: {sorted(self._pools)})")
        return pool


def _split(spec: str) -> tuple[str, int]:
    kind, index = parse_engine_spec(spec)
    return kind, index or 0


def _plugin(worker=None) -> TriodnnPlugin:
    if worker is None:
        try:
            worker = distributed.get_worker()
        except ValueError:
            raise InvalidArgumentError("not in a Dask worker: call this in a task (client.submit / client.map)") from None
    plugin = worker.plugins.get(PLUGIN_NAME)
    if not isinstance(plugin, TriodnnPlugin):
        raise InvalidArgumentError("the worker has no triodnn plugin: client.register_plugin(TriodnnPlugin(...))")
    return plugin


def run_graph(name: str, inputs) -> dict:
    """Task function: one request of graph ``name`` on the worker's runtime,
    ``client.submit(run_graph, "mlp", {0: x})`` -> ``{output id: array}``."""
    return _plugin().run(name, inputs)


def map_graph(name: str, batch) -> list[dict]:
    """Task function: a batch of requests (a list of input dicts) of graph ``name``, pipelined
    over the worker's engines; their outputs in order."""
    if not isinstance(batch, collections.abc.Iterable):
        raise InvalidArgumentError(f"batch is {type(batch).__name__}; expected a list of input dicts")
    return _plugin().map(name, batch)


def worker_statistics(dask_worker=None) -> WorkerStatistics:
    """This worker's ``WorkerStatistics``: ``client.run(triodnn.dask.worker_statistics)`` gives
    ``{worker address: WorkerStatistics}``."""
    return _plugin(dask_worker).statistics()


def cache_blob(graphs: Mapping[str, Any], *, engine: str | None = None, policy: str = "fusion") -> bytes:
    """Compile ``graphs`` on ``engine`` (a spec; default the default engine) in a runtime of this
    process and return a primitive cache blob of their primitives: what ``TriodnnPlugin`` ships
    to the workers so that they compile nothing. Only these graphs' programs go in, whatever
    else this process compiled before."""
    with start_blocking() as portal:
        eng = portal.engine() if engine is None else portal.engine(*_split(engine))
        primitives = []
        for value in graphs.values():
            runner = portal.run(_graph.compile_graph, _graph_from_json(_graph_json(value)), eng, policy=policy)
            primitives += [p for compiled in runner.compiled_partitions for p in compiled.primitives]
        return eng.primitive_cache_blob(primitives)

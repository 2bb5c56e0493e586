"""bench_dask: a Dask worker warm-started from an engine cache blob against one that compiles
cold.

For each graph (bench_graph's MLP 64x1024 x3 and SDPA 1x8x128x64, fused): a fresh LocalCluster
of one worker process per sample, the request's inputs scattered to it first; timing: wall time
from ``client.register_plugin`` (the worker starts its triodnn runtime, loads the blob or not,
compiles the graph) to the first ``run_graph`` result back on the client; cold and warm alternating, median of R. The worker
processes run with PoCL's own kernel cache off (``POCL_KERNEL_CACHE=0``, set before the cluster
starts), so a cold worker really compiles; the blob is made once, in this process, by
``triodnn.dask.cache_blob``. Reported beside each: the programs each worker built and loaded
(``worker_statistics``), and every first result checked against numpy's float64 reference.

    pip install 'dask[distributed]'
    python benchmarks/bench_dask.py [--engine cpu:0] [--reps 5]
"""

from __future__ import annotations

import os
import time

os.environ.setdefault("POCL_KERNEL_CACHE", "0")  # before anything loads PoCL, here and in workers

import _common as common  # noqa: E402
import bench_graph  # noqa: E402
import bench_pool  # noqa: E402

from triodnn.testing import make_inputs  # noqa: E402

try:  # optional peers
    import distributed

    import triodnn.dask as triodnn_dask
except ImportError:  # pragma: no cover - depends on the machine
    distributed = None


def extra_args(parser) -> None:
    parser.add_argument("--reps", type=int, default=None, help="samples per variant, R (default 5, quick 1)")
    parser.add_argument("--case", action="append", choices=("mlp", "sdpa"), help="graph (repeatable; default both)")
    parser.add_argument("--scale", type=int, default=None, metavar="W",
                        help="instead: throughput of W workers against one, each worker on engine KIND:{name} "
                             "(a GPU each) for a GPU engine, on the engine for a CPU one")
    parser.add_argument("--requests", type=int, default=None, help="--scale: requests per sample (default 400)")
    parser.add_argument("--batch", type=int, default=20, help="--scale: requests per map_graph task")
    parser.add_argument("--on-workers", action="store_true",
                        help="--scale: scatter the batches to the workers and leave the results there until "
                             "the clock stops (the client's feeding untimed)")


def throughput(name, graph, constants, sets, spec, workers, n, batch, on_workers) -> tuple[float, list]:
    """Requests per second of ``workers`` worker processes: time from the first submission to the
    last result of ``n`` requests in ``map_graph`` tasks of ``batch``, after one warm-up task per
    worker (cluster start, plugin setup and first launches not timed). ``on_workers``: the
    batches are scattered to the workers before the clock starts and the results stay there until
    it stops (then gathered for the check)."""
    with distributed.LocalCluster(n_workers=workers, threads_per_worker=1, processes=True, dashboard_address=":0",
                                  worker_dashboard_address=None) as cluster, distributed.Client(cluster) as client:
        client.register_plugin(triodnn_dask.TriodnnPlugin({name: graph}, engines=[spec], constants={name: constants}))
        warm = [client.submit(triodnn_dask.map_graph, name, sets[:1], pure=False, workers=[w])
                for w in client.scheduler_info()["workers"]]
        client.gather(warm)
        batches = [[sets[(i + j) % len(sets)] for j in range(batch)] for i in range(0, n, batch)]
        if on_workers:
            batches = client.scatter(batches)  # round robin over the workers
            distributed.wait(batches)
        t0 = time.perf_counter()
        futures = client.map(triodnn_dask.map_graph, [name] * len(batches), batches, pure=False)
        if on_workers:
            distributed.wait(futures)
            elapsed = time.perf_counter() - t0
            return n / elapsed, [out for outs in client.gather(futures) for out in outs]
        results = [out for outs in client.gather(futures) for out in outs]
        return n / (time.perf_counter() - t0), results


def scale(args, spec) -> None:
    n, reps = args.requests or 400, args.reps or 3
    kind = spec.split(":")[0]
    worker_spec = f"{kind}:{{name}}" if kind == "gpu" else spec
    print(f"== bench_dask --scale {args.scale}: requests/s of {args.scale} workers against one\n"
          f"   each worker: one process, engine {worker_spec}; {n} requests in map_graph tasks of {args.batch}, "
          f"weights / scale and mask given once per worker (constants)"
          f"{'; inputs scattered to the workers first, results left there until the clock stops' if args.on_workers else ''}"
          f"; command: {common.command_line()}\n"
          f"   timing: wall time from the first submission to the last result, one fresh cluster per sample, "
          f"variants alternating, median of {reps}")
    rows, results = [], {}
    for case in args.case or ["mlp", "sdpa"]:
        graph = getattr(bench_graph, case)()
        constants, sets, refs = bench_pool.serving_inputs(case, graph)
        samples = {1: [], args.scale: []}
        for rep in range(reps):
            for workers in common.rotated([1, args.scale], rep):
                rate, outs = throughput(case, graph, constants, sets, worker_spec, workers, n, args.batch,
                                        args.on_workers)
                for i, outputs in enumerate(outs):
                    for lt in graph.output_tensors():
                        problem = bench_graph.mismatch(graph, refs[i % len(sets)], lt.id, outputs[lt.id])
                        if problem:
                            raise SystemExit(f"{case}, {workers} workers, request {i}: {problem}")
                samples[workers].append(rate)
        one, many = common.median(samples[1]), common.median(samples[args.scale])
        rows.append([case, one, many, many / one])
        results[case] = {"one_req_per_s": one, "many_req_per_s": many, "speedup": many / one, "workers": args.scale}
    common.print_table(["graph", "1 worker req/s", f"{args.scale} workers req/s", "ratio"], rows)
    common.write_json(args.json, "bench_dask_scale", None, args, results)


def first_result(name, graph, inputs, spec, blob) -> tuple[float, object, dict]:
    with distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=True, dashboard_address=":0",
                                  worker_dashboard_address=None) as cluster, distributed.Client(cluster) as client:
        plugin = triodnn_dask.TriodnnPlugin({name: graph}, engines=[spec],
                                            cache_blobs={spec: blob} if blob is not None else None)
        # The inputs (12 MB for the MLP, its weights included) go to the worker first, as Dask's
        # guide says to send large data: the clock times the runtime's start, not the copy.
        (on_worker,) = client.scatter([inputs])
        t0 = time.perf_counter()
        client.register_plugin(plugin)
        outputs = client.submit(triodnn_dask.run_graph, name, on_worker, pure=False).result()
        elapsed = time.perf_counter() - t0
        (stats,) = client.run(triodnn_dask.worker_statistics).values()
    return elapsed, stats, outputs


def main() -> None:
    args = common.parse_args(__doc__.splitlines()[0], extra_args)
    if distributed is None:
        raise SystemExit("bench_dask needs dask's distributed scheduler: pip install 'dask[distributed]'")
    spec = f"{args.engine_kind}:{args.engine_index}"
    if args.scale:
        scale(args, spec)
        return
    reps = args.reps or (1 if args.quick else 5)
    print(f"== bench_dask: time to a worker's first result, warm (cache blob) vs cold\n"
          f"   engine {spec} in each worker; POCL_KERNEL_CACHE={os.environ['POCL_KERNEL_CACHE']}; "
          f"command: {common.command_line()}\n"
          f"   timing: wall time from register_plugin to the first run_graph result, one fresh worker "
          f"process per sample, cold and warm alternating, median of {reps}")
    rows, results = [], {}
    for case in args.case or ["mlp", "sdpa"]:
        graph = getattr(bench_graph, case)()
        inputs = make_inputs(graph, seed=1)
        ref = bench_graph.graph_reference(graph, inputs)
        blob = triodnn_dask.cache_blob({case: graph}, engine=spec)
        samples = {"cold": [], "warm": []}
        setups = {"cold": [], "warm": []}
        builds = {"cold": set(), "warm": set()}
        loads = {"cold": set(), "warm": set()}
        for rep in range(reps):
            for variant in common.rotated(["cold", "warm"], rep):
                elapsed, stats, outputs = first_result(case, graph, inputs, spec, blob if variant == "warm" else None)
                for lt in graph.output_tensors():
                    problem = bench_graph.mismatch(graph, ref, lt.id, outputs[lt.id])
                    if problem:
                        raise SystemExit(f"{case}, {variant}: {problem}")
                samples[variant].append(elapsed)
                setups[variant].append(stats.setup_seconds)
                builds[variant].add(stats.programs_built)
                loads[variant].add(stats.programs_loaded)
        cold, warm = common.median(samples["cold"]), common.median(samples["warm"])
        rows.append([case, cold * 1e3, warm * 1e3, cold / warm, common.median(setups["cold"]) * 1e3,
                     common.median(setups["warm"]) * 1e3, sorted(builds["cold"]), sorted(builds["warm"]),
                     sorted(loads["warm"])])
        results[case] = {"cold_ms": cold * 1e3, "warm_ms": warm * 1e3, "speedup": cold / warm,
                         "cold_builds": sorted(builds["cold"]), "warm_builds": sorted(builds["warm"])}
    common.print_table(["graph", "cold ms", "warm ms", "cold ÷ warm", "of which setup cold", "setup warm",
                        "programs built cold", "built warm", "loaded warm"], rows)
    common.write_json(args.json, "bench_dask", None, args, results)


if __name__ == "__main__":
    main()

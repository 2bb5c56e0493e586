"""bench_dask: a Dask worker warm-started from an engine cache blob against one that compiles
cold (issue 20).

For each graph (bench_graph's MLP 64x1024 x3 and SDPA 1x8x128x64, fused): a fresh LocalCluster
of one worker process per sample; timing: wall time from ``client.register_plugin`` (the
worker starts its triodnn runtime, loads the blob or not, compiles the graph) to the first
``run_graph`` result back on the client; cold and warm alternating, median of R. The worker
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

from triodnn.testing import make_inputs  # noqa: E402

try:  # optional peers
    import distributed

    import triodnn.dask as triodnn_dask
except ImportError:  # pragma: no cover - depends on the machine
    distributed = None


def extra_args(parser) -> None:
    parser.add_argument("--reps", type=int, default=None, help="samples per variant, R (default 5, quick 1)")
    parser.add_argument("--case", action="append", choices=("mlp", "sdpa"), help="graph (repeatable; default both)")


def first_result(name, graph, inputs, spec, blob) -> tuple[float, object, dict]:
    with distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=True, dashboard_address=":0",
                                  worker_dashboard_address=None) as cluster, distributed.Client(cluster) as client:
        plugin = triodnn_dask.TriodnnPlugin({name: graph}, engines=[spec],
                                            cache_blobs={spec: blob} if blob is not None else None)
        t0 = time.perf_counter()
        client.register_plugin(plugin)
        outputs = client.submit(triodnn_dask.run_graph, name, inputs, pure=False).result()
        elapsed = time.perf_counter() - t0
        (stats,) = client.run(triodnn_dask.worker_statistics).values()
    return elapsed, stats, outputs


def main() -> None:
    args = common.parse_args(__doc__.splitlines()[0], extra_args)
    if distributed is None:
        raise SystemExit("bench_dask needs dask's distributed scheduler: pip install 'dask[distributed]'")
    reps = args.reps or (1 if args.quick else 5)
    spec = f"{args.engine_kind}:{args.engine_index}"
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

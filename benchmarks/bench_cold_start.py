"""bench_cold_start: where a new process's time to its first result goes, cold and from a cache
blob (the breakdown behind bench_dask.py's cold and warm workers).

Each sample is a fresh Python process with PoCL's kernel cache off (``POCL_KERNEL_CACHE=0``) that
times, in order: ``import triodnn``; opening the runtime; opening the engine (cold: plainly,
which runs the device probes; warm: ``runtime.engine(cache_blob=...)``); ``compile_graph``; the
first run and a second run of the graph on one stream (wall time of each awaited); then
``engine.primitive_cache_blob()``, which reads every binary: on PoCL a compile of each kernel
once more, for any work-group size, which every build paid until binaries became a read on
demand (cold processes: that cost, beside the compile it once added to). The first result is
checked against numpy's float64 reference. Cold and warm processes alternate; medians
of R. The blob is written first by one more process that compiles the graph.

A third kind of process, "cold, no idle context", is a cold one with ``TRIODNN_IDLE_CONTEXTS=0``:
the device probe's context is released instead of kept for the engine, as before the context
pool, so the engine's first build loads PoCL's built-in library into a new LLVM context again.

    python benchmarks/bench_cold_start.py [--engine cpu:0] [--case mlp] [--reps 5]
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

import _common as common

CHILD = r"""
import json, os, sys, time
t0 = time.perf_counter()
import trio, triodnn, triodnn.graph
parts = {"import": time.perf_counter() - t0}
sys.path.insert(0, os.path.dirname(os.path.abspath(sys.argv[1])))
import bench_graph
from triodnn.testing import make_inputs

async def main(mode, case, kind, index, path):
    t = time.perf_counter()
    async with triodnn.open_runtime() as rt:
        parts["runtime"] = time.perf_counter() - t
        t = time.perf_counter()
        if mode == "warm":
            with open(path, "rb") as f:
                engine = await rt.engine(kind, index, cache_blob=f.read())
        else:
            engine = await rt.engine(kind, index)
        parts["engine"] = time.perf_counter() - t
        graph = getattr(bench_graph, case)()
        t = time.perf_counter()
        runner = await triodnn.graph.compile_graph(graph, engine)
        parts["compile"] = time.perf_counter() - t
        stream = await engine.stream()
        inputs = make_inputs(graph, seed=1)
        for name in ("first run", "second run"):
            t = time.perf_counter()
            outputs = await runner.run(stream, inputs)
            parts[name] = time.perf_counter() - t
        ref = bench_graph.graph_reference(graph, inputs)
        for lt in graph.output_tensors():
            problem = bench_graph.mismatch(graph, ref, lt.id, outputs[lt.id])
            assert problem is None, problem
        t = time.perf_counter()
        blob = engine.primitive_cache_blob()
        parts["blob"] = time.perf_counter() - t
        if mode == "save":
            with open(path, "wb") as f:
                f.write(blob)
        stats = engine.statistics()
        parts["programs built"] = stats.programs_built
        parts["total"] = time.perf_counter() - t0
    print(json.dumps(parts))

trio.run(main, sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]), sys.argv[6])
"""

PARTS = ("import", "runtime", "engine", "compile", "first run", "second run", "blob", "total")


def extra_args(parser) -> None:
    parser.add_argument("--reps", type=int, default=None, help="processes per variant, R (default 5, quick 1)")
    parser.add_argument("--case", action="append", choices=("mlp", "sdpa"), help="graph (repeatable; default both)")


def child(mode: str, case: str, args, path: str) -> dict:
    env = dict(os.environ, POCL_KERNEL_CACHE="0")
    if mode == "cold, no idle context":
        mode, env["TRIODNN_IDLE_CONTEXTS"] = "cold", "0"
    here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bench_graph.py")
    done = subprocess.run([sys.executable, "-c", CHILD, here, mode, case, args.engine_kind, str(args.engine_index),
                           path], capture_output=True, text=True, env=env, timeout=600)
    if done.returncode != 0:
        raise SystemExit(f"{case} {mode}: the process failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    args = common.parse_args(__doc__.splitlines()[0], extra_args)
    reps = args.reps or (1 if args.quick else 5)
    print(f"== bench_cold_start: a fresh process's parts, cold and from a cache blob; POCL_KERNEL_CACHE=0\n"
          f"   engine {args.engine}; command: {common.command_line()}\n"
          f"   timing: wall time of each part in one process, cold and warm processes alternating, median of {reps}")
    rows, results = [], {}
    with tempfile.TemporaryDirectory() as tmp:
        for case in args.case or ["mlp", "sdpa"]:
            path = os.path.join(tmp, f"{case}.blob")
            child("save", case, args, path)
            samples: dict[str, list[dict]] = {"cold": [], "cold, no idle context": [], "warm": []}
            for rep in range(reps):
                for mode in common.rotated(list(samples), rep):
                    samples[mode].append(child(mode, case, args, path))
            for mode, runs in samples.items():
                medians = {p: common.median([r[p] for r in runs]) * 1e3 for p in PARTS}
                built = sorted({r["programs built"] for r in runs})
                rows.append([case, mode, *(medians[p] for p in PARTS), built])
                results[f"{case} {mode}"] = {**medians, "programs_built": built}
    common.print_table(["graph", "process", *(f"{p} ms" for p in PARTS), "programs built"], rows)
    common.write_json(args.json, "bench_cold_start", None, args, results)


if __name__ == "__main__":
    main()

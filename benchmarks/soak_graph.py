"""Soak: run one compiled graph N times in a loop and watch for leaks.

    python benchmarks/soak_graph.py                       # 100000 executions of examples/graphs/mlp.json
    python benchmarks/soak_graph.py -n 20000 --every 1000 --mode runner --graph path.json

Every ``--every`` executions it samples the process RSS (``/proc/self/statm``; the peak from
``resource.getrusage`` where there is no /proc), the engine's live OpenCL buffers and bytes
(``engine.statistics()``) and the live pyopencl objects the garbage collector tracks; at the end
it prints each figure's least-squares slope per 1000 executions over the samples after warm-up
(the first ``--warmup`` fraction). A leak-free run has a buffer slope of exactly 0 and an RSS
slope near 0.

``--mode partition`` (default) executes the compiled partition on the same tensors;
``--mode runner`` goes through ``compile_graph`` and ``runner.run``, which uploads the inputs
and allocates every intermediate and output afresh on each run.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import sys
import time
from pathlib import Path

import numpy as np
import pyopencl as cl
import trio

import triodnn
import triodnn.graph as tg

MLP = Path(__file__).resolve().parents[1] / "examples" / "graphs" / "mlp.json"
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_CL_TYPES = tuple(t for t in (getattr(cl, n, None) for n in (
    "Buffer", "Event", "NannyEvent", "UserEvent", "Kernel", "Program", "CommandQueue", "MemoryObject",
)) if isinstance(t, type))


def rss_bytes() -> int:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * _PAGE
    except OSError:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return peak if sys.platform == "darwin" else peak * 1024


def live_cl_objects() -> int:
    return sum(1 for o in gc.get_objects() if isinstance(o, _CL_TYPES))


def slope_per_1000(xs, ys) -> float:
    """Least-squares slope of ys over xs, per 1000 units of x."""
    x = np.asarray(xs, dtype=np.float64)
    y = np.asarray(ys, dtype=np.float64)
    if len(x) < 2 or np.ptp(x) == 0 or np.ptp(y) == 0:
        return 0.0  # a constant series has slope exactly 0 (polyfit would give float noise)
    return float(np.polyfit(x, y, 1)[0] * 1000.0)


async def soak(executions: int = 100_000, every: int = 1000, graph_path=MLP, mode: str = "partition",
               warmup: float = 0.2, engine_name: str | None = None, progress=None) -> dict:
    """``engine_name`` like ``gpu:0``; None takes the default engine ($TRIODNN_ENGINE, else the
    first working CPU device), as the test suite does."""
    rng = np.random.default_rng(0)
    graph = tg.load(graph_path)
    samples: list[dict] = []
    async with triodnn.open_runtime() as rt:
        if engine_name is None:
            engine = await rt.engine()
        else:
            kind, _, index = engine_name.partition(":")
            engine = await rt.engine(kind, int(index or 0))
        stream = await engine.stream()
        if mode == "partition":
            partitions = graph.get_partitions()
            if len(partitions) != 1:
                raise SystemExit(f"--mode partition needs a graph of one partition; {graph_path} has "
                                 f"{len(partitions)} (use --mode runner)")
            compiled = await partitions[0].compile(engine)
            arrays = {lt.id: rng.standard_normal(lt.shape).astype(np.float32) for lt in compiled.inputs}
            inputs = [await tg.Tensor.from_numpy(lt, engine, arrays[lt.id]) for lt in compiled.inputs]
            outputs = [tg.Tensor(lt, engine) for lt in compiled.outputs]

            async def once():
                await compiled.execute(stream, inputs, outputs)
        else:
            runner = await tg.compile_graph(graph, engine)
            arrays = {lt.id: rng.standard_normal(lt.shape).astype(np.float32) for lt in runner.inputs}

            async def once():
                await runner.run(stream, arrays)

        def sample(i: int, t0: float) -> None:
            s = engine.statistics()
            samples.append({"executions": i, "seconds": time.perf_counter() - t0, "rss": rss_bytes(),
                            "live_buffers": s.live_buffers, "live_bytes": s.live_bytes,
                            "cl_objects": live_cl_objects()})
            if progress is not None:
                progress(samples[-1])

        t0 = time.perf_counter()
        sample(0, t0)
        for i in range(1, executions + 1):
            await once()
            if i % every == 0 or i == executions:
                sample(i, t0)
        await stream.wait()
    first = int(len(samples) * warmup)
    steady = samples[first:]
    xs = [s["executions"] for s in steady]
    result = {
        "graph": str(graph_path), "mode": mode, "executions": executions, "every": every,
        "seconds": samples[-1]["seconds"],
        "us_per_execution": samples[-1]["seconds"] / max(executions, 1) * 1e6,
        "warmup_samples": first,
        "rss_first": samples[0]["rss"], "rss_last": samples[-1]["rss"],
        "slope_rss_bytes_per_1000": slope_per_1000(xs, [s["rss"] for s in steady]),
        "slope_live_buffers_per_1000": slope_per_1000(xs, [s["live_buffers"] for s in steady]),
        "slope_live_bytes_per_1000": slope_per_1000(xs, [s["live_bytes"] for s in steady]),
        "slope_cl_objects_per_1000": slope_per_1000(xs, [s["cl_objects"] for s in steady]),
        "live_buffers_steady": sorted({s["live_buffers"] for s in steady}),
        "cl_objects_steady": sorted({s["cl_objects"] for s in steady}),
        "samples": samples,
    }
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", "--executions", type=int, default=100_000)
    parser.add_argument("--every", type=int, default=1000, help="sample every K executions")
    parser.add_argument("--graph", default=str(MLP))
    parser.add_argument("--mode", choices=("partition", "runner"), default="partition")
    parser.add_argument("--warmup", type=float, default=0.2, help="fraction of samples left out of the slopes")
    parser.add_argument("--engine", default=None, help="engine spec such as gpu:0 (default: the default engine)")
    parser.add_argument("--json", metavar="PATH")
    parser.add_argument("--quiet", action="store_true")
    args = parser.parse_args()

    def progress(s):
        if not args.quiet:
            print(f"{s['executions']:>8} exec {s['seconds']:8.1f} s  rss {s['rss'] / 2**20:8.1f} MiB  "
                  f"buffers {s['live_buffers']:4d} ({s['live_bytes']:>9d} B)  cl objects {s['cl_objects']}",
                  flush=True)

    result = trio.run(lambda: soak(args.executions, args.every, args.graph, args.mode, args.warmup,
                                   args.engine, progress))
    summary = {k: v for k, v in result.items() if k != "samples"}
    for key, value in summary.items():
        print(f"{key:32s} {value}")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()

"""Primitive cache: a hit against real builds, coalesced builds, the trio thread while builds run,
and a new process started from a cache blob.

Misses are measured in child processes (this script again, ``--child-mode ...``) so that PoCL's
environment is set before PoCL initialises: ``POCL_KERNEL_CACHE=0 PYOPENCL_NO_CACHE=1`` for
honest misses (on NVIDIA also ``CUDA_CACHE_DISABLE=1``), or PoCL's disk cache on in a fresh
temporary ``POCL_CACHE_DIR`` (``CUDA_CACHE_PATH``) that this run fills itself. Each child prints
its results as one JSON line; the parent runs the children one at a time (never two at once on
two cores), alternating kinds, and prints each child command once. The capacity env vars are
removed from the children's environment (capacity 1024).

1. hit vs miss -- ``create_primitive`` of gelu_erf / relu on 4096 f32 and a binary add (rotated
   so each is the first build of some process):
   * cold miss: a key the process never saw, PoCL's cache off: program build + warm-up launch.
     The first build in a process also pays PoCL/LLVM start-up; reported apart.
   * PoCL-warm rebuild: a miss while PoCL's disk cache holds the kernel (a priming child filled
     the directory): in a new process, and in the same process after
     ``set_primitive_cache_capacity(0)`` then back to 1024.
   * hit: a key already cached, same engine: median over many calls, in each child (ratios are
     per child: its miss ÷ its own hit median), and in this process.
   Goals: hit >= 10,000x faster than a cold miss, >= 1000x than a PoCL-warm rebuild.
2. coalescing -- 1000 trio tasks started together, each ``await engine.create_primitive(same
   desc)`` of a key not cached, against one task creating another new key (fresh gelu_erf sizes
   each repetition, the two variants alternating first); wall time from spawning to the
   nursery's exit. Checks: misses +1, coalesced waits + hits == 999, programs_built +1, one
   kernel object for all 1000. PoCL cache off, and PoCL-warm (keys built once, then capacity 0
   and back). Goal: ratio <= 1.2x, exactly one build.
3. heartbeat -- a trio task loops ``await trio.sleep(0.001)`` and records the gaps between its
   wake-ups while 16 tasks create 16 new keys, against the same heartbeat with nothing building.
   PoCL cache off; and on (a fresh directory: kernels new to it, then the same keys rebuilt after
   capacity 0, which PoCL's cache serves). A raw-pyopencl section attributes the gaps: one build
   at a time in a worker thread (build, warm-up launch, ``program.binaries``) with the heartbeat
   on, and the longest stall inside each step; then a built program dropped on the trio thread
   while another build runs. Goal: largest and p99 gap <= 10 ms.
4. blob warm start -- a child creates N primitives cold (PoCL cache off) and writes
   ``engine.primitive_cache_blob()`` to a temporary file; the next child (PoCL cache off too)
   ``await engine.load_primitive_cache_blob(blob)`` then creates the same N. Reported: time to
   have the N primitives, programs built vs loaded, cache hits. Skipped with a message when the
   engine has no blob API.

Every primitive the children create for the headline keys is executed and checked against numpy.
"""

from __future__ import annotations

import time

_T0 = time.perf_counter()  # a child's "ready" clock starts here, before the heavy imports

import argparse
import gc
import json
import os
import shlex
import shutil
import sys
import tempfile

import _common as common
import numpy as np
import pyopencl as cl
import trio

import triodnn
from triodnn.kernels import binary as binary_kernels
from triodnn.kernels import eltwise as eltwise_kernels
from triodnn.kernels import program_source, tolerance

perf = time.perf_counter
CHILD_MARK = "bench_cache child result: "
CAPACITY_ENV_VARS = (
    "TRIODNN_PRIMITIVE_CACHE_CAPACITY", "ONEDNN_PRIMITIVE_CACHE_CAPACITY", "DNNL_PRIMITIVE_CACHE_CAPACITY",
)

# Descriptors as JSON-able specs: (kind, alg, elements).
HEADLINE = [("eltwise", "gelu_erf", 4096), ("eltwise", "relu", 4096), ("binary", "add", 4096)]
BLOB_SPECS = [
    ("eltwise", "gelu_erf", 4096), ("eltwise", "relu", 4096), ("eltwise", "tanh", 4096),
    ("eltwise", "sigmoid", 4096), ("eltwise", "exp", 4096), ("eltwise", "square", 4096),
    ("binary", "add", 4096), ("binary", "mul", 4096),
]
HEARTBEAT_ALGS = ["relu", "gelu_erf", "tanh", "sigmoid", "exp", "abs", "square", "gelu_tanh"]


def extra_args(parser) -> None:
    parser.add_argument("--sections", default="1,2,3,4", help="which sections to run (default 1,2,3,4)")
    parser.add_argument("--reps", type=int, default=None,
                        help="child processes per miss variant (section 1) and blob pairs (section 4); "
                             "default 3, --quick 1")
    parser.add_argument("--concurrent", type=int, default=1000, help="tasks creating one key (1000)")
    parser.add_argument("--concurrent-reps", type=int, default=None,
                        help="single/concurrent pairs per child (default 7, --quick 2)")
    parser.add_argument("--builds", type=int, default=None,
                        help="primitives building during the heartbeat (default 16, --quick 8)")
    parser.add_argument("--blob-n", type=int, default=len(BLOB_SPECS), help="primitives in the blob (8)")
    parser.add_argument("--child-mode", choices=sorted(CHILD_MODES), help=argparse.SUPPRESS)
    parser.add_argument("--child-arg", default="{}", help=argparse.SUPPRESS)


def make_desc(spec):
    kind, alg, n = spec
    md = triodnn.MemoryDesc((int(n),))
    if kind == "eltwise":
        return triodnn.EltwiseDesc(alg, md)
    if kind == "binary":
        return triodnn.BinaryDesc(alg, md, md)
    raise ValueError(f"unknown descriptor kind {kind!r}")


def spec_label(spec) -> str:
    kind, alg, n = spec
    return f"{kind}:{alg} {n}"


def cache_stats() -> dict:
    s = triodnn.primitive_cache_statistics()
    return {"hits": s.hits, "misses": s.misses, "coalesced": s.coalesced_waits, "size": s.size,
            "evictions": s.evictions, "failed": s.failed_builds}


def delta(after: dict, before: dict) -> dict:
    return {k: after[k] - before[k] for k in after}


def reset_cache() -> None:
    """Capacity 0 then back: every key misses again (PoCL's own cache may still serve the build)."""
    capacity = triodnn.get_primitive_cache_capacity()
    triodnn.set_primitive_cache_capacity(0)
    triodnn.set_primitive_cache_capacity(capacity)


# -- correctness ---------------------------------------------------------------------------------


async def check_primitives(engine, primitives, seed: int = 0) -> list[dict]:
    """Run each primitive once and compare with the numpy reference (benchdnn-style threshold)."""
    rng = np.random.default_rng(seed)
    stream = await engine.stream()
    checks = []
    for primitive in primitives:
        desc = primitive.desc
        if isinstance(desc, triodnn.EltwiseDesc):
            lo = 0.1 if desc.alg in ("log", "sqrt") else -3.0
            host = {"src": rng.uniform(lo, 3.0, desc.src.dims).astype(np.float32)}
        else:
            host = {"src0": rng.uniform(-3.0, 3.0, desc.src0.dims).astype(np.float32),
                    "src1": (rng.uniform(0.5, 3.0, desc.src1.dims)
                             * rng.choice([-1.0, 1.0], desc.src1.dims)).astype(np.float32)}
        memories = {name: await engine.from_numpy(a, desc.arg_descs[name]) for name, a in host.items()}
        dst = engine.memory(desc.dst)
        await stream.execute(primitive, {**memories, "dst": dst})
        got = await dst.to_numpy()
        if isinstance(desc, triodnn.EltwiseDesc):
            ref = eltwise_kernels.reference(desc.alg, host["src"], alpha=desc.alpha, beta=desc.beta)
            threshold = tolerance.eltwise(desc.alg)
        else:
            ref = binary_kernels.reference(desc.alg, host["src0"], host["src1"])
            threshold = tolerance.BINARY
        error = tolerance.max_error(got, ref)
        checks.append({"label": f"{desc.label} {desc.dst.dims}", "max_error": error, "ok": error <= threshold})
        for m in (*memories.values(), dst):
            m.release()
    return checks


# -- children ------------------------------------------------------------------------------------


async def timed_create(engine, spec) -> tuple[object, dict]:
    desc = make_desc(spec)
    built0 = engine.statistics().programs_built
    stats0 = cache_stats()
    t0 = perf()
    primitive = await engine.create_primitive(desc)
    ms = (perf() - t0) * 1e3
    d = delta(cache_stats(), stats0)
    return primitive, {"label": spec_label(spec), "ms": ms, "build_ms": primitive.build_seconds * 1e3,
                       "misses": d["misses"], "programs_built": engine.statistics().programs_built - built0}


async def measure_hits(engine, specs, n: int) -> dict:
    descs = [make_desc(s) for s in specs]
    stats0 = cache_stats()
    samples = []
    gc.collect()
    for i in range(n):
        desc = descs[i % len(descs)]
        t0 = perf()
        await engine.create_primitive(desc)
        samples.append(perf() - t0)
    d = delta(cache_stats(), stats0)
    return {"n": n, "median_us": common.median(samples) * 1e6, "p90_us": common.percentile(samples, 90) * 1e6,
            "min_us": min(samples) * 1e6, "all_hits": d["hits"] == n and d["misses"] == 0}


async def child_miss(args, arg) -> dict:
    """Create each spec once (misses, in order), optionally rebuild them after capacity 0, then hits."""
    async with triodnn.open_runtime() as runtime:
        t0 = perf()
        engine = await common.open_engine(runtime, args)
        out = {"engine_open_ms": (perf() - t0) * 1e3, "misses": [], "rebuilds": []}
        primitives = []
        for spec in arg["specs"]:
            primitive, record = await timed_create(engine, spec)
            primitives.append(primitive)
            out["misses"].append(record)
        if arg.get("rebuild"):
            reset_cache()
            for spec in arg["specs"]:
                primitive, record = await timed_create(engine, spec)
                primitives.append(primitive)
                out["rebuilds"].append(record)
        out["hits"] = await measure_hits(engine, arg["specs"], arg["hits"])
        out["checks"] = await check_primitives(engine, primitives)
    return out


async def creation_burst(engine, desc, n: int) -> dict:
    """``n`` tasks started together, each creating ``desc``; wall time until all have it."""
    primitives = [None] * n
    started = [0.0] * n
    done = [0.0] * n

    async def one(i: int) -> None:
        started[i] = perf()
        primitives[i] = await engine.create_primitive(desc)
        done[i] = perf()

    built0 = engine.statistics().programs_built
    stats0 = cache_stats()
    gc.collect()
    t0 = perf()
    async with trio.open_nursery() as nursery:
        for i in range(n):
            nursery.start_soon(one, i)
    wall = perf() - t0
    d = delta(cache_stats(), stats0)
    build = primitives[0].build_seconds
    return {
        "n": n, "wall_ms": wall * 1e3, "build_ms": build * 1e3, "overhead_ms": (wall - build) * 1e3,
        "last_task_started_ms": (max(started) - t0) * 1e3, "first_done_ms": (min(done) - t0) * 1e3,
        "done_spread_ms": (max(done) - min(done)) * 1e3,
        "misses": d["misses"], "coalesced": d["coalesced"], "hits": d["hits"],
        "programs_built": engine.statistics().programs_built - built0,
        "kernel_objects": len({id(p.launch.kernel) for p in primitives}),
        "primitive": primitives[0],
    }


async def child_concurrent(args, arg) -> dict:
    n, reps, base = arg["n"], arg["reps"], arg["base"]
    async with triodnn.open_runtime() as runtime:
        engine = await common.open_engine(runtime, args)
        # The first build in a process pays PoCL/LLVM start-up: get it out of the way.
        await engine.create_primitive(make_desc(("eltwise", "relu", base - 1)))
        specs = [[("eltwise", "gelu_erf", base + 2 * rep + k) for k in (0, 1)] for rep in range(reps)]
        if arg.get("prime"):  # PoCL-warm: build every key once, then empty triodnn's cache
            for pair in specs:
                for spec in pair:
                    await engine.create_primitive(make_desc(spec))
            reset_cache()
        rows = []
        last = None
        for rep in range(reps):
            row = {}
            for variant in common.rotated(["single", "concurrent"], rep):
                spec = specs[rep][0 if variant == "single" else 1]
                result = await creation_burst(engine, make_desc(spec), 1 if variant == "single" else n)
                last = result.pop("primitive")
                row[variant] = result
            row["ratio"] = row["concurrent"]["wall_ms"] / row["single"]["wall_ms"]
            rows.append(row)
        checks = await check_primitives(engine, [last])
    return {"rows": rows, "checks": checks}


async def heartbeat_during(work) -> dict:
    """Wake-up gaps of a task sleeping 1 ms at a time while ``work()`` runs."""
    gaps: list[float] = []
    wakes: list[float] = []
    stop = trio.Event()

    async def beat() -> None:
        last = perf()
        while not stop.is_set():
            await trio.sleep(0.001)
            now = perf()
            gaps.append(now - last)
            wakes.append(now)
            last = now

    async with trio.open_nursery() as nursery:
        nursery.start_soon(beat)
        await trio.sleep(0.005)
        t0 = perf()
        extra = await work()
        wall = perf() - t0
        stop.set()
    return {"wall_s": wall, "n": len(gaps), "p50_ms": common.median(gaps) * 1e3,
            "p99_ms": common.percentile(gaps, 99) * 1e3, "max_ms": max(gaps) * 1e3,
            "over_10ms": sum(g > 0.010 for g in gaps), "extra": extra, "_wakes": wakes}


async def child_heartbeat(args, arg) -> dict:
    async with triodnn.open_runtime() as runtime:
        engine = await common.open_engine(runtime, args)
        await engine.create_primitive(make_desc(("eltwise", "relu", 7)))  # PoCL/LLVM start-up
        rounds = []
        previous = None
        for r in arg["rounds"]:
            idle = await heartbeat_during(lambda: trio.sleep(arg["baseline_s"]))
            rounds.append({"condition": "idle", **idle})
            if r == "rebuild":
                specs = previous
                reset_cache()
            else:
                specs = r
            previous = specs

            async def build_all(specs=specs):
                built0 = engine.statistics().programs_built
                stats0 = cache_stats()
                async with trio.open_nursery() as nursery:
                    for spec in specs:
                        nursery.start_soon(engine.create_primitive, make_desc(spec))
                d = delta(cache_stats(), stats0)
                return {"builds": len(specs), "misses": d["misses"],
                        "programs_built": engine.statistics().programs_built - built0}

            busy = await heartbeat_during(build_all)
            rounds.append({"condition": "rebuild" if r == "rebuild" else "new", **busy})
        for entry in rounds:
            del entry["_wakes"]
        out = {"rounds": rounds}
        if arg.get("diagnose"):
            out["diagnosis"] = await diagnose(engine, arg["diagnose"])
    return out


async def diagnose(engine, specs) -> list[dict]:
    """Raw pyopencl, heartbeat on: which step of a build stalls the trio thread.

    Each spec is built alone in a worker thread (build, kernel, warm-up launch, binaries); a
    step's stall is the longest time between heartbeat wake-ups that falls inside the step.
    Then each built program is dropped on the trio thread while another build runs in a worker
    thread (what ``KernelCache.adopt`` does when it replaces a key's resources)."""
    context, device = engine.cl_context, engine.cl_device
    queue = cl.CommandQueue(context, device)
    results = []
    kept = []
    for spec in specs:
        desc = make_desc(spec)
        kernel_spec = triodnn.kernels.generate(desc, engine._config)  # the source triodnn compiles for this engine
        phases: list[tuple[str, float, float]] = []

        def build_in_thread(kernel_spec=kernel_spec, desc=desc, phases=phases):
            t = perf()
            program = cl.Program(context, program_source(kernel_spec, engine._config)).build()
            phases.append(("clBuildProgram (GIL released)", t, perf()))
            t = perf()
            kernel = cl.Kernel(program, kernel_spec.name)
            phases.append(("clCreateKernel", t, perf()))
            buffers = [cl.Buffer(context, cl.mem_flags.READ_WRITE, desc.arg_descs[n].nbytes)
                       for n in kernel_spec.arg_names]
            kernel.set_args(*buffers)
            t = perf()
            cl.enqueue_nd_range_kernel(queue, kernel, kernel_spec.local_size, kernel_spec.local_size).wait()
            phases.append(("first launch + wait", t, perf()))
            t = perf()
            program.binaries[0]
            phases.append(("program.binaries", t, perf()))
            return program, kernel

        box = []

        async def work(build_in_thread=build_in_thread):
            box.append(await trio.to_thread.run_sync(build_in_thread))

        beat = await heartbeat_during(work)
        kept.append(box.pop())
        for name, start, end in phases:
            results.append({"label": spec_label(spec), "phase": name, "ms": (end - start) * 1e3,
                            "max_gap_ms": _stall_inside(beat["_wakes"], start, end) * 1e3})
    for i, spec in enumerate(specs):
        other = triodnn.kernels.generate(make_desc(("eltwise", "sigmoid", 70_000 + i)), engine._config)
        timing = {}

        async def release_during_build(other=other, i=i, timing=timing):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(trio.to_thread.run_sync,
                                   lambda: cl.Program(context, program_source(other, engine._config)).build())
                await trio.sleep(0.03)  # the worker thread is inside clBuildProgram now
                t = perf()
                kept[i] = None  # drops the program and its kernel: clReleaseKernel, clReleaseProgram
                timing["start"], timing["end"] = t, perf()

        beat = await heartbeat_during(release_during_build)
        results.append({"label": spec_label(spec), "phase": "drop the built program on the trio thread "
                        "while another build runs", "ms": (timing["end"] - timing["start"]) * 1e3,
                        "max_gap_ms": _stall_inside(beat["_wakes"], timing["start"], timing["end"]) * 1e3})
    return results


def _stall_inside(wakes: list[float], start: float, end: float) -> float:
    """The longest part of one gap between wake-ups that lies within [start, end]."""
    stalls = [min(b, end) - max(a, start) for a, b in zip(wakes, wakes[1:]) if b > start and a < end]
    return max(stalls, default=0.0)


async def child_blob(args, arg) -> dict:
    """write: create the specs cold, save the engine's blob. read: load the blob, create them."""
    async with triodnn.open_runtime() as runtime:
        t0 = perf()
        engine = await common.open_engine(runtime, args)
        engine_ms = (perf() - t0) * 1e3
        needed = "primitive_cache_blob" if arg["write"] else "load_primitive_cache_blob"
        if not hasattr(engine, needed):
            return {"skipped": f"engine has no {needed}() (cache blob API not in this triodnn)"}
        out = {"engine_open_ms": engine_ms, "load_ms": 0.0}
        stats0 = cache_stats()
        t_start = perf()
        if not arg["write"]:
            with open(arg["path"], "rb") as f:
                blob = f.read()
            t1 = perf()
            out["loaded"] = await engine.load_primitive_cache_blob(blob)
            out["load_ms"] = (perf() - t1) * 1e3
            out["blob_bytes"] = len(blob)
        t1 = perf()
        primitives = [await engine.create_primitive(make_desc(spec)) for spec in arg["specs"]]
        out["create_ms"] = (perf() - t1) * 1e3
        out["total_ms"] = (perf() - t_start) * 1e3
        out["process_ready_s"] = perf() - _T0
        stats = engine.statistics()
        out.update(programs_built=stats.programs_built, programs_loaded=stats.programs_loaded,
                   cache=delta(cache_stats(), stats0))
        if arg["write"]:
            blob = engine.primitive_cache_blob()
            with open(arg["path"], "wb") as f:
                f.write(blob)
            out["blob_bytes"] = len(blob)
        out["checks"] = await check_primitives(engine, primitives)
    return out


CHILD_MODES = {"miss": child_miss, "concurrent": child_concurrent, "heartbeat": child_heartbeat,
               "blob": child_blob}


def child_main(args) -> None:
    arg = json.loads(args.child_arg)

    async def run():
        return await CHILD_MODES[args.child_mode](args, arg)

    result = trio.run(run)
    result["env"] = {k: os.environ.get(k) for k in ("POCL_KERNEL_CACHE", "PYOPENCL_NO_CACHE", "POCL_CACHE_DIR")}
    print(CHILD_MARK + json.dumps(result, default=common._jsonable), flush=True)


# -- parent --------------------------------------------------------------------------------------


class Children:
    """Runs child processes one at a time and prints each kind of command once."""

    def __init__(self, args) -> None:
        self.args = args
        self.shown: set = set()
        self.commands: list[str] = []

    def env(self, pocl: str) -> tuple[dict, dict]:
        """``pocl``: "off", or a directory for PoCL's (and NVIDIA's) disk cache."""
        env = dict(os.environ)
        for name in CAPACITY_ENV_VARS:
            env.pop(name, None)
        if pocl == "off":
            changes = {"POCL_KERNEL_CACHE": "0", "PYOPENCL_NO_CACHE": "1", "CUDA_CACHE_DISABLE": "1"}
            env.pop("POCL_CACHE_DIR", None)
        else:
            changes = {"POCL_KERNEL_CACHE": "1", "POCL_CACHE_DIR": pocl, "PYOPENCL_NO_CACHE": "1",
                       "CUDA_CACHE_PATH": pocl}
            env.pop("CUDA_CACHE_DISABLE", None)
        env.update(changes)
        return env, changes

    async def run(self, mode: str, arg: dict, pocl: str) -> dict:
        env, changes = self.env(pocl)
        cmd = [sys.executable, os.path.abspath(__file__), "--engine", self.args.engine,
               "--child-mode", mode, "--child-arg", json.dumps(arg)]
        shown = " ".join(f"{k}={shlex.quote(v)}" for k, v in changes.items()) + " " + " ".join(
            [os.path.basename(sys.executable), os.path.relpath(cmd[1])] + [shlex.quote(c) for c in cmd[2:]])
        kind = (mode, pocl == "off", arg.get("write"), arg.get("prime"))
        if kind not in self.shown:
            self.shown.add(kind)
            print(f"   child: {shown}", flush=True)
        self.commands.append(shown)
        proc = await trio.run_process(cmd, env=env, capture_stdout=True, capture_stderr=True, check=False)
        stdout = proc.stdout.decode(errors="replace")
        if proc.returncode != 0:
            raise SystemExit(f"child {mode} failed (exit {proc.returncode}):\n"
                             f"{proc.stderr.decode(errors='replace')[-4000:]}")
        for line in reversed(stdout.splitlines()):
            if line.startswith(CHILD_MARK):
                return json.loads(line[len(CHILD_MARK):])
        raise SystemExit(f"child {mode} printed no result:\n{stdout[-2000:]}")


def checks_ok(*results) -> bool:
    return all(c["ok"] for r in results for c in r.get("checks", []))


def ratio_text(value: float) -> str:
    return f"{value:,.0f}x" if value >= 100 else f"{value:.2f}x"


def verdict(ok: bool) -> str:
    return "met" if ok else "NOT met"


def summary(values: list[float]) -> list:
    if not values:
        return [0, float("nan"), float("nan"), float("nan")]
    return [len(values), common.median(values), min(values), max(values)]


async def section_hits(children, args, tmp, results) -> None:
    reps = args.reps or (1 if args.quick else 3)
    hits = 500 if args.quick else 3000
    print("-- 1. hit vs miss: create_primitive of gelu_erf 4096, relu 4096, binary add 4096 "
          f"({reps} child processes per variant, {hits} hits each)", flush=True)
    pocl_dir = os.path.join(tmp, "pocl-s1")
    os.makedirs(pocl_dir)
    prime = await children.run("miss", {"specs": HEADLINE, "hits": hits}, pocl_dir)
    cold, warm = [], []
    for rep in range(reps):
        specs = common.rotated(HEADLINE, rep)
        for variant in common.rotated(["cold", "warm"], rep):
            if variant == "cold":
                cold.append(await children.run("miss", {"specs": specs, "hits": hits}, "off"))
            else:
                warm.append(await children.run("miss", {"specs": specs, "hits": hits, "rebuild": True}, pocl_dir))

    def rows_of(kids, pick):
        values, ratios = [], []
        for kid in kids:
            ms = [m["ms"] for m in pick(kid)]
            values += ms
            if ms:
                ratios.append(common.median(ms) * 1e3 / kid["hits"]["median_us"])
        return values, (common.median(ratios) if ratios else float("nan"))

    variants = [
        ("cold miss, first build in a process", "off", cold, lambda k: k["misses"][:1]),
        ("cold miss, later key", "off", cold, lambda k: k["misses"][1:]),
        ("miss, PoCL cache on but new to it, first build", "on, empty", [prime], lambda k: k["misses"][:1]),
        ("miss, PoCL cache on but new to it, later key", "on, empty", [prime], lambda k: k["misses"][1:]),
        ("PoCL-warm rebuild, new process, first build", "on, holds it", warm, lambda k: k["misses"][:1]),
        ("PoCL-warm rebuild, new process, later key", "on, holds it", warm, lambda k: k["misses"][1:]),
        ("PoCL-warm rebuild, same process (capacity 0 -> 1024)", "on, holds it", warm, lambda k: k["rebuilds"]),
    ]
    out = {"children": {"prime": prime, "cold": cold, "warm": warm}, "rows": {}}
    rows = []
    for name, pocl, kids, pick in variants:
        values, ratio = rows_of(kids, pick)
        out["rows"][name] = {"pocl_cache": pocl, "ms": values, "median_ms": summary(values)[1],
                             "hit_faster_x": ratio}
        rows.append([name, pocl, *summary(values), ratio_text(ratio)])
    common.print_table(["miss: creation of a key not in triodnn's cache", "PoCL kernel cache", "n", "median ms",
                        "min", "max", "hit is faster"], rows)
    rows = []
    for name, kids in (("cold children (PoCL cache off)", cold), ("PoCL-warm children", warm),
                       ("PoCL-new child", [prime])):
        us = [k["hits"]["median_us"] for k in kids]
        out["rows"]["hit, " + name] = {"median_us": common.median(us), "children_median_us": us}
        rows.append([name, common.median(us), common.median([k["hits"]["p90_us"] for k in kids]),
                     min(k["hits"]["min_us"] for k in kids), sum(k["hits"]["n"] for k in kids)])
    ph = results["parent_hits"]
    rows.append(["this process", ph["median_us"], ph["p90_us"], ph["min_us"], ph["n"]])
    common.print_table(["hit: create_primitive of a cached key, same engine", "median µs", "p90 µs", "min µs",
                        "calls"], rows)
    built_ok = all(m["programs_built"] == 1 and m["misses"] == 1
                   for k in cold + warm + [prime] for m in k["misses"] + k["rebuilds"])
    hits_ok = all(k["hits"]["all_hits"] for k in cold + warm + [prime])
    print(f"   every miss built exactly one program: {'yes' if built_ok else 'NO'}; "
          f"every hit counted as a hit: {'yes' if hits_ok else 'NO'}")
    r = out["rows"]
    cold_x = r["cold miss, later key"]["hit_faster_x"]
    first_x = r["cold miss, first build in a process"]["hit_faster_x"]
    warm_x = r["PoCL-warm rebuild, new process, later key"]["hit_faster_x"]
    same_x = r["PoCL-warm rebuild, same process (capacity 0 -> 1024)"]["hit_faster_x"]
    out["goals"] = {"hit_vs_cold_10000x": cold_x >= 10000, "hit_vs_pocl_warm_1000x": min(warm_x, same_x) >= 1000}
    print(f"   goal hit >= 10,000x faster than a cold miss: {ratio_text(cold_x)} (later key), "
          f"{ratio_text(first_x)} (first build in a process) -> {verdict(cold_x >= 10000)}")
    print(f"   goal hit >= 1000x faster than a PoCL-warm rebuild: {ratio_text(warm_x)} (new process), "
          f"{ratio_text(same_x)} (same process) -> {verdict(min(warm_x, same_x) >= 1000)}")
    print()
    out["correct"] = built_ok and hits_ok and checks_ok(prime, *cold, *warm)
    results["hits_vs_misses"] = out


async def section_concurrent(children, args, tmp, results) -> None:
    reps = args.concurrent_reps or (2 if args.quick else 7)
    n = args.concurrent
    print(f"-- 2. {n} tasks creating one new key vs one task creating another ({reps} pairs per child, "
          "fresh gelu_erf sizes)", flush=True)
    pocl_dir = os.path.join(tmp, "pocl-s2")
    os.makedirs(pocl_dir)
    off = await children.run("concurrent", {"n": n, "reps": reps, "base": 100_000}, "off")
    warm = await children.run("concurrent", {"n": n, "reps": reps, "base": 200_000, "prime": True}, pocl_dir)
    rows, out = [], {}
    for name, kid in (("off (cold builds)", off), ("on, holds it (PoCL-warm rebuild)", warm)):
        entry = {"rows": kid["rows"]}
        for variant in ("single", "concurrent"):
            rs = [row[variant] for row in kid["rows"]]
            med = {k: common.median([r[k] for r in rs]) for k in
                   ("wall_ms", "build_ms", "overhead_ms", "last_task_started_ms", "done_spread_ms")}
            entry[variant] = med
            ratio = common.median([row["ratio"] for row in kid["rows"]]) if variant == "concurrent" else float("nan")
            rows.append([name if variant == "single" else "", "1 task" if variant == "single" else f"{n} tasks",
                         med["wall_ms"], med["build_ms"], med["overhead_ms"], med["last_task_started_ms"],
                         med["done_spread_ms"], ratio])
        entry["ratio_median"] = common.median([row["ratio"] for row in kid["rows"]])
        one_build = all(
            row["concurrent"]["misses"] == 1 and row["concurrent"]["coalesced"] + row["concurrent"]["hits"] == n - 1
            and row["concurrent"]["programs_built"] == 1 and row["concurrent"]["kernel_objects"] == 1
            and row["single"]["misses"] == 1 and row["single"]["programs_built"] == 1
            for row in kid["rows"])
        entry["exactly_one_build"] = one_build
        entry["coalesced_waits"] = [row["concurrent"]["coalesced"] for row in kid["rows"]]
        out[name] = entry
    common.print_table(["PoCL kernel cache", "variant", "wall ms", "build ms (thread)", "wall - build",
                        "last task started", "first->last done", "ratio (median)"], rows)
    for name, entry in out.items():
        print(f"   {name}: misses +1, coalesced waits + hits = {n - 1}, programs_built +1, one kernel "
              f"object: {'yes' if entry['exactly_one_build'] else 'NO'} in every repetition "
              f"(coalesced waits {sorted(set(entry['coalesced_waits']))})")
    r_off, r_warm = out["off (cold builds)"]["ratio_median"], out["on, holds it (PoCL-warm rebuild)"]["ratio_median"]
    print(f"   goal {n} same-key creations <= 1.2x one creation, exactly one build: {r_off:.2f}x cold "
          f"-> {verdict(r_off <= 1.2)}; {r_warm:.2f}x PoCL-warm -> {verdict(r_warm <= 1.2)}")
    print()
    out["goals"] = {"cold_ratio_le_1.2": r_off <= 1.2, "pocl_warm_ratio_le_1.2": r_warm <= 1.2,
                    "exactly_one_build": all(e["exactly_one_build"] for e in out.values())}
    out["correct"] = out["goals"]["exactly_one_build"] and checks_ok(off, warm)
    results["concurrent"] = out


async def section_heartbeat(children, args, tmp, results) -> None:
    builds = args.builds or (8 if args.quick else 16)
    baseline = 0.5 if args.quick else 1.0
    print(f"-- 3. heartbeat (trio.sleep(0.001) loop) while {builds} new keys build concurrently", flush=True)

    def round_specs(r):
        return [("eltwise", HEARTBEAT_ALGS[i % len(HEARTBEAT_ALGS)], 50_000 + 100 * r + i) for i in range(builds)]

    n_rounds = 1 if args.quick else 2
    diag = [("eltwise", "gelu_erf", 60_000 + i) for i in range(2)]
    pocl_dir = os.path.join(tmp, "pocl-s3")
    os.makedirs(pocl_dir)
    off = await children.run("heartbeat", {"rounds": [round_specs(r) for r in range(n_rounds)],
                                           "baseline_s": baseline, "diagnose": diag}, "off")
    on = await children.run("heartbeat", {"rounds": [round_specs(0), "rebuild"], "baseline_s": baseline}, pocl_dir)
    rows = []
    labels = {"idle": "idle (nothing builds)", "new": "building new kernels", "rebuild": "rebuilding (PoCL-warm)"}
    for pocl, kid in (("off", off), ("on", on)):
        for entry in kid["rounds"]:
            extra = entry["extra"] or {}
            rows.append([labels[entry["condition"]], pocl, extra.get("builds", 0), entry["wall_s"], entry["n"],
                         entry["p50_ms"], entry["p99_ms"], entry["max_ms"], entry["over_10ms"]])
    common.print_table(["condition", "PoCL kernel cache", "builds", "wall s", "gaps", "p50 ms", "p99 ms",
                        "max ms", "gaps > 10 ms"], rows)
    rows = [[d["label"], d["phase"], d["ms"], d["max_gap_ms"]] for d in off.get("diagnosis", [])]
    common.print_table(["raw pyopencl, same sources", "step", "ms", "longest stall inside ms"], rows,
                       title="   where the gaps come from (PoCL cache off, same child):")
    busy = [e for kid in (off, on) for e in kid["rounds"] if e["condition"] != "idle"]
    builds_ok = all(e["extra"]["misses"] == e["extra"]["builds"] == e["extra"]["programs_built"] for e in busy)
    print(f"   every build a miss with its own program: {'yes' if builds_ok else 'NO'}")
    worst_max = max(e["max_ms"] for e in busy)
    worst_p99 = max(e["p99_ms"] for e in busy)
    parts = []
    for pocl, kid in (("off", off), ("on", on)):
        for cond in ("new", "rebuild"):
            es = [e for e in kid["rounds"] if e["condition"] == cond]
            if es:
                parts.append(f"{labels[cond]}, PoCL cache {pocl}: largest {max(e['max_ms'] for e in es):.0f} ms, "
                             f"p99 {max(e['p99_ms'] for e in es):.1f} ms")
    print("   goal heartbeat gap <= 10 ms while builds run (worst round of each condition):")
    for part in parts:
        print(f"     {part}")
    print(f"   -> largest gap {verdict(worst_max <= 10)}, p99 {verdict(worst_p99 <= 10)}")
    print()
    results["heartbeat"] = {"off": off, "on": on, "builds": builds, "largest_gap_ms": worst_max,
                            "p99_gap_ms": worst_p99,
                            "goals": {"max_gap_le_10ms": worst_max <= 10, "p99_gap_le_10ms": worst_p99 <= 10},
                            "correct": builds_ok}


async def section_blob(children, args, tmp, results, engine) -> None:
    n = args.blob_n
    specs = [BLOB_SPECS[i % len(BLOB_SPECS)] for i in range(n)]
    specs = [(k, a, s + i // len(BLOB_SPECS)) for i, (k, a, s) in enumerate(specs)]
    print(f"-- 4. new process, {n} primitives: cold vs after load_primitive_cache_blob (PoCL cache off)", flush=True)
    missing = [name for name in ("primitive_cache_blob", "load_primitive_cache_blob") if not hasattr(engine, name)]
    if missing:
        message = f"skipped: this triodnn's Engine has no {', '.join(missing)} (cache blob API not there yet)"
        print(f"   {message}\n")
        results["blob"] = {"skipped": message}
        return
    reps = args.reps or (1 if args.quick else 3)
    cold, warm = [], []
    for rep in range(reps):
        path = os.path.join(tmp, f"blob-{rep}.bin")
        cold.append(await children.run("blob", {"specs": specs, "path": path, "write": True}, "off"))
        warm.append(await children.run("blob", {"specs": specs, "path": path, "write": False}, "off"))
    skipped = [k["skipped"] for k in cold + warm if "skipped" in k]
    if skipped:
        print(f"   skipped: {skipped[0]}\n")
        results["blob"] = {"skipped": skipped[0]}
        return
    rows = []
    for name, kids in (("cold (compile)", cold), ("from blob", warm)):
        med = {key: common.median([k[key] for k in kids])
               for key in ("load_ms", "create_ms", "total_ms", "process_ready_s")}
        rows.append([name, n, med["load_ms"], med["create_ms"], med["total_ms"], med["process_ready_s"],
                     kids[0]["programs_built"], kids[0]["programs_loaded"],
                     f"{kids[0]['cache']['hits']}/{kids[0]['cache']['misses']}", kids[0].get("blob_bytes", 0)])
    common.print_table(["start", "primitives", "load blob ms", "create ms", "total ms", "script start->ready s",
                        "programs built", "programs loaded", "cache hits/misses", "blob bytes"], rows)
    ratio = common.median([c["total_ms"] / w["total_ms"] for c, w in zip(cold, warm)])
    process_ratio = common.median([c["process_ready_s"] / w["process_ready_s"] for c, w in zip(cold, warm)])
    no_compile = all(k["programs_built"] == 0 and k["programs_loaded"] == n and k["cache"]["misses"] == 0
                     and k["cache"]["hits"] == n and k["loaded"] == n for k in warm)
    print(f"   cold ÷ from blob: {ratio:.1f}x for the {n} primitives (load + create), {process_ratio:.2f}x from "
          f"script start to ready; the warm child compiled nothing and loaded {n}: {'yes' if no_compile else 'NO'}")
    print()
    results["blob"] = {"cold": cold, "warm": warm, "ratio_total": ratio, "ratio_process": process_ratio,
                       "no_compile": no_compile, "correct": no_compile and checks_ok(*cold, *warm)}


async def parent_hits(engine, args) -> tuple[dict, list]:
    reps = 5 if args.quick else 20
    per = 100
    primitives = [await engine.create_primitive(make_desc(s)) for s in HEADLINE]
    for _ in range(200):
        await engine.create_primitive(make_desc(HEADLINE[0]))
    descs = [make_desc(s) for s in HEADLINE]
    samples = []
    stats0 = cache_stats()
    for rep in range(reps):
        gc.collect()
        for desc in common.rotated(descs, rep):
            for _ in range(per):
                t0 = perf()
                await engine.create_primitive(desc)
                samples.append(perf() - t0)
    d = delta(cache_stats(), stats0)
    checks = await check_primitives(engine, primitives)
    return {"n": len(samples), "median_us": common.median(samples) * 1e6, "min_us": min(samples) * 1e6,
            "p90_us": common.percentile(samples, 90) * 1e6, "all_hits": d["hits"] == len(samples)}, checks


async def run(args) -> tuple[dict, object]:
    sections = {s.strip() for s in args.sections.split(",")}
    results: dict = {"sections": sorted(sections)}
    async with triodnn.open_runtime() as runtime:
        engine = await common.open_engine(runtime, args)
        common.print_header(
            "bench_cache: the process-global primitive cache",
            engine, args,
            notes=[f"misses in child processes (commands below); this process: POCL_KERNEL_CACHE="
                   f"{os.environ.get('POCL_KERNEL_CACHE', 'unset')}, capacity "
                   f"{triodnn.get_primitive_cache_capacity()}"],
        )
        results["parent_hits"], checks = await parent_hits(engine, args)
        results["parent_checks"] = checks
        children = Children(args)
        tmp = tempfile.mkdtemp(prefix="bench_cache-")
        try:
            if "1" in sections:
                await section_hits(children, args, tmp, results)
            if "2" in sections:
                await section_concurrent(children, args, tmp, results)
            if "3" in sections:
                await section_heartbeat(children, args, tmp, results)
            if "4" in sections:
                await section_blob(children, args, tmp, results, engine)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        results["child_commands"] = children.commands
    ok = all(c["ok"] for c in checks) and all(
        results[k].get("correct", True) for k in ("hits_vs_misses", "concurrent", "heartbeat", "blob") if k in results)
    results["correct"] = ok
    print(f"kernel outputs checked against numpy, cache counters as expected: {'OK' if ok else 'MISMATCH'}")
    return results, engine


def main() -> None:
    args = common.parse_args(__doc__.splitlines()[0], extra_args)
    if args.child_mode:
        child_main(args)
        return
    t0 = perf()
    results, engine = trio.run(run, args)
    results["wall_s"] = perf() - t0
    print(f"run took {results['wall_s']:.0f} s")
    common.write_json(args.json, "bench_cache", engine, args, results)
    if not results["correct"]:
        raise SystemExit("a kernel output or a cache counter does not match")


if __name__ == "__main__":
    main()

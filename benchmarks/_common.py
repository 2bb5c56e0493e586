"""Shared plumbing of the benchmark scripts: arguments, statistics, tables and JSON output.

Every script takes ``--engine KIND[:INDEX]`` (``cpu:0`` by default, ``gpu:0`` on a GPU machine),
``--quick`` (a smoke run of a few seconds) and ``--json PATH``. Speed claims are ratios of variants
measured side by side in one run: variants are interleaved inside each repetition (in a rotating
order) and the tables report medians over repetitions.
"""

from __future__ import annotations

import argparse
import inspect
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time

import numpy as np
import pyopencl as cl
import trio

import triodnn
from triodnn._runtime import parse_engine_spec
from triodnn.actors import build_program
from triodnn.graph import Tensor
from triodnn.kernels import KernelSpec, select_config


def parse_args(description: str, extra=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument(
        "--engine",
        default="cpu:0",
        metavar="KIND[:INDEX]",
        help="triodnn engine to measure: cpu:0 (default), gpu:0 on a GPU machine, any:N",
    )
    parser.add_argument("--quick", action="store_true", help="smoke run: a few seconds, noisy numbers")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON to PATH")
    if extra is not None:
        extra(parser)
    args = parser.parse_args()
    kind, _, index = args.engine.partition(":")
    try:
        args.engine_kind, args.engine_index = kind, int(index) if index else 0
    except ValueError:
        parser.error(f"--engine {args.engine!r} is not KIND[:INDEX] (e.g. cpu:0, gpu:0)")
    return args


async def open_engine(runtime, args):
    return await runtime.engine(args.engine_kind, args.engine_index)


async def engine_named(runtime, spec: str | None):
    """The engine ``spec`` ("gpu:0", "cpu") names, or the runtime's default one without it: for
    scripts whose --engine defaults to None."""
    return await (runtime.engine(*parse_engine_spec(spec)) if spec else runtime.engine())


def engine_facts(engine) -> dict:
    info = engine.info
    strategy = engine.out_of_order_strategy
    return {
        "engine": str(engine),
        "device": info.name,
        "vendor": info.vendor,
        "platform": f"{info.platform} ({info.platform_version})",
        "driver": info.driver,
        "compute_units": info.max_compute_units,
        "ooo_strategy": f"{strategy.kind}:{strategy.lanes}" if strategy is not None else None,
        "ooo_strategy_reason": getattr(strategy, "reason", None),
    }


def host_facts() -> dict:
    facts = {
        "python": sys.version.split()[0],
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "numpy": np.__version__,
        "pyopencl": cl.VERSION_TEXT,
        "trio": trio.__version__,
        "triodnn": triodnn.__version__,
        "switchinterval_s": sys.getswitchinterval(),
    }
    try:
        facts["loadavg_1min"] = os.getloadavg()[0]
    except OSError:
        pass
    facts["git"] = git_state()
    return facts


def git_state() -> str | None:
    """The commit of the checkout the benchmarks run from, with '+dirty' when files differ."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    try:
        head = subprocess.run(["git", "-C", root, "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, timeout=5).stdout.strip()
        dirty = subprocess.run(["git", "-C", root, "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=5).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return (head + ("+dirty" if dirty else "")) or None


def command_line() -> str:
    return " ".join([os.path.basename(sys.executable)] + sys.argv)


class SpinDesc:
    """A custom primitive kind: one work-item runs a dependent float loop.

    ``engine.create_primitive`` accepts any descriptor whose class is registered with
    ``triodnn.kernels.register`` (below) and that has ``kind``, ``label`` and ``arg_descs``; this
    one ignores the device's config and launches global = local = 1.
    """

    kind = "custom"

    def __init__(self, iters: int) -> None:
        self.iters = iters
        self.desc = triodnn.MemoryDesc((1,))
        self.label = f"spin:{iters}"

    @property
    def arg_descs(self) -> dict:
        return {"src": self.desc, "dst": self.desc}

    def generate(self, config) -> KernelSpec:
        source = (
            "__kernel void spin(__global const float* src, __global float* dst) {\n"
            "    float x = src[0];\n"
            f"    for (int i = 0; i < {self.iters}; ++i) x = x * 0.999f + 0.001f;\n"
            "    dst[0] = x;\n"
            "}\n"
        )
        return KernelSpec(source=source, name="spin", arg_names=("src", "dst"), global_size=(1,),
                          local_size=(1,), impl="custom:spin")

    def reference(self, x: np.ndarray) -> np.ndarray:
        # x_{k+1} = 0.999 x_k + 0.001 has the closed form 1 + (x_0 - 1) * 0.999**k.
        return (1.0 + (x.astype(np.float64) - 1.0) * 0.999 ** self.iters).astype(np.float32)


# Declared in the op registry like triodnn's own kinds: its generator is the method.
triodnn.kernels.register(SpinDesc, generate=SpinDesc.generate)


# -- graphs ----------------------------------------------------------------------------------------


async def bind_graph(graph, engine, compiled, arrays) -> tuple[list[str], list, dict]:
    """(primitive kinds, plan, tensors) of ``graph``'s ``compiled`` partitions (in execution
    order) on ``engine``: its inputs uploaded from ``arrays`` (by logical tensor id), every
    partition's outputs allocated, and the plan a list of (compiled partition, input tensors,
    output tensors) to execute in turn; ``tensors`` maps each id to its tensor."""
    tensors = {}
    for lt in graph.input_tensors():
        tensors[lt.id] = await Tensor.from_numpy(lt, engine, arrays[lt.id])
    plan = []
    for cp in compiled:
        outs = [Tensor(o, engine) for o in cp.outputs]
        for t in outs:
            tensors[t.logical_tensor.id] = t
        plan.append((cp, [tensors[i.id] for i in cp.inputs], outs))
    kinds = [prim.desc.kind for cp in compiled for prim in cp.primitives]
    return kinds, plan, tensors


# -- statistics ----------------------------------------------------------------------------------


def median(values) -> float:
    return statistics.median(values)


def percentile(values, q: float) -> float:
    """The q-th percentile (0..100), nearest-rank on sorted values (no interpolation below p50)."""
    ordered = sorted(values)
    if not ordered:
        return math.nan
    rank = max(1, math.ceil(q / 100.0 * len(ordered)))
    return ordered[rank - 1]


def rotated(items: list, rep: int) -> list:
    """``items`` rotated by ``rep``: each variant takes every position in turn over repetitions."""
    k = rep % len(items)
    return items[k:] + items[:k]


async def interleaved(variants: dict, reps: int) -> dict[str, list[float]]:
    """``reps`` samples of each variant, taken in turn: repetition r runs every variant once, in
    ``rotated`` order, so that drift (thermal, other processes, caches) falls on all of them alike.

    ``variants`` maps a name to an async function of no argument returning one sample (seconds);
    a plain function's result is taken as is. Returns each variant's samples in repetition order.
    """
    samples: dict[str, list[float]] = {name: [] for name in variants}
    for rep in range(reps):
        for name in rotated(list(variants), rep):
            value = variants[name]()
            if inspect.isawaitable(value):
                value = await value
            samples[name].append(value)
    return samples


# What poisons an integer output: its type's largest value (a result that is this value in
# every element would pass unwritten, so a check of such an output proves less).
_INTEGER_POISON = {"s8": 127, "u8": 255, "s4": 7, "u4": 15, "s32": 2**31 - 1, "s64": 2**31 - 1}


async def poison(memory) -> None:
    """Fill a memory with NaN (floating types) or its type's largest value (integers) before
    timed runs, so that checking it afterwards proves the timed runs themselves wrote the result
    (not the untimed check run before them)."""
    value = _INTEGER_POISON.get(memory.desc.dtype)
    if value is None:
        await memory.write(np.full(memory.desc.dims, np.nan, dtype=np.float32))
    else:
        await memory.write(np.full(memory.desc.dims, value, dtype=np.int64))


WALL = "wall"
DEVICE = "device"


def timing_note(mode: str, runs: int, reps: int) -> str:
    """How a table's times were taken, printed beside it: every figure names its timing."""
    if mode == WALL:
        how = (f"wall time over {runs} queued runs (submit {runs}, wait once; per run = total / "
               f"{runs})")
    else:
        how = (f"device time over {runs} queued runs (first start to last end of the {runs} "
               f"runs' kernels; per run = span / {runs})")
    return f"timing: {how}; median of {reps} interleaved samples per variant"


# -- output --------------------------------------------------------------------------------------


def print_header(title: str, engine, args, notes=()) -> None:
    facts = engine_facts(engine)
    print(f"== {title}")
    print(f"   engine {facts['engine']} | {facts['platform']} | driver {facts['driver']} | "
          f"{facts['compute_units']} compute units")
    print(f"   out-of-order strategy here: {facts['ooo_strategy']} ({facts['ooo_strategy_reason']})")
    print(f"   command: {command_line()}")
    for note in notes:
        print(f"   {note}")
    if args.quick:
        print("   --quick: smoke run, numbers are noisy")
    print()


def print_table(headers: list[str], rows: list[list], title: str | None = None) -> None:
    cells = [[_fmt(c) for c in row] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) if cells else len(h) for i, h in enumerate(headers)]
    if title:
        print(title)
    print("  ".join(h.rjust(w) if i else h.ljust(w) for i, (h, w) in enumerate(zip(headers, widths))))
    print("  ".join("-" * w for w in widths))
    for row in cells:
        print("  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths))))
    print()


def _fmt(value) -> str:
    if isinstance(value, float):
        if math.isnan(value):
            return "-"
        if abs(value) >= 100:
            return f"{value:.0f}"
        if abs(value) >= 10:
            return f"{value:.1f}"
        return f"{value:.2f}"
    return str(value)


def write_json(path: str | None, benchmark: str, engine, args, results: dict) -> None:
    if not path:
        return
    document = {
        "benchmark": benchmark,
        "command": command_line(),
        "quick": bool(args.quick),
        "time_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "engine": engine_facts(engine) if engine is not None else None,  # None: engines in other processes
        "host": host_facts(),
        "results": results,
    }
    with open(path, "w") as f:
        json.dump(document, f, indent=2, default=_jsonable)
        f.write("\n")
    print(f"results written to {path}")


def _jsonable(value):
    if isinstance(value, (np.integer,)):
        return int(value)
    if isinstance(value, (np.floating,)):
        return float(value)
    if isinstance(value, np.ndarray):
        return value.tolist()
    return str(value)


class NvidiaDevice:
    """The first NVIDIA OpenCL device, a context and queue on it, the kernel configuration the
    engine would give it (its compute capability included), and ``build(spec)``: the spec's
    kernel built as the engine builds it (``actors.build_program``). What the tensor-core tuning
    scripts run their kernels on, outside the runtime."""

    def __init__(self) -> None:
        platform_ = [p for p in cl.get_platforms() if "NVIDIA" in p.name][0]
        self.device = platform_.get_devices()[0]
        self.context = cl.Context([self.device])
        self.queue = cl.CommandQueue(self.context)
        self.sm = self.device.compute_capability_major_nv * 10 + self.device.compute_capability_minor_nv
        self.config = select_config("gpu", self.device.max_work_group_size, self.device.local_mem_size,
                                    nvidia_sm=self.sm)

    def build(self, spec: KernelSpec):
        program = build_program(self.context, self.device, spec.source, ptx_target=spec.ptx_target)
        return getattr(program, spec.name)

    def build_timed(self, spec: KernelSpec, label: str):
        """(kernel, build seconds); None after printing ``label``'s build failure (a tile the
        driver refuses is a result of the tuning run, not its end)."""
        started = time.perf_counter()
        try:
            kernel = self.build(spec)
        except Exception as exc:
            print(f"{label}: BUILD FAILED {type(exc).__name__}: {str(exc)[:3000]}", flush=True)
            return None
        return kernel, time.perf_counter() - started

    def upload(self, array: np.ndarray) -> cl.Buffer:
        """A read-only device buffer holding ``array``."""
        flags = cl.mem_flags.READ_ONLY | cl.mem_flags.COPY_HOST_PTR
        return cl.Buffer(self.context, flags, hostbuf=np.ascontiguousarray(array))

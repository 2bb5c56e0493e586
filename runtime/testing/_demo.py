"""``triodnn demo``: a small async pipeline through a diamond of primitives, checked against numpy.

    x ─┬─ gelu_tanh ─┐
       └─ sigmoid ───┴─ mul ── clip

Several requests go through the diamond at once as trio tasks; each submits its commands with
event dependencies and awaits only its result. The same requests then run on an in-order stream
for comparison.

Then *when overlap helps*: an out-of-order stream puts a kernel on a lane of its own only when it
leaves compute units idle and runs long (``Primitive.overlaps``); everything else stays on lane 0,
in order, so out-of-order never costs more than in order. The demo shows both cases side by side:
the diamond's kernels, then eight independent skinny matmuls and eight independent row sums of
long rows, each on an out-of-order and an in-order stream, each printed with the rule's reason.
The row sums leave units idle for long on every device, so they overlap (a PoCL core or a GPU
multiprocessor per row); the diamond's kernels fill the device and stay on lane 0. The skinny
matmul's verdict depends on the kernel a device gets: its PoCL kernel takes at least one work-group
a core (lane 0), NVIDIA's splits K over a work-group and is done before another lane pays off.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

import attrs
import numpy as np
import trio

from .._runtime import open_runtime, parse_engine_spec
from .._stream import StreamFlags
from .._values import BinaryDesc, EltwiseDesc, MatmulDesc, ReductionDesc
from .._values._memory_desc import MemoryDesc
from ..kernels import binary, eltwise, matmul, reduction, tolerance

DIAGRAM = """\
  x ─┬─ gelu_tanh ─┐
     └─ sigmoid ───┴─ mul ── clip"""


def reference(x: np.ndarray) -> np.ndarray:
    a = eltwise.reference("gelu_tanh", x)
    b = eltwise.reference("sigmoid", x)
    return eltwise.reference("clip", binary.reference("mul", a, b), alpha=-0.25, beta=2.0)


async def _diamond(engine, stream, prims, x: np.ndarray) -> np.ndarray:
    desc = prims["gelu"].desc.src
    src, left, right, prod, out = (engine.memory(desc) for _ in range(5))
    try:
        wrote = stream.write(src, x)
        a = stream.execute(prims["gelu"], {"src": src, "dst": left}, deps=[wrote])
        b = stream.execute(prims["sigmoid"], {"src": src, "dst": right}, deps=[wrote])
        c = stream.execute(prims["mul"], {"src0": left, "src1": right, "dst": prod}, deps=[a, b])
        d = stream.execute(prims["clip"], {"src": prod, "dst": out}, deps=[c])
        result = np.empty(desc.dims, np.float32)
        await stream.read(out, result, deps=[d])
        return result
    finally:
        for memory in (src, left, right, prod, out):
            memory.release()


async def _run_requests(engine, stream, prims, inputs, in_flight: int) -> tuple[float, list]:
    results: list = [None] * len(inputs)
    limiter = trio.CapacityLimiter(in_flight)

    async def one(i: int) -> None:
        async with limiter:
            results[i] = await _diamond(engine, stream, prims, inputs[i])

    started = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for i in range(len(inputs)):
            nursery.start_soon(one, i)
    return time.perf_counter() - started, results


async def run_demo(engine_spec: str | None, size: int, requests: int, in_flight: int, rounds: int) -> bool:
    async with open_runtime() as rt:
        if engine_spec:
            engine = await rt.engine(*parse_engine_spec(engine_spec))
        else:
            engine = await rt.engine()
        print(f"triodnn demo on {engine.kind}:{engine.index}: {engine.info.name} "
              f"({engine.info.platform}, driver {engine.info.driver})")
        desc = MemoryDesc((size,), "f32")
        started = time.perf_counter()
        async with trio.open_nursery() as nursery:
            prims: dict = {}

            async def create(name, op_desc):
                prims[name] = await engine.create_primitive(op_desc)

            nursery.start_soon(create, "gelu", EltwiseDesc("gelu_tanh", desc))
            nursery.start_soon(create, "sigmoid", EltwiseDesc("sigmoid", desc))
            nursery.start_soon(create, "mul", BinaryDesc("mul", desc, desc))
            nursery.start_soon(create, "clip", EltwiseDesc("clip", desc, alpha=-0.25, beta=2.0))
        print(f"created 4 primitives concurrently in {time.perf_counter() - started:.2f} s "
              f"(impl {prims['gelu'].impl})")
        print(DIAGRAM)
        streams = {
            "out-of-order": await engine.stream(StreamFlags.out_of_order),
            "in-order": await engine.stream(StreamFlags.in_order),
        }
        rng = np.random.default_rng(0)
        inputs = [rng.uniform(-4, 4, size).astype(np.float32) for _ in range(requests)]
        timings: dict[str, list[float]] = {name: [] for name in streams}
        worst = 0.0
        for _ in range(rounds):
            for name, stream in streams.items():
                seconds, results = await _run_requests(engine, stream, prims, inputs, in_flight)
                timings[name].append(seconds)
                for x, got in zip(inputs, results):
                    worst = max(worst, tolerance.max_error(got, reference(x)))
        print(f"{requests} requests of {size} f32, {in_flight} in flight, "
              f"{engine.out_of_order_strategy.kind} out-of-order strategy "
              f"({streams['out-of-order'].strategy}); median of {rounds} rounds:")
        medians = {name: float(np.median(t)) for name, t in timings.items()}
        for name, seconds in medians.items():
            print(f"  {name:>13} stream: {seconds * 1e3:8.2f} ms total, "
                  f"{seconds / requests * 1e3:7.3f} ms per request")
        print(f"  out-of-order speedup: {medians['in-order'] / medians['out-of-order']:.2f}x")
        print(_why(engine, prims["gelu"]))
        overlap_ok = await _overlap_demo(engine, rounds)
        threshold = tolerance.ELTWISE_TRANSCENDENTAL
        passed = worst <= threshold and overlap_ok
        print(f"results vs numpy: max error {worst:.2e} (threshold {threshold:.0e}): "
              f"{'PASSED' if passed else 'FAILED'}")
        return passed


def _why(engine, primitive) -> str:
    """Why the out-of-order stream gives ``primitive`` a lane of its own, or keeps it on lane 0."""
    spec = primitive.spec
    groups = math.prod(spec.global_size) // max(1, math.prod(spec.local_size))
    units = engine.info.max_compute_units
    items = math.prod(spec.global_size)
    per_item = sum(d.nbytes for d in primitive.desc.arg_descs.values()) / items
    if primitive.overlaps:
        return (f"  {primitive.label}: {groups} work-group(s) for {units} compute units, "
                f"{per_item / 1024:.0f} KiB per work-item: leaves units idle for long, so "
                "independent ones take lanes of their own and overlap")
    reason = (f"{groups} work-groups fill the {units} compute units" if groups >= units
              else f"{per_item:.0f} bytes per work-item end before another lane pays for itself")
    return f"  {primitive.label}: {reason}: out-of-order keeps it on lane 0, as fast as in order"


@attrs.frozen
class _Workload:
    """Independent requests of one primitive: ``make_inputs(rng)`` gives one branch's inputs by
    argument name, ``reference(inputs)`` its expected ``dst``, ``threshold`` the allowed error."""

    title: str
    desc: MatmulDesc | ReductionDesc
    make_inputs: Callable[[np.random.Generator], dict]
    reference: Callable[[dict], np.ndarray]
    threshold: float


def _workloads(m: int = 8, k: int = 32768, n: int = 32, rows: int = 2, length: int = 1 << 22) -> list[_Workload]:
    """Two kinds of independent kernel that may under-fill a device: skinny matmuls (on PoCL a
    few work-groups looping over a long K; NVIDIA's kernel splits K over a work-group and ends
    in ~23 µs) and row sums of two 16 MiB rows. Those take one work-item per row on PoCL and one
    work-group per row on a GPU (``ocl:wg_output``), whose 256 work-items stream 64 KiB each:
    long enough for ``may_overlap`` on either. At 8 rows of 1M, a GPU's work-items stream 16 KiB
    each and the sums stay on lane 0."""
    mm = MatmulDesc(MemoryDesc((m, k)), MemoryDesc((k, n)), MemoryDesc((m, n)))
    rowsum = ReductionDesc("sum", MemoryDesc((rows, length)), MemoryDesc((rows, 1)))
    shared_src = np.random.default_rng(1).uniform(-1, 1, (m, k)).astype(np.float32)
    return [
        _Workload(
            f"matmul {m}x{k} by {k}x{n}", mm,
            lambda rng: {"src": shared_src, "weights": rng.uniform(-1, 1, (k, n)).astype(np.float32)},
            lambda a: matmul.reference(a["src"], a["weights"]), tolerance.matmul(k)),
        _Workload(
            f"row sums of {rows}x{length}", rowsum,
            lambda rng: {"src": rng.uniform(-1, 1, (rows, length)).astype(np.float32)},
            lambda a: reduction.reference("sum", a["src"], (rows, 1)), tolerance.reduction("sum", length)),
    ]


async def _overlap_demo(engine, rounds: int, branches: int = 8) -> bool:
    """Each workload as eight independent requests on each kind of stream; True when results
    match numpy."""
    passed = True
    rng = np.random.default_rng(1)
    streams = {"out-of-order": await engine.stream(StreamFlags.out_of_order),
               "in-order": await engine.stream(StreamFlags.in_order)}
    for workload in _workloads():
        primitive = await engine.create_primitive(workload.desc)
        host = [workload.make_inputs(rng) for _ in range(branches)]
        device = [{name: await engine.from_numpy(x) for name, x in inputs.items()} for inputs in host]
        outs = [engine.memory(workload.desc.dst) for _ in range(branches)]
        timings: dict[str, list[float]] = {name: [] for name in streams}
        for _ in range(max(rounds, 3)):
            for name, stream in streams.items():
                started = time.perf_counter()
                for args, out in zip(device, outs):
                    stream.execute(primitive, {**args, "dst": out})
                await stream.wait()
                timings[name].append(time.perf_counter() - started)
        worst = 0.0
        for inputs, out in zip(host, outs):
            worst = max(worst, tolerance.max_error(await out.to_numpy(), workload.reference(inputs)))
        medians = {name: float(np.median(t)) for name, t in timings.items()}
        print(f"{branches} independent {workload.title} ({primitive.impl}); median of "
              f"{max(rounds, 3)} rounds:")
        for name, seconds in medians.items():
            print(f"  {name:>13} stream: {seconds * 1e3:8.2f} ms")
        print(f"  out-of-order speedup: {medians['in-order'] / medians['out-of-order']:.2f}x")
        print(_why(engine, primitive))
        for memory in (*[m for args in device for m in args.values()], *outs):
            memory.release()
        print(f"{primitive.desc.kind} results vs numpy: max error {worst:.2e} (threshold {workload.threshold:.0e})")
        passed = passed and worst <= workload.threshold
    return passed

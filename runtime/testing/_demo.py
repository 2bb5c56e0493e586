"""``triodnn demo``: a small async pipeline through a diamond of primitives, checked against numpy.

    x ─┬─ gelu_tanh ─┐
       └─ sigmoid ───┴─ mul ── clip

Several requests go through the diamond at once as trio tasks; each submits its commands with
event dependencies and awaits only its result. The same requests then run on an in-order stream
for comparison.
"""

from __future__ import annotations

import time

import numpy as np
import trio

from .._runtime import open_runtime, parse_engine_spec
from .._stream import StreamFlags
from .._values import BinaryDesc, EltwiseDesc
from .._values._memory_desc import MemoryDesc
from ..kernels import binary, eltwise, tolerance

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
        threshold = tolerance.ELTWISE_TRANSCENDENTAL
        passed = worst <= threshold
        print(f"results vs numpy: max error {worst:.2e} (threshold {threshold:.0e}): "
              f"{'PASSED' if passed else 'FAILED'}")
        return passed

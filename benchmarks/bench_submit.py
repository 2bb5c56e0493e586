"""Submission overhead: triodnn streams vs a raw pyopencl enqueue of the same kernel.

The kernel is a triodnn primitive (relu on 64 f32 by default, one work-group): triodnn runs it
with ``stream.execute``; the raw variant takes the primitive's own ``cl.Kernel``
(``primitive.launch.kernel``) and launch geometry (``primitive.spec``) and runs
``kernel.set_args(src, dst)`` + ``cl.enqueue_nd_range_kernel`` on a plain in-order queue of the
same context. Measured, per command:

* submit   -- host time of N submissions back to back, before any wait. For triodnn the clock
              stops when the stream actor has enqueued (and flushed) the last one
              (``await last.wait_submitted()``); ``execute()`` alone, the caller's side, is
              shown too. Raw: N enqueues + ``queue.flush()``.
* complete -- N submissions, then wait for the last one: ``await last`` / ``last.wait()``.
* roundtrip (extra) -- one command at a time, each awaited before the next.

Variants run interleaved in each repetition (rotating order); the tables give medians over the
repetitions and the ratio triodnn/raw of each repetition's times (median). Goal: triodnn
<= 2x raw.
"""

from __future__ import annotations

import gc
import time

import _common as common
import numpy as np
import pyopencl as cl
import trio

import triodnn

perf = time.perf_counter


def extra_args(parser) -> None:
    parser.add_argument("--n", type=int, default=None, help="submissions per batch (default 1000)")
    parser.add_argument("--reps", type=int, default=None, help="repetitions (default 25)")
    parser.add_argument("--elements", type=int, default=64, help="relu size in f32 elements (64)")


class Raw:
    """The same kernel through plain pyopencl on an in-order queue of the engine's context."""

    name = "raw pyopencl"

    def __init__(self, engine, primitive, src, dst) -> None:
        self.queue = cl.CommandQueue(engine.cl_context, engine.cl_device)
        self.kernel = primitive.launch.kernel
        self.global_size = primitive.spec.global_size
        self.local_size = primitive.spec.local_size
        self.buffers = (src.cl_buffer, dst.cl_buffer)

    async def submit(self, n: int) -> tuple[float, float]:
        kernel, queue, g, l, bufs = self.kernel, self.queue, self.global_size, self.local_size, self.buffers
        enqueue = cl.enqueue_nd_range_kernel
        t0 = perf()
        for _ in range(n):
            kernel.set_args(*bufs)
            enqueue(queue, kernel, g, l)
        t1 = perf()
        queue.flush()
        t2 = perf()
        await trio.to_thread.run_sync(queue.finish)
        return t1 - t0, t2 - t0

    async def complete(self, n: int) -> float:
        kernel, queue, g, l, bufs = self.kernel, self.queue, self.global_size, self.local_size, self.buffers
        enqueue = cl.enqueue_nd_range_kernel
        t0 = perf()
        for _ in range(n):
            kernel.set_args(*bufs)
            event = enqueue(queue, kernel, g, l)
        event.wait()
        return perf() - t0

    async def roundtrip(self, n: int) -> float:
        kernel, queue, g, l, bufs = self.kernel, self.queue, self.global_size, self.local_size, self.buffers
        enqueue = cl.enqueue_nd_range_kernel
        t0 = perf()
        for _ in range(n):
            kernel.set_args(*bufs)
            enqueue(queue, kernel, g, l).wait()
        return perf() - t0


class Triodnn:
    """``stream.execute`` on a triodnn stream of the same engine."""

    def __init__(self, name, stream, primitive, src, dst) -> None:
        self.name = name
        self.stream = stream
        self.primitive = primitive
        self.args = {"src": src, "dst": dst}

    async def submit(self, n: int) -> tuple[float, float]:
        execute, primitive, args = self.stream.execute, self.primitive, self.args
        t0 = perf()
        for _ in range(n):
            event = execute(primitive, args)
        t1 = perf()
        await event.wait_submitted()
        t2 = perf()
        await self.stream.wait()
        return t1 - t0, t2 - t0

    async def complete(self, n: int) -> float:
        execute, primitive, args = self.stream.execute, self.primitive, self.args
        t0 = perf()
        for _ in range(n):
            event = execute(primitive, args)
        if self.stream.strategy == "in_order":
            await event
        else:
            await self.stream.wait()  # out of order: the last command is not the last to finish
        return perf() - t0

    async def roundtrip(self, n: int) -> float:
        execute, primitive, args = self.stream.execute, self.primitive, self.args
        t0 = perf()
        for _ in range(n):
            await execute(primitive, args)
        return perf() - t0


async def run(args) -> dict:
    n = args.n or (200 if args.quick else 1000)
    reps = args.reps or (5 if args.quick else 25)
    n_roundtrip = max(20, n // 5)
    async with triodnn.open_runtime() as runtime:
        engine = await common.open_engine(runtime, args)
        desc = triodnn.MemoryDesc((args.elements,))
        primitive = await engine.create_primitive(triodnn.EltwiseDesc("relu", desc))
        host = np.linspace(-1.0, 1.0, args.elements, dtype=np.float32)
        src = await engine.from_numpy(host)
        dst = engine.memory(desc)
        variants = [
            Raw(engine, primitive, src, dst),
            Triodnn("triodnn in-order", await engine.stream(), primitive, src, dst),
            Triodnn(
                "triodnn out-of-order",
                await engine.stream(triodnn.StreamFlags.out_of_order),
                primitive,
                src,
                dst,
            ),
        ]
        oo_strategy = variants[2].stream.strategy
        variants[2].name += f" ({oo_strategy})"
        common.print_header(
            "bench_submit: host overhead per command, triodnn vs raw pyopencl",
            engine,
            args,
            notes=[
                f"kernel: {primitive.label} on {args.elements} f32, impl {primitive.impl}, "
                f"global {primitive.spec.global_size} local {primitive.spec.local_size}",
                f"N={n} submissions per batch (roundtrip: {n_roundtrip}), {reps} repetitions, "
                "variants interleaved; medians",
            ],
        )

        # Warm-up: every variant, every mode, once.
        for v in variants:
            await v.submit(min(n, 100))
            await v.complete(min(n, 100))
            await v.roundtrip(10)

        samples = {v.name: {"execute_only": [], "submit": [], "complete": [], "roundtrip": []} for v in variants}
        for rep in range(reps):
            for v in common.rotated(variants, rep):
                gc.collect()
                caller, submitted = await v.submit(n)
                gc.collect()
                completed = await v.complete(n)
                gc.collect()
                roundtrip = await v.roundtrip(n_roundtrip)
                s = samples[v.name]
                s["execute_only"].append(caller / n * 1e6)
                s["submit"].append(submitted / n * 1e6)
                s["complete"].append(completed / n * 1e6)
                s["roundtrip"].append(roundtrip / n_roundtrip * 1e6)

        # The kernel really ran: dst == relu(src).
        result = await dst.to_numpy()
        expected = np.where(host > 0, host, 0).astype(np.float32)
        correct = bool(np.array_equal(result, expected))

    raw = samples[variants[0].name]
    modes = [
        ("submit", "submit: N back to back, until enqueued+flushed"),
        ("complete", "complete: N submissions, then wait for the last"),
        ("roundtrip", "roundtrip: submit one, wait for it, repeat"),
    ]
    results = {"n": n, "n_roundtrip": n_roundtrip, "reps": reps, "elements": args.elements,
               "kernel": primitive.label, "impl": primitive.impl, "correct": correct,
               "goal": "triodnn <= 2x raw (submit and complete)", "variants": {}}
    rows = []
    for v in variants:
        s = samples[v.name]
        entry = {}
        for mode, _ in modes:
            ratios = [t / r for t, r in zip(s[mode], raw[mode])]
            entry[mode] = {
                "us_per_command_median": common.median(s[mode]),
                "us_per_command_min": min(s[mode]),
                "ratio_vs_raw_median": common.median(ratios),
                "samples_us": s[mode],
            }
        entry["execute_only"] = {"us_per_command_median": common.median(s["execute_only"]),
                                 "samples_us": s["execute_only"]}
        results["variants"][v.name] = entry
    for mode, label in modes:
        for v in variants:
            e = results["variants"][v.name][mode]
            rows.append([label if v is variants[0] else "", v.name, e["us_per_command_median"],
                         e["us_per_command_min"], e["ratio_vs_raw_median"]])
    common.print_table(["mode", "variant", "µs/cmd median", "µs/cmd min", "x raw (median)"], rows)
    rows = [[v.name, results["variants"][v.name]["execute_only"]["us_per_command_median"]]
            for v in variants[1:]]
    common.print_table(["caller side only: stream.execute()", "µs/call median"], rows)
    print(f"kernel output checked against numpy: {'OK' if correct else 'MISMATCH'}")
    goal = results["variants"]["triodnn in-order"]
    print(f"goal triodnn <= 2x raw: submit {goal['submit']['ratio_vs_raw_median']:.2f}x, "
          f"complete {goal['complete']['ratio_vs_raw_median']:.2f}x")
    return results, engine


def main() -> None:
    args = common.parse_args(__doc__.splitlines()[0], extra_args)
    results, engine = trio.run(run, args)
    common.write_json(args.json, "bench_submit", engine, args, results)
    if not results["correct"]:
        raise SystemExit("kernel output does not match numpy")


if __name__ == "__main__":
    main()

"""Completion latency: from an OpenCL event completing to the trio task that awaits it running.

Method, per sample: a ``pyopencl.UserEvent`` of the engine's context gates a marker; a trio task
awaits the marker; a plain OS thread (``threading``) records ``time.perf_counter()`` and at once
sets the user event COMPLETE; the task records ``perf_counter()`` right after its await returns.
Latency = the difference. Two variants, interleaved sample by sample:

* triodnn  -- ``event = stream.marker(deps=[user_event])``; ``await event`` (callbacks + the
              completion actor's poll before each I/O wait).
* callback -- plain OpenCL callbacks only (the baseline): ``cl.enqueue_marker(queue,
              wait_for=[user_event])`` on an in-order queue of the same context,
              ``marker.set_callback(COMPLETE, lambda s: token.run_sync_soon(trio_event.set))``,
              ``await trio_event.wait()``; no polling.

and these conditions, in alternating blocks:

* idle -- nothing else runs on the trio thread.
* busy X ms -- another trio task loops: X ms of pure-Python CPU work, then
          ``await trio.lowlevel.checkpoint()`` (``--busy-ms``, default 0.2, 0.5 and 1.0 ms;
          ``--busy-yield sleep0`` for ``trio.sleep(0)``).

Each wait is bounded (``--bound``, default 250 ms after the set): a sample that times out counts
as the bound, and the tables say how many did. A variant that reaches ``--max-timeouts`` (20) in
a condition takes no more samples there (its n is then smaller; its statistics come from the
samples taken): plain callbacks starve so often on some hosts that 300 samples would take
minutes.

A completion that arrives while the busy task runs can only be seen when that task yields, and
trio may run the busy task once more before the woken one (it reverses the order of each batch
of runnable tasks at random), so the floor for the busy conditions is about two work chunks.

The setter thread is itself a Python thread: while the trio thread is busy it would starve on
the GIL before it can even set the event (seconds, measured here), which wastes wall time but
not the measurement (the clock starts at the set). So the harness lowers
``sys.setswitchinterval`` while the setter wakes up, and the setter puts the default back just
before it takes the time and sets the event: everything after the set runs with the default.

A second section (``--kernel-samples``, 0 skips it) times a completion the device makes itself:
a one-work-item "spin" kernel (``--spin-iters``, ~0.4 ms on PoCL here), trio idle, from just
before the submission to the woken task, for triodnn (``await stream.execute(...)``), the plain
callback baseline, and a blocking ``event.wait()`` (clWaitForEvents) on the trio thread as the
reference: each path's median minus the reference's is its completion latency. A user event set
from the host does not show how soon a driver reports work the GPU finished; this does.

Goal: triodnn p99 <= 1 ms, idle and busy.
"""

from __future__ import annotations

import math
import queue
import random
import sys
import threading
import time

import _common as common
import numpy as np
import pyopencl as cl
import trio
from _common import SpinDesc

import triodnn

perf = time.perf_counter
COMPLETE = cl.command_execution_status.COMPLETE
WAKE_SWITCH_INTERVAL = 1e-4  # while the setter thread wakes up only; see the module docstring


def extra_args(parser) -> None:
    parser.add_argument("--samples", type=int, default=None,
                        help="samples per variant and condition (default 300; --quick 40)")
    parser.add_argument("--blocks", type=int, default=None,
                        help="idle/busy blocks the samples are split into (default 4; --quick 2)")
    parser.add_argument("--bound", type=float, default=0.25,
                        help="seconds a sample may wait after the set before it counts as a timeout (0.25)")
    parser.add_argument("--busy-ms", default="0.2,0.5,1.0",
                        help="ms of CPU work between checkpoints in the busy task; a comma list gives "
                             "one busy condition each (default 0.2,0.5,1.0; --quick 0.5)")
    parser.add_argument("--max-timeouts", type=int, default=20,
                        help="a variant that timed out this often in a condition takes no more samples "
                             "there (20): keeps a starved baseline from taking minutes")
    parser.add_argument("--kernel-samples", type=int, default=None,
                        help="samples per variant of the device-completed kernel section "
                             "(default 100; --quick 20; 0 skips it)")
    parser.add_argument("--spin-iters", type=int, default=300_000,
                        help="loop length of that section's one-work-item kernel (300000)")
    parser.add_argument("--busy-yield", choices=("checkpoint", "sleep0"), default="checkpoint",
                        help="how the busy task yields: trio.lowlevel.checkpoint() or trio.sleep(0)")



def wake_on_callback(token, cl_event) -> trio.Event:
    """The baseline: a trio.Event set by an OpenCL completion callback, and nothing else."""
    woken = trio.Event()

    def on_complete(status):
        try:
            token.run_sync_soon(woken.set)
        except trio.RunFinishedError:
            pass

    cl_event.set_callback(COMPLETE, on_complete)
    return woken

class Setter:
    """One OS thread that, per job, sleeps a little, records the time and sets a user event."""

    def __init__(self) -> None:
        self.jobs: queue.Queue = queue.Queue()
        self.default_interval = sys.getswitchinterval()
        self.thread = threading.Thread(target=self._run, name="bench-setter", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while True:
            job = self.jobs.get()
            if job is None:
                return
            time.sleep(job["delay"])
            sys.setswitchinterval(self.default_interval)
            job["t0"] = perf()
            job["user_event"].set_status(COMPLETE)

    def fire(self, user_event: cl.UserEvent, delay: float) -> dict:
        job = {"user_event": user_event, "delay": delay, "t0": None, "asked": perf()}
        sys.setswitchinterval(WAKE_SWITCH_INTERVAL)
        self.jobs.put(job)
        return job

    def stop(self) -> None:
        sys.setswitchinterval(self.default_interval)
        self.jobs.put(None)
        self.thread.join(timeout=5)


def calibrate_busy(ms: float) -> int:
    """Iterations of the busy loop's body that take about ``ms`` milliseconds."""
    n = 2000
    while True:
        t = perf()
        busy_work(n)
        dt = perf() - t
        if dt > 0.02:
            return max(1, int(n * ms * 1e-3 / dt))
        n *= 4


def busy_work(n: int) -> int:
    s = 0
    for i in range(n):
        s += i * i
    return s


async def busy_task(iterations: int, yield_kind: str, counter: list, task_status=trio.TASK_STATUS_IGNORED):
    task_status.started()
    pause = trio.lowlevel.checkpoint if yield_kind == "checkpoint" else (lambda: trio.sleep(0))
    while True:
        busy_work(iterations)
        counter[0] += 1
        await pause()


async def wait_bounded(wait, job: dict, bound: float, delay: float) -> tuple[float, bool]:
    """Await ``wait()``; return (latency, timed_out, setter lateness), in seconds.

    The bound counts from the set.

    Deadlines are placed after the set is due plus the bound, so that no timer wakes the trio
    thread while the completion is in flight (a wake-up would let triodnn's poll see it early).
    """
    deadline = job["asked"] + delay + bound
    while True:
        # trio's clock has its own offset: convert the perf_counter deadline to it.
        with trio.move_on_at(trio.current_time() + (deadline - perf())):
            await wait()
            return perf() - job["t0"], False, job["t0"] - job["asked"] - delay
        now = perf()
        t0 = job["t0"]
        if t0 is not None and now - t0 >= bound:
            return bound, True, t0 - job["asked"] - delay
        if t0 is None and now - job["asked"] > 30.0:
            raise RuntimeError("the setter thread did not run for 30 s")
        deadline = (t0 + bound) if t0 is not None else now + bound


class TriodnnVariant:
    name = "triodnn"

    def __init__(self, stream) -> None:
        self.stream = stream

    async def sample(self, setter: Setter, context, bound: float, delay: float):
        user_event = cl.UserEvent(context)
        event = self.stream.marker(deps=[user_event])
        await event.wait_submitted()
        job = setter.fire(user_event, delay)
        return await wait_bounded(event.wait, job, bound, delay)


class CallbackVariant:
    name = "plain callback"

    def __init__(self, engine) -> None:
        self.queue = cl.CommandQueue(engine.cl_context, engine.cl_device)
        self.token = trio.lowlevel.current_trio_token()

    async def sample(self, setter: Setter, context, bound: float, delay: float):
        user_event = cl.UserEvent(context)
        marker = cl.enqueue_marker(self.queue, wait_for=[user_event])
        self.queue.flush()
        woken = wake_on_callback(self.token, marker)
        job = setter.fire(user_event, delay)
        # On a timeout the late callback later sets a trio.Event nobody waits for: harmless.
        return await wait_bounded(woken.wait, job, bound, delay)


class KernelSection:
    """Submit → woken for a kernel the device completes, trio idle (see the module docstring)."""

    def __init__(self, engine, stream, primitive, src, dst) -> None:
        self.stream = stream
        self.primitive = primitive
        self.args = {"src": src, "dst": dst}
        self.queue = cl.CommandQueue(engine.cl_context, engine.cl_device)
        self.kernel = primitive.launch.kernel
        self.buffers = (src.cl_buffer, dst.cl_buffer)
        self.token = trio.lowlevel.current_trio_token()

    def _raw_launch(self) -> cl.Event:
        self.kernel.set_args(*self.buffers)
        event = cl.enqueue_nd_range_kernel(self.queue, self.kernel, (1,), (1,))
        self.queue.flush()
        return event

    async def triodnn(self, limit: float) -> tuple[float, bool]:
        t0 = perf()
        event = self.stream.execute(self.primitive, self.args)
        with trio.move_on_after(limit):
            await event
            return perf() - t0, False
        await self.stream.wait()  # do not let a late kernel overlap the next sample
        return limit, True

    async def callback(self, limit: float) -> tuple[float, bool]:
        t0 = perf()
        event = self._raw_launch()
        woken = wake_on_callback(self.token, event)
        with trio.move_on_after(limit):
            await woken.wait()
            return perf() - t0, False
        event.wait()
        return limit, True

    async def blocking(self, limit: float) -> tuple[float, bool]:
        t0 = perf()
        self._raw_launch().wait()  # blocks the trio thread; nothing else runs here
        elapsed = perf() - t0
        await trio.lowlevel.checkpoint()
        return elapsed, False


async def run_kernel_section(engine, args, bound: float) -> dict:
    samples = args.kernel_samples if args.kernel_samples is not None else (20 if args.quick else 100)
    if samples <= 0:
        return {}, None
    primitive = await engine.create_primitive(SpinDesc(args.spin_iters))
    src = await engine.from_numpy(np.zeros(1, np.float32))
    dst = engine.memory(primitive.desc.arg_descs["dst"])
    section = KernelSection(engine, await engine.stream(), primitive, src, dst)
    variants = [("triodnn", section.triodnn), ("plain callback", section.callback),
                ("blocking wait (reference)", section.blocking)]
    for _ in range(3):  # warm-up, and the kernel's duration for the wait limit
        estimate, _ = await section.blocking(math.inf)
    limit = estimate + bound
    times = {name: [] for name, _ in variants}
    timeouts = {name: 0 for name, _ in variants}
    for i in range(samples):
        for name, sample in common.rotated(variants, i):
            if timeouts[name] >= args.max_timeouts:
                continue
            elapsed, timed_out = await sample(limit)
            times[name].append(elapsed * 1e3)
            timeouts[name] += timed_out
    reference = common.median(times["blocking wait (reference)"])
    section_results = {"spin_iters": args.spin_iters, "kernel_ms_estimate": estimate * 1e3,
                       "limit_s": limit, "variants": {}}
    rows = []
    for name, _ in variants:
        values = times[name]
        entry = {
            "median_ms": common.median(values), "p90_ms": common.percentile(values, 90),
            "p99_ms": common.percentile(values, 99), "max_ms": max(values), "n": len(values),
            "timeouts": timeouts[name], "median_over_blocking_ms": common.median(values) - reference,
            "samples_ms": values,
        }
        section_results["variants"][name] = entry
        rows.append([name, len(values), entry["median_ms"], entry["p90_ms"], entry["p99_ms"], entry["max_ms"],
                     entry["timeouts"], entry["median_over_blocking_ms"]])
    title = (f"device-completed kernel (one work-item, {args.spin_iters} iterations, ~{estimate * 1e3:.2f} ms), "
             "trio idle: submit -> task woken")
    return section_results, (rows, title)


def print_kernel_table(table) -> None:
    rows, title = table
    common.print_table(
        ["variant", "n", "median ms", "p90 ms", "p99 ms", "max ms", "timeouts", "median - blocking ms"],
        rows,
        title=title,
    )


async def run(args):
    samples = args.samples or (40 if args.quick else 300)
    blocks = args.blocks or (2 if args.quick else 4)
    per_block = math.ceil(samples / blocks)
    bound = args.bound
    busy_levels = [0.5] if args.quick and args.busy_ms == "0.2,0.5,1.0" else [
        float(x) for x in args.busy_ms.split(",") if x.strip()
    ]
    iterations = {ms: calibrate_busy(ms) for ms in busy_levels}
    conditions = ["idle"] + [f"busy {ms:g} ms" for ms in busy_levels]
    busy_of = {f"busy {ms:g} ms": ms for ms in busy_levels}
    rng = random.Random(12345)
    setter = Setter()
    lat, timeouts, late, busy_rate = {}, {}, {}, {c: [] for c in conditions}
    try:
        async with triodnn.open_runtime() as runtime:
            engine = await common.open_engine(runtime, args)
            context = engine.cl_context
            stream = await engine.stream()
            variants = [TriodnnVariant(stream), CallbackVariant(engine)]
            for c in conditions:
                for v in variants:
                    lat[(c, v.name)], timeouts[(c, v.name)], late[(c, v.name)] = [], 0, []
            common.print_header(
                "bench_completion: OpenCL completion -> awaiting trio task woken",
                engine,
                args,
                notes=[
                    f"{samples} samples per variant and condition, in {blocks} blocks per condition; "
                    f"wait bound {bound * 1e3:.0f} ms after the set",
                    "busy task: " + ", ".join(
                        f"{ms:g} ms = {iterations[ms]} loop iterations" for ms in busy_levels
                    ) + f" of Python work, then {args.busy_yield}",
                ],
            )
            # Warm-up (thread start, first markers).
            for v in variants:
                for _ in range(5):
                    await v.sample(setter, context, bound, 0.0005)
            stats_before = runtime.statistics()
            for block in range(blocks):
                for cond in common.rotated(conditions, block):
                    async with trio.open_nursery() as nursery:
                        counter = [0]
                        if cond in busy_of:
                            ms = busy_of[cond]
                            await nursery.start(busy_task, iterations[ms], args.busy_yield, counter)
                        started = perf()
                        for i in range(per_block):
                            for v in common.rotated(variants, i):
                                if timeouts[(cond, v.name)] >= args.max_timeouts:
                                    continue
                                delay = rng.uniform(0.3e-3, 1.5e-3)
                                latency, timed_out, lateness = await v.sample(setter, context, bound, delay)
                                key = (cond, v.name)
                                lat[key].append(latency)
                                timeouts[key] += timed_out
                                late[key].append(lateness)
                        if cond in busy_of:
                            busy_rate[cond].append(counter[0] / (perf() - started))
                        nursery.cancel_scope.cancel()  # stops the busy task at its next checkpoint
            stats_after = runtime.statistics()
            kernel_results, kernel_table = await run_kernel_section(engine, args, bound)
    finally:
        setter.stop()

    results = {
        "samples": samples, "bound_s": bound, "max_timeouts": args.max_timeouts, "busy_ms": busy_levels,
        "busy_iterations": {str(k): v for k, v in iterations.items()}, "busy_yield": args.busy_yield,
        "goal": "triodnn p99 <= 1 ms, idle and busy",
        "completion_actor": {
            "by_waiter": stats_after.completed_by_waiter - stats_before.completed_by_waiter,
            "by_callback": stats_after.completed_by_callback - stats_before.completed_by_callback,
            "by_poll": stats_after.completed_by_poll - stats_before.completed_by_poll,
        },
        "conditions": {},
    }
    rows = []
    for cond in conditions:
        results["conditions"][cond] = {}
        if cond in busy_of:
            results["conditions"][cond]["busy_task_passes_per_s"] = common.median(busy_rate[cond])
        for v in variants:
            values = [x * 1e3 for x in lat[(cond, v.name)]]
            entry = {
                "median_ms": common.median(values),
                "p90_ms": common.percentile(values, 90),
                "p99_ms": common.percentile(values, 99),
                "max_ms": max(values),
                "timeouts": timeouts[(cond, v.name)],
                "n": len(values),
                "setter_late_ms_median": common.median(late[(cond, v.name)]) * 1e3,
                "setter_late_ms_max": max(late[(cond, v.name)]) * 1e3,
                "samples_ms": values,
            }
            results["conditions"][cond][v.name] = entry
            entry["stopped_early"] = entry["timeouts"] >= args.max_timeouts
            rows.append([cond, v.name, len(values), entry["median_ms"], entry["p90_ms"], entry["p99_ms"],
                         entry["max_ms"],
                         f"{entry['timeouts']}" + (" (then stopped)" if entry["stopped_early"] else "")])
    common.print_table(
        ["condition", "variant", "n", "median ms", "p90 ms", "p99 ms", "max ms",
         f"timeouts (counted as {bound * 1e3:.0f} ms)"],
        rows,
    )
    rows = []
    for cond in conditions:
        t = results["conditions"][cond]["triodnn"]
        b = results["conditions"][cond]["plain callback"]
        p99_ratio = b["p99_ms"] / t["p99_ms"]
        capped = b["timeouts"] > 0 and b["p99_ms"] >= bound * 1e3  # the baseline's p99 is the bound
        rows.append([cond, b["median_ms"] / t["median_ms"], f">= {p99_ratio:.0f}" if capped else p99_ratio,
                     "yes" if t["p99_ms"] <= 1.0 else "NO"])
    common.print_table(
        ["condition", "callback/triodnn median", "callback/triodnn p99", "goal: triodnn p99 <= 1 ms"], rows
    )
    if any(isinstance(r[2], str) for r in rows):
        print("'>=': the baseline's p99 sample is a timeout, counted at the bound; the real ratio is larger.")
    ca = results["completion_actor"]
    print(f"triodnn completions delivered by queue waiter: {ca['by_waiter']}, "
          f"by callback: {ca['by_callback']}, by poll: {ca['by_poll']}")
    for cond in conditions:
        if cond in busy_of:
            print(f"{cond}: the busy task made {common.median(busy_rate[cond]):.0f} passes/s")
    print()
    if kernel_table is not None:
        print_kernel_table(kernel_table)
    results["kernel_completion"] = kernel_results
    return results, engine


def main() -> None:
    args = common.parse_args(__doc__.splitlines()[0], extra_args)
    results, engine = trio.run(run, args)
    common.write_json(args.json, "bench_completion", engine, args, results)


if __name__ == "__main__":
    main()

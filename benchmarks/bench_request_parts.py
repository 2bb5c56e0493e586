"""bench_request_parts: the host time of one graph request's submission, call by call.

The request: the 2-layer MLP of ``bench_pipeline`` (x 32x128, W1 128x256, W2 256x64, weights given
once), N requests through ``runner.map`` (4 in flight), then N awaited one at a time. Each part of
the submission path is wrapped in a timer (``time.perf_counter_ns`` around the call; each wrapper
adds a fraction of a µs), so the table gives the inclusive host time of each call and how often
a request makes it: the runner's Python (bind, ``Execution.submit``, the recording, the stream,
the stream actor) against the driver's own enqueue calls (``cl write``, ``cl kernel``,
``cl read``, reached through pyopencl). Then the floor of a kernel enqueue: the request's own
kernel objects enqueued through pyopencl on an idle queue of their own. The last request's
output is checked against float64 numpy.

    python benchmarks/bench_request_parts.py [--engine gpu:0] [--requests 2000]
"""

from __future__ import annotations

import collections
import functools
import statistics
import time

import _common as common
import numpy as np
import pyopencl as cl
import trio
from bench_pipeline import X, Y, mlp_graph
from bench_request_stages import mlp_requests

import triodnn
from triodnn import StreamFlags
from triodnn import _stream as stream_module
from triodnn.actors import _stream_actor as stream_actor_module
from triodnn.graph import _execution as execution_module
from triodnn.graph import _recorded_request as recorded_module
from triodnn.graph import compile_graph

_totals: dict[str, list[int]] = collections.defaultdict(lambda: [0, 0])


def extra_args(parser) -> None:
    parser.add_argument("--requests", type=int, default=None, help="requests per variant (default 2000, quick 100)")


def _timed(name: str, fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        t0 = time.perf_counter_ns()
        try:
            return fn(*args, **kwargs)
        finally:
            entry = _totals[name]
            entry[0] += time.perf_counter_ns() - t0
            entry[1] += 1
    return wrapper


def _wrap_parts() -> None:
    """Timers around the parts, by the module attributes the request path calls them through."""
    sa = stream_actor_module
    sa._write_buffer = _timed("cl write (driver)", sa._write_buffer)
    sa._read_buffer = _timed("cl read (driver)", sa._read_buffer)
    cl.enqueue_nd_range_kernel = _timed("cl kernel (driver)", cl.enqueue_nd_range_kernel)
    for owner, name, label in (
        (sa.StreamActor, "_enqueue_sequence", "StreamActor._enqueue_sequence"),
        (sa.StreamActor, "_flush_queue", "StreamActor._flush_queue (clFlush)"),
        (stream_module.Stream, "submit_sequence", "Stream.submit_sequence"),
        (recorded_module.RequestRecording, "submit", "RequestRecording.submit"),
        (execution_module.Execution, "submit", "Execution.submit"),
        (execution_module.GraphRunner, "_execution", "GraphRunner._execution (bind)"),
        (recorded_module.RequestOutputs, "take", "RequestOutputs.take"),
    ):
        setattr(owner, name, _timed(label, getattr(owner, name)))


def _table(title: str, n: int, wall_us: float) -> None:
    rows = [[name, ns / count / 1e3, count / n] for name, (ns, count) in sorted(_totals.items(), key=lambda kv: -kv[1][0])]
    common.print_table(["call", "µs a call", "calls a request"], rows, f"{title}: {wall_us:.1f} µs a request (timers on)")
    print()


async def run(args):
    n = args.requests or (100 if args.quick else 2000)
    weights, xs, wants = mlp_requests(n)
    want = wants[-1]
    results: dict = {"requests": n}
    async with triodnn.open_runtime() as rt:
        engine = await common.open_engine(rt, args)
        common.print_header("bench_request_parts: one MLP request's submission, call by call", engine, args,
                            [f"{n} requests per variant; inclusive host time per call, timers around each"])
        stream = await engine.stream(StreamFlags.in_order)
        runner = await compile_graph(mlp_graph(32, 128, 256, 64), engine, constants=weights)
        for x in xs[:50]:
            await runner.run(stream, {X: x})
        _wrap_parts()
        last = None
        for variant in ("map, 4 in flight", "await run, one at a time"):
            _totals.clear()
            t0 = time.perf_counter_ns()
            if variant.startswith("map"):
                async with runner.map(({X: x} for x in xs), stream=stream, max_in_flight=4) as outputs:
                    async for outputs_of_one in outputs:
                        last = outputs_of_one
            else:
                for x in xs:
                    last = await runner.run(stream, {X: x})
            wall = (time.perf_counter_ns() - t0) / n / 1e3
            assert last is not None and np.allclose(last[Y], want, rtol=1e-4, atol=1e-4), variant
            _table(variant, n, wall)
            results[variant] = {"us_per_request": wall,
                                "us_per_call": {k: ns / c / 1e3 for k, (ns, c) in _totals.items()}}
        # The floor of a kernel enqueue: the request's own kernels, arguments set, on an idle queue.
        steps = runner._request_recording()._sets[0].plan.steps
        queue = cl.CommandQueue(engine.cl_context, engine.cl_device)
        enqueue = cl.enqueue_nd_range_kernel.__wrapped__
        times = []
        for _ in range(min(n, 300)):
            for step in steps:
                t0 = time.perf_counter_ns()
                enqueue(queue, step.kernel, step.global_size, step.local_size)
                times.append(time.perf_counter_ns() - t0)
            queue.finish()
        floor = statistics.median(times) / 1e3
        print(f"a kernel of the request enqueued through pyopencl on an idle queue: median {floor:.2f} µs")
        results["kernel_enqueue_floor_us"] = floor
        return results, engine


def main() -> None:
    args = common.parse_args(__doc__.splitlines()[0], extra_args)
    results, engine = trio.run(run, args)
    common.write_json(args.json, "bench_request_parts", engine, args, results)


if __name__ == "__main__":
    main()

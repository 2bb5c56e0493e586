"""bench_request_stages: where the microseconds of one graph request go, stage by stage.

The request: the 2-layer MLP of ``bench_pipeline`` (x 32x128, W1 128x256, W2 256x64, weights given
once), one request at a time, on an in-order and an out-of-order stream. Each request is taken
apart with the runner's own internals (this script measures them; users call ``runner.run``):

  bind      ``GraphRunner._execution``: inputs checked and converted (host Python);
  submit    ``Execution.submit``: the recorded request's command built and enqueued (Python
            and the driver's enqueue calls of the upload, the kernels and the read-back);
  device    from the end of submit until the host sees the command complete, polling its
            status in a tight loop (device work, copies and the driver's launch latency);
  wake-up   ``await`` of the result in the normal way minus the polled path: how long the
            completion path (poll passes, waiter thread) adds after the device is done;
  finish    the outputs shaped and handed back, the command already complete.

Beside them, the floor: raw pyopencl enqueuing the very same commands (the request's own kernel
objects and buffers, a queue of its own), then polling the read-back's status.

Both columns and the floor are sampled in turn within each repetition (interleaved); medians of
per-stage times over N requests per repetition, then the median over repetitions. The outputs of
every request are checked against float64 numpy.

    python benchmarks/bench_request_stages.py [--engine gpu:0] [--requests 200] [--reps 7]
"""

from __future__ import annotations

import time

import _common as common
import numpy as np
import pyopencl as cl
import trio
from bench_pipeline import B1, B2, W1, W2, X, Y, mlp_graph

import triodnn
from triodnn import StreamFlags
from triodnn.graph import compile_graph

STAGES = ("bind", "submit", "device", "wake-up", "finish")


def extra_args(parser) -> None:
    parser.add_argument("--requests", type=int, default=None, help="requests per sample (default 200, quick 30)")
    parser.add_argument("--reps", type=int, default=None, help="repetitions (default 7, quick 3)")


def _done(cl_event) -> bool:
    return cl_event.command_execution_status <= cl.command_execution_status.COMPLETE


async def staged(runner, stream, x, want, polled: bool) -> dict[str, float]:
    """One request, stage by stage (ns). ``polled``: poll the command's status until complete
    before awaiting (the device stage); else await at once (device + wake-up)."""
    t0 = time.perf_counter_ns()
    execution = runner._execution(stream, {X: x}, (), None, frozenset(), copy_inputs=False)
    t1 = time.perf_counter_ns()
    submitted = execution.submit()
    t2 = time.perf_counter_ns()
    assert submitted is not None, "the MLP's requests go as recorded commands"
    event = submitted._event
    if polled:
        await event.wait_submitted()
        native = event.cl_event
        while not _done(native):
            pass
        t3 = time.perf_counter_ns()
        await event
        t4 = time.perf_counter_ns()
        out = await submitted.result()
        t5 = time.perf_counter_ns()
        times = {"bind": t1 - t0, "submit": t2 - t1, "device": t3 - t2, "finish": (t5 - t4) + (t4 - t3)}
    else:
        out = await submitted.result()
        t5 = time.perf_counter_ns()
        times = {"bind": t1 - t0, "submit": t2 - t1, "awaited": t5 - t2}
    np.testing.assert_allclose(out[Y], want, rtol=1e-4, atol=1e-4)
    return times


def raw_request(queue, recording_set, plan_steps, x, y) -> tuple[int, int]:
    """The request's commands through raw pyopencl: (enqueue ns, enqueue-to-complete ns)."""
    upload, download = recording_set
    t0 = time.perf_counter_ns()
    cl.enqueue_copy(queue, upload, x, is_blocking=False)
    for kernel, gs, ls in plan_steps:
        cl.enqueue_nd_range_kernel(queue, kernel, gs, ls)
    done = cl.enqueue_copy(queue, y, download, is_blocking=False)
    queue.flush()
    t1 = time.perf_counter_ns()
    while not _done(done):
        pass
    return t1 - t0, time.perf_counter_ns() - t1


def mlp_requests(n: int) -> tuple[dict, list, list]:
    """The MLP's weights (given once), ``n`` request inputs x, and each request's float64
    reference output."""
    rng = np.random.default_rng(0)
    weights = {W1: rng.uniform(-0.1, 0.1, (128, 256)).astype(np.float32),
               B1: rng.uniform(-0.1, 0.1, 256).astype(np.float32),
               W2: rng.uniform(-0.1, 0.1, (256, 64)).astype(np.float32),
               B2: rng.uniform(-0.1, 0.1, 64).astype(np.float32)}
    xs = [rng.uniform(-1, 1, (32, 128)).astype(np.float32) for _ in range(n)]
    w = {k: v.astype(np.float64) for k, v in weights.items()}
    want = [np.maximum(x @ w[W1] + w[B1], 0) @ w[W2] + w[B2] for x in xs]
    return weights, xs, want


async def run(args):
    n = args.requests or (30 if args.quick else 200)
    reps = args.reps or (3 if args.quick else 7)
    weights, xs, want = mlp_requests(n)
    results: dict = {"requests": n, "reps": reps}
    async with triodnn.open_runtime() as rt:
        engine = await common.open_engine(rt, args)
        common.print_header("bench_request_stages: one MLP request, stage by stage", engine, args,
                            [f"{n} requests one at a time per sample, {reps} repetitions interleaved; medians"])
        streams = {"in-order": await engine.stream(StreamFlags.in_order),
                   "out-of-order": await engine.stream(StreamFlags.out_of_order)}
        runner = await compile_graph(mlp_graph(32, 128, 256, 64), engine, constants=weights)
        for stream in streams.values():
            await runner.run(stream, {X: xs[0]})
        # The raw floor replays the recorded request's own kernels on its own buffers.
        recording = runner._request_recording()
        kept = recording._sets[0]
        plan_steps = [(step.kernel, step.global_size, step.local_size) for step in kept.plan.steps]
        upload = kept.inputs[[lt.id for lt in runner.inputs].index(X)]  # the set's upload buffer
        download = kept.table[recording._outputs[0][0]]
        queue = cl.CommandQueue(engine.cl_context, engine.cl_device)
        y = np.empty((32, 64), np.float32)
        samples: dict[str, dict[str, list[float]]] = {name: {} for name in (*streams, "raw pyopencl")}
        for rep in range(reps):
            for name, stream in common.rotated(list(streams.items()), rep):
                per: dict[str, list[int]] = {}
                for polled in (True, False):
                    for x, ref in zip(xs, want):
                        for stage, ns in (await staged(runner, stream, x, ref, polled)).items():
                            per.setdefault(stage, []).append(ns)
                med = {stage: common.median(v) / 1e3 for stage, v in per.items()}
                med["wake-up"] = med.pop("awaited") - med["device"] - med["finish"]
                med["total"] = sum(med[s] for s in STAGES)
                for stage, us in med.items():
                    samples[name].setdefault(stage, []).append(us)
            enq, dev = [], []
            for x, ref in zip(xs, want):
                e, d = raw_request(queue, (upload, download), plan_steps, x, y)
                np.testing.assert_allclose(y, ref, rtol=1e-4, atol=1e-4)
                enq.append(e)
                dev.append(d)
            raw = samples["raw pyopencl"]
            raw.setdefault("submit", []).append(common.median(enq) / 1e3)
            raw.setdefault("device", []).append(common.median(dev) / 1e3)
            raw.setdefault("total", []).append((common.median(enq) + common.median(dev)) / 1e3)
        table = {name: {stage: common.median(v) for stage, v in stages.items()} for name, stages in samples.items()}
        rows = []
        for stage in (*STAGES, "total"):
            rows.append([stage, *(table[name].get(stage, float("nan")) for name in samples)])
        common.print_table(["stage (µs)", *samples], rows,
                           "One request, stage by stage (median µs; raw: the same commands through pyopencl)")
        floor = table["raw pyopencl"]["total"]
        for name in streams:
            print(f"{name}: {table[name]['total']:.1f} µs a request, {table[name]['total'] / floor:.2f}x raw "
                  f"pyopencl ({floor:.1f} µs), {table[name]['total'] - table[name]['device']:.1f} µs above "
                  "what the host sees of the device")
        results["stages_us"] = table
        return results, engine


def main() -> None:
    args = common.parse_args(__doc__.splitlines()[0], extra_args)
    results, engine = trio.run(run, args)
    common.write_json(args.json, "bench_request_stages", engine, args, results)


if __name__ == "__main__":
    main()

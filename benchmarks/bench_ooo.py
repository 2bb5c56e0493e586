"""Out-of-order streams: 8 independent small kernels, out-of-order vs in-order stream.

One batch = 8 independent chains of ``--chain`` kernels (default 1: simply 8 independent
kernels), each chain on its own buffers, all submitted, then ``await stream.wait()``. The kernel
is a triodnn eltwise primitive (``--alg``, default gelu_erf: transcendental, so each work-group
does measurable work); within a chain, kernel j reads chain buffer j and writes buffer j+1 and
depends on kernel j-1 (``deps``). Variants, interleaved in each repetition (rotating order), same
engine, same primitive, same buffers:

* in-order      -- a triodnn in-order stream;
* out-of-order  -- a triodnn out-of-order stream with the engine's own strategy (lanes: lane 0
                   for every kernel that does not leave the device idle for long, see
                   ``triodnn.actors._ooo_policy``; PoCL one lane per core, NVIDIA 8);
* forced        -- for reference, an out-of-order stream of a second engine (same device, its
                   own context, primitive and buffers) opened with ``TRIODNN_OOO_STRATEGY`` set to
                   ``lanes:N:spread`` (every independent kernel on the next lane, the placement
                   before the fast-dispatch work of BENCHMARKS.md §8; ``lanes:8`` where the default
                   is native); the variable is read when an engine opens;
* host wait    -- the in-order and out-of-order streams again, but the batch ends with a
                   blocking ``clWaitForEvents`` on a marker instead of ``await``: the device's
                   concurrency through triodnn's submission path, without its completion path;
* raw in-order / raw OOO queue / raw 8 queues -- the same cl.Kernel through plain pyopencl
                   (``queue.finish()`` to wait): what the device itself offers, without triodnn.

Calibration row (``--spin-iters``, 0 to skip): the same variants on a custom one-work-item
"spin" kernel (a dependent float loop, ~1.2 ms on PoCL here; wrapped as a triodnn primitive through
``engine.create_primitive`` with a duck-typed descriptor). It shows what the device and triodnn's
stream machinery give when each kernel is long but occupies one core / one SM: the ceiling the
eltwise rows are compared with.

Reported: median wall time per batch and the ratio in-order / out-of-order for each size
(elements per kernel). triodnn's primitives pick their own geometry (CPU: 16 floats per
work-item, 16 work-items per group, so 256 elements per work-group; GPU: 256 per group), so the
size sets the number of work-groups per kernel. Every variant's output is checked against numpy
after the timing (outputs zeroed first), so no variant can time a no-op.

On NVIDIA's OpenCL an event callback for GPU work arrives ~20 ms after the work (measured on an
H200, see bench_completion's kernel section) and triodnn waits on callbacks when the trio thread
is idle: there the ``await`` rows show that lag, and the host-wait rows show what the lanes give.

Goals: >= 1.7x on PoCL (2 cores), >= 5x on an NVIDIA GPU.
"""

from __future__ import annotations

import contextlib
import gc
import os
import time

import _common as common
import numpy as np
import pyopencl as cl
import trio
from _common import SpinDesc

import triodnn
from triodnn.kernels import eltwise as eltwise_kernels
from triodnn.kernels import tolerance

perf = time.perf_counter
KERNELS = 8
STRATEGY_ENV = "TRIODNN_OOO_STRATEGY"
HW_IN = "in-order, host wait"
DEFAULT_SIZES = {"cpu": "256,1024,4096,16384,65536,262144", "gpu": "256,4096,65536,1048576,16777216"}


def extra_args(parser) -> None:
    parser.add_argument("--sizes", default=None,
                        help="elements per kernel, comma list (default CPU "
                             f"{DEFAULT_SIZES['cpu']}; GPU {DEFAULT_SIZES['gpu']})")
    parser.add_argument("--chain", type=int, default=1, help="dependent kernels per chain (1)")
    parser.add_argument("--alg", default="gelu_erf", help="eltwise algorithm (gelu_erf)")
    parser.add_argument("--reps", type=int, default=None, help="repetitions (default 20; --quick 3)")
    parser.add_argument("--inner", type=int, default=5, help="batches per variant per repetition (5)")
    parser.add_argument("--no-raw", action="store_true", help="skip the raw pyopencl reference variants")
    parser.add_argument("--no-forced", action="store_true", help="skip the forced-strategy engine")
    parser.add_argument("--spin-iters", type=int, default=1_000_000,
                        help="loop length of the calibration spin kernel"
                             " (1000000: about 1.2 ms on the PoCL CPU here; 0 skips it)")


@contextlib.contextmanager
def environment(name: str, value: str):
    old = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = old


class Workload:
    """8 chains of buffers and one primitive on one engine."""

    def __init__(self, engine, primitive, chains) -> None:
        self.engine = engine
        self.primitive = primitive
        self.chains = chains  # chains[i] = [Memory x0, x1, ..., xL]

    @classmethod
    async def create(cls, engine, op_desc, length: int, inputs: list[np.ndarray]):
        desc = op_desc.arg_descs["dst"]
        n = desc.dims
        primitive = await engine.create_primitive(op_desc)
        chains = []
        for i in range(KERNELS):
            chain = [await engine.from_numpy(inputs[i])]
            for _ in range(length):
                memory = engine.memory(desc)
                await memory.write(np.zeros(n, np.float32))  # initialised: no garbage/denormals
                chain.append(memory)
            chains.append(chain)
        return cls(engine, primitive, chains)

    async def zero_outputs(self) -> None:
        for chain in self.chains:
            for memory in chain[1:]:
                await memory.write(np.zeros(memory.desc.dims, np.float32))

    async def outputs(self) -> list[np.ndarray]:
        return [await chain[-1].to_numpy() for chain in self.chains]


def _strategy_name(engine) -> str:
    strategy = engine.out_of_order_strategy
    if strategy.kind == "native":
        return "native"
    return f"lanes:{strategy.lanes}" + (":spread" if strategy.spread else "")


class TriodnnVariant:
    """Submit through a triodnn stream; ``await stream.wait()``, or with ``host_wait`` a blocking
    ``clWaitForEvents`` on the stream's marker (isolates the device's concurrency from triodnn's
    completion path)."""

    def __init__(self, name: str, stream, work: Workload, host_wait: bool = False) -> None:
        self.name = name
        self.stream = stream
        self.work = work
        self.host_wait = host_wait

    async def batch(self) -> float:
        execute, primitive, chains = self.stream.execute, self.work.primitive, self.work.chains
        t0 = perf()
        for chain in chains:
            deps = ()
            for j in range(len(chain) - 1):
                deps = [execute(primitive, {"src": chain[j], "dst": chain[j + 1]}, deps=deps)]
        if self.host_wait:
            marker = self.stream.marker()
            await marker.wait_submitted()  # the actor has enqueued and flushed everything
            marker.cl_event.wait()  # blocks the trio thread: nothing else runs in this benchmark
        else:
            await self.stream.wait()
        return perf() - t0


class RawVariant:
    """The primitive's cl.Kernel on plain pyopencl queues; kernels go round-robin over queues."""

    def __init__(self, name: str, queues: list, work: Workload) -> None:
        self.name = name
        self.queues = queues
        self.work = work
        self.kernel = work.primitive.launch.kernel
        self.global_size = work.primitive.spec.global_size
        self.local_size = work.primitive.spec.local_size

    async def batch(self) -> float:
        kernel, g, l, queues = self.kernel, self.global_size, self.local_size, self.queues
        enqueue = cl.enqueue_nd_range_kernel
        t0 = perf()
        for i, chain in enumerate(self.work.chains):
            queue = queues[i % len(queues)]
            wait_for = None
            for j in range(len(chain) - 1):
                kernel.set_args(chain[j].cl_buffer, chain[j + 1].cl_buffer)
                wait_for = [enqueue(queue, kernel, g, l, wait_for=wait_for)]
        for queue in queues:
            queue.flush()
        for queue in queues:
            queue.finish()
        return perf() - t0


def reference(alg: str, x: np.ndarray, length: int) -> np.ndarray:
    for _ in range(length):
        x = eltwise_kernels.reference(alg, x)
    return x


async def run(args):
    reps = args.reps or (3 if args.quick else 20)
    length = args.chain
    rng = np.random.default_rng(7)
    results = {"kernels_per_batch": KERNELS, "chain": length, "alg": args.alg, "reps": reps,
               "inner": args.inner, "goal": ">= 1.7x on PoCL, >= 5x on NVIDIA", "cases": {}}
    async with triodnn.open_runtime() as runtime:
        engine = await common.open_engine(runtime, args)
        default = engine.out_of_order_strategy
        other = "lanes:8" if default.kind == "native" else f"lanes:{default.lanes}:spread"
        forced_engine = None
        if not args.no_forced:
            with environment(STRATEGY_ENV, other):
                forced_engine = await common.open_engine(runtime, args)
        sizes_text = args.sizes or DEFAULT_SIZES.get(engine.kind, DEFAULT_SIZES["gpu"])
        sizes = [int(s) for s in sizes_text.split(",") if s.strip()]
        if args.quick and not args.sizes:
            sizes = sizes[:1] + sizes[2:3]
        in_order = await engine.stream()
        out_of_order = await engine.stream(triodnn.StreamFlags.out_of_order)
        forced = await forced_engine.stream(triodnn.StreamFlags.out_of_order) if forced_engine else None
        raw_queues = {}
        if not args.no_raw:
            ctx, dev = engine.cl_context, engine.cl_device
            raw_queues["raw in-order"] = [cl.CommandQueue(ctx, dev)]
            try:
                raw_queues["raw OOO queue"] = [
                    cl.CommandQueue(ctx, dev, cl.command_queue_properties.OUT_OF_ORDER_EXEC_MODE_ENABLE)
                ]
            except cl.Error as exc:
                print(f"(no raw out-of-order queue on this device: {exc})")
            raw_queues["raw 8 queues"] = [cl.CommandQueue(ctx, dev) for _ in range(KERNELS)]
        # Lanes open as kernels take them: name the engine's strategy, not the queues open now.
        oo_name = f"out-of-order ({_strategy_name(engine)})"
        hw_oo_name = f"{oo_name}, host wait"
        forced_name = (f"forced {_strategy_name(forced_engine)} (2nd engine)" if forced else None)
        common.print_header(
            "bench_ooo: 8 independent kernels, out-of-order vs in-order stream",
            engine,
            args,
            notes=[
                f"batch: {KERNELS} chains x {length} {args.alg} kernel(s), then await stream.wait(); "
                f"{reps} repetitions x {args.inner} batches per variant, interleaved; medians",
                f"forced-strategy reference: {forced_name or 'skipped'} "
                f"({STRATEGY_ENV}={other} at its engine's open)",
            ],
        )

        cases = [
            {"label": f"{args.alg} {n}", "elements": n, "length": length,
             "desc": lambda n=n: triodnn.EltwiseDesc(args.alg, triodnn.MemoryDesc((n,))),
             "reference": lambda x: reference(args.alg, x, length),
             "threshold": tolerance.eltwise(args.alg) * length}
            for n in sizes
        ]
        if args.spin_iters > 0:
            spin = SpinDesc(args.spin_iters)
            cases.append({"label": f"calibration: spin {args.spin_iters}", "elements": 1, "length": 1,
                          "desc": lambda: SpinDesc(args.spin_iters), "reference": spin.reference,
                          "threshold": 1e-4})

        rows, ref_rows = [], []
        for case in cases:
            n, chain_length = case["elements"], case["length"]
            inputs = [rng.uniform(-3.0, 3.0, n).astype(np.float32) for _ in range(KERNELS)]
            work = await Workload.create(engine, case["desc"](), chain_length, inputs)
            variants = [
                TriodnnVariant("in-order", in_order, work),
                TriodnnVariant(oo_name, out_of_order, work),
            ]
            if forced:
                forced_work = await Workload.create(forced_engine, case["desc"](), chain_length, inputs)
                variants.append(TriodnnVariant(forced_name, forced, forced_work))
            variants += [
                TriodnnVariant(HW_IN, in_order, work, host_wait=True),
                TriodnnVariant(hw_oo_name, out_of_order, work, host_wait=True),
            ]
            variants += [RawVariant(name, queues, work) for name, queues in raw_queues.items()]
            spec = work.primitive.spec
            groups = spec.global_size[0] // spec.local_size[0]

            for v in variants:  # warm-up
                for _ in range(2):
                    await v.batch()
            times = {v.name: [] for v in variants}
            for rep in range(reps):
                for v in common.rotated(variants, rep):
                    gc.collect()
                    for _ in range(args.inner):
                        times[v.name].append(await v.batch())

            # Correctness: zero every output, run one batch per variant, compare with numpy.
            errors = {}
            expected = [case["reference"](x) for x in inputs]
            for v in variants:
                await v.work.zero_outputs()
                await v.batch()
                got = await v.work.outputs()
                errors[v.name] = max(tolerance.max_error(g, e) for g, e in zip(got, expected))
            correct = all(err <= case["threshold"] for err in errors.values())

            med = {name: common.median(t) * 1e3 for name, t in times.items()}
            entry = {
                "label": case["label"], "elements": n, "chain": chain_length,
                "work_groups_per_kernel": groups, "global_size": spec.global_size,
                "local_size": spec.local_size, "impl": work.primitive.impl,
                "median_ms_per_batch": med,
                "min_ms_per_batch": {name: min(t) * 1e3 for name, t in times.items()},
                "samples_ms": {name: [x * 1e3 for x in t] for name, t in times.items()},
                "ratio_in_order_over_out_of_order": med["in-order"] / med[oo_name],
                "max_error": errors, "threshold": case["threshold"], "correct": correct,
            }
            if forced:
                entry["ratio_in_order_over_forced"] = med["in-order"] / med[forced_name]
            entry["ratio_host_wait"] = med[HW_IN] / med[hw_oo_name]
            raw_ratio = {}
            for name in raw_queues:
                if name != "raw in-order" and "raw in-order" in med:
                    raw_ratio[name] = med["raw in-order"] / med[name]
            entry["raw_ratios_over_raw_in_order"] = raw_ratio
            results["cases"][case["label"]] = entry
            row = [case["label"], groups, med["in-order"], med[oo_name], entry["ratio_in_order_over_out_of_order"]]
            if forced:
                row += [med[forced_name], entry["ratio_in_order_over_forced"]]
            row.append("ok" if correct else "MISMATCH")
            rows.append(row)
            ref_rows.append([case["label"], med[HW_IN], med[hw_oo_name], entry["ratio_host_wait"],
                             med.get("raw in-order", float("nan")),
                             raw_ratio.get("raw OOO queue", float("nan")),
                             raw_ratio.get("raw 8 queues", float("nan"))])
            for chain in work.chains + (forced_work.chains if forced else []):
                for memory in chain:
                    memory.release()

    headers = ["kernel, elements", "WGs/kernel", "in-order ms", f"{oo_name} ms", "ratio"]
    if forced:
        headers += [f"{forced_name} ms", "ratio"]
    headers += ["check"]
    common.print_table(headers, rows, title="triodnn, await stream.wait(): median wall time per batch (ms); "
                                            "ratio = in-order / out-of-order")
    common.print_table(
        ["kernel, elements", "in-order ms", f"{out_of_order.strategy} ms", "ratio",
         "raw in-order ms", "raw in/OOO-queue", "raw in/8-queues"],
        ref_rows,
        title="references: triodnn streams waited with a blocking clWaitForEvents (no completion "
              "path); the same kernel through raw pyopencl queues",
    )
    print(f"goal: >= 1.7x on PoCL, >= 5x on NVIDIA; engine strategy {default.kind}:{default.lanes}")
    calibration = next((e for e in results["cases"].values() if e["label"].startswith("calibration")), None)
    if calibration and engine.info.max_compute_units > 1:
        best = max(calibration["raw_ratios_over_raw_in_order"].values(), default=float("nan"))
        results["device_concurrency_seen"] = best
        if best < 1.3:
            print(f"WARNING: even the calibration kernels overlapped only {best:.2f}x through raw queues: "
                  "the device gave no concurrency during this run (other processes on the cores?); "
                  "the ratios above do not show what out-of-order streams can do here.")
    results["all_correct"] = all(e["correct"] for e in results["cases"].values())
    return results, engine


def main() -> None:
    args = common.parse_args(__doc__.splitlines()[0], extra_args)
    results, engine = trio.run(run, args)
    common.write_json(args.json, "bench_ooo", engine, args, results)
    if not results["all_correct"]:
        raise SystemExit("a variant's output does not match numpy")


if __name__ == "__main__":
    main()

"""bench_gpu: primitives on a GPU engine against torch on the same GPU and the OpenCL copy bandwidth.

f32 matmul M=N=K 1024..4096 against torch with TF32 off (cuBLAS fp32); softmax 4096x4096, GELU
(erf) on 16M elements and layer norm 8x384x1024 in GB/s (bytes read + written once) against
torch and against a buffer-to-buffer OpenCL copy of the same bytes (the bandwidth ceiling a
memory-bound kernel can reach).

triodnn, torch and the copy are timed the same way, and every table says which (``--timing``):

- ``wall`` (default): wall time over N queued runs. triodnn submits N executions and awaits
  ``stream.wait()`` once; torch makes N calls and ``torch.cuda.synchronize()`` once; the copy
  enqueues N copies and finishes its queue once. Per run = total / N. Host submission counts
  wherever it is slower than the device, for every side alike.
- ``device``: device time over N queued runs, the same batches. triodnn and the copy: OpenCL
  profiling, first command's start to last command's end, / N. torch: ``elapsed_time`` between
  a CUDA event recorded before the N calls and one recorded after them, / N; one untimed call is
  queued before the start event, so that the start event completes when the device is already
  busy, as triodnn's span starts at its first kernel's start (without it torch's span would also
  hold the host's launch of its first kernel).

The variants take turns within each repetition (rotating order, ``_common.interleaved``), medians
of the repetitions. Every output is checked: triodnn's against the kernels' numpy reference
before timing and again after (the output is filled with NaN in between, so the check proves the
timed runs wrote it), torch's against the same references before and after, the copy's
destination against its source. "speed ÷ torch" is torch's time over triodnn's (above 1:
triodnn is faster). Without torch or CUDA only the triodnn and copy columns are
filled (a CPU machine: ``--engine cpu:0``).

    python benchmarks/bench_gpu.py --engine gpu:0 [--timing device] [--quick]
"""

from __future__ import annotations

import time

import _common as common
import numpy as np
import pyopencl as cl
import trio

import triodnn
from triodnn import MemoryDesc, StreamFlags
from triodnn.kernels import eltwise, matmul, normalization, softmax, tolerance

try:  # optional peer
    import torch
except ImportError:  # pragma: no cover - depends on the machine
    torch = None


def extra_args(parser) -> None:
    parser.add_argument("--timing", choices=(common.WALL, common.DEVICE), default=common.WALL,
                        help="wall: wall time over N queued runs (default); device: device time over "
                             "N queued runs (OpenCL profiling / CUDA events)")
    parser.add_argument("--runs", type=int, default=None, help="queued runs per sample, N (default 20, quick 5)")
    parser.add_argument("--reps", type=int, default=None,
                        help="samples per variant, interleaved (default 10, quick 3)")


class Triodnn:
    """One primitive with its arguments; a sample is N queued executions on the stream."""

    def __init__(self, stream, primitive, args: dict, runs: int, mode: str) -> None:
        self.stream, self.primitive, self.args, self.runs, self.mode = stream, primitive, args, runs, mode

    async def sample(self) -> float:
        await self.stream.wait()  # nothing of ours in flight when the clock starts
        t0 = time.perf_counter()
        events = [self.stream.execute(self.primitive, self.args) for _ in range(self.runs)]
        await self.stream.wait()
        wall = time.perf_counter() - t0
        if self.mode == common.WALL:
            return wall / self.runs
        return (events[-1].profiling.end - events[0].profiling.start) * 1e-9 / self.runs


class Torch:
    """A torch call on CUDA; a sample is N queued calls. ``last`` is the last call's result."""

    def __init__(self, fn, runs: int, mode: str) -> None:
        self.fn, self.runs, self.mode, self.last = fn, runs, mode, None

    def sample(self) -> float:
        torch.cuda.synchronize()
        if self.mode == common.WALL:
            t0 = time.perf_counter()
            for _ in range(self.runs):
                self.last = self.fn()
            torch.cuda.synchronize()
            return (time.perf_counter() - t0) / self.runs
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        self.fn()  # lead-in: the start event then completes with this call, the device busy
        start.record()
        for _ in range(self.runs):
            self.last = self.fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) * 1e-3 / self.runs


class Copy:
    """A buffer-to-buffer OpenCL copy of ``nbytes / 2`` (an op moving ``nbytes`` in total reads
    half and writes half), on its own profiling queue of the engine's context."""

    def __init__(self, engine, nbytes: int, runs: int, mode: str, rng) -> None:
        ctx = engine.cl_context
        self.queue = cl.CommandQueue(ctx, properties=cl.command_queue_properties.PROFILING_ENABLE)
        self.source = rng.integers(0, 256, nbytes // 2, dtype=np.uint8)
        self.src = cl.Buffer(ctx, cl.mem_flags.READ_WRITE, self.source.nbytes)
        self.dst = cl.Buffer(ctx, cl.mem_flags.READ_WRITE, self.source.nbytes)
        cl.enqueue_copy(self.queue, self.src, self.source)
        cl.enqueue_copy(self.queue, self.dst, self.src)  # warm
        self.queue.finish()
        self.runs, self.mode = runs, mode

    def clear(self) -> None:
        cl.enqueue_fill_buffer(self.queue, self.dst, np.uint8(0), 0, self.source.nbytes)
        self.queue.finish()

    def check(self) -> None:
        got = np.empty_like(self.source)
        cl.enqueue_copy(self.queue, got, self.dst)
        self.queue.finish()
        np.testing.assert_array_equal(got, self.source, err_msg="OpenCL copy destination differs from its source")

    def sample(self) -> float:
        # Blocking in the trio thread is fine here: nothing else runs, as torch's synchronize.
        self.queue.finish()
        t0 = time.perf_counter()
        events = [cl.enqueue_copy(self.queue, self.dst, self.src) for _ in range(self.runs)]
        self.queue.finish()
        wall = time.perf_counter() - t0
        if self.mode == common.WALL:
            return wall / self.runs
        return (events[-1].profile.end - events[0].profile.start) * 1e-9 / self.runs


def torch_problem(check, value) -> str | None:
    """None when torch's ``value`` passes ``check``, else what is off. A torch result off the
    reference leaves its figure out of the table (reported, never printed as a time)."""
    try:
        check(value.detach().cpu().numpy())
    except AssertionError as exc:
        return str(exc)
    return None


async def measure_case(label: str, stream, primitive, args: dict, dst, check, torch_fn, copy,
                       runs: int, reps: int, mode: str) -> tuple[dict[str, float], dict]:
    """Median seconds per run of triodnn, torch (when given) and the copy (when given),
    interleaved, every output checked before and after timing; NaN for a variant absent or off."""
    await stream.execute(primitive, args)  # warm (first launch compiles on some drivers), first check
    check(await dst.to_numpy())
    await common.poison(dst)
    variants = {"triodnn": Triodnn(stream, primitive, args, runs, mode)}
    if copy is not None:
        copy.clear()
        variants["copy"] = copy
    if torch_fn is not None:
        problem = torch_problem(check, torch_fn())
        if problem is None:
            variants["torch"] = Torch(torch_fn, runs, mode)
        else:
            print(f"   {label}, torch: left out, its result is off the reference: {problem}")
    samples = await common.interleaved({k: v.sample for k, v in variants.items()}, reps)
    check(await dst.to_numpy())  # NaN unless the timed runs wrote it
    if copy is not None:
        copy.check()
    t = {k: common.median(v) for k, v in samples.items()}
    if "torch" in variants:
        problem = torch_problem(check, variants["torch"].last)
        if problem is not None:
            print(f"   {label}, torch: left out, its timed result is off the reference: {problem}")
            t["torch"] = float("nan")
    nan = float("nan")
    return {k: t.get(k, nan) for k in ("triodnn", "torch", "copy")}, samples


def checker(label: str, want: np.ndarray, threshold: float | None):
    """A check of one output against ``want``: exact when ``threshold`` is None, else the kernels'
    benchdnn-style threshold (``tolerance.check``)."""
    def check(got: np.ndarray) -> None:
        try:
            if threshold is None:
                np.testing.assert_array_equal(got, want)
            else:
                tolerance.check(got, want, threshold)
        except AssertionError as exc:
            raise AssertionError(f"{label}: {exc}") from None
    return check


async def run(args):
    mode = args.timing
    runs = args.runs or (5 if args.quick else 20)
    reps = args.reps or (3 if args.quick else 10)
    rng = np.random.default_rng(0)
    have_torch = torch is not None and torch.cuda.is_available()
    if have_torch:
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    note = common.timing_note(mode, runs, reps)
    results: dict = {"timing": mode, "runs": runs, "reps": reps, "matmul": {}, "bandwidth": {}}
    async with triodnn.open_runtime() as rt:
        engine = await common.open_engine(rt, args)
        # Profiling only where it is read: a wall-time stream runs as a user's would.
        stream = await engine.stream(StreamFlags.profiling if mode == common.DEVICE else StreamFlags.in_order)
        torch_note = "torch on CUDA (TF32 off)" if have_torch else "torch absent or without CUDA: triodnn and copy only"
        common.print_header("bench_gpu: triodnn vs torch on the same GPU, and the OpenCL copy", engine, args,
                            [note, torch_note])
        gpu = args.engine_kind == "gpu"
        unit, scale = ("TFLOP/s", 1e12) if gpu else ("GFLOP/s", 1e9)

        rows = []
        for n in ((512, 1024) if args.quick else (1024, 2048, 4096)):
            # Small integers: every sum is exact in f32, so both sides must equal numpy exactly.
            a = rng.integers(-4, 5, (n, n)).astype(np.float32)
            b = rng.integers(-4, 5, (n, n)).astype(np.float32)
            desc = triodnn.MatmulDesc(MemoryDesc((n, n)), MemoryDesc((n, n)))
            prim = await engine.create_primitive(desc)
            ma, mb, mc = await engine.from_numpy(a), await engine.from_numpy(b), engine.memory(desc.dst)
            torch_fn = None
            if have_torch:
                ta, tb = torch.from_numpy(a).cuda(), torch.from_numpy(b).cuda()
                torch_fn = lambda ta=ta, tb=tb: ta @ tb  # noqa: E731
            t, samples = await measure_case(f"matmul {n}", stream, prim, {"src": ma, "weights": mb, "dst": mc}, mc,
                                            checker(f"matmul {n}", matmul.reference(a, b), None), torch_fn, None,
                                            runs, reps, mode)
            flops = 2.0 * n ** 3
            rows.append([n, flops / t["triodnn"] / scale, flops / t["torch"] / scale, t["torch"] / t["triodnn"],
                         prim.impl])
            results["matmul"][n] = {"triodnn_s": t["triodnn"], "torch_s": t["torch"], "samples_s": samples}
        common.print_table(["matmul M=N=K", f"triodnn {unit}", f"torch {unit}", "speed ÷ torch", "impl"], rows,
                           f"matmul f32, {mode} time over {runs} queued runs per sample")

        rows = []
        cases = []
        x = rng.uniform(-4, 4, (4096, 4096)).astype(np.float32)
        cases.append(("softmax 4096x4096", triodnn.SoftmaxDesc("softmax", MemoryDesc(x.shape)), x,
                      softmax.reference("softmax", x, axis=-1), tolerance.softmax("softmax"),
                      lambda t: torch.softmax(t, -1)))
        g = rng.uniform(-4, 4, 1 << 24).astype(np.float32)
        cases.append(("gelu_erf 16M", triodnn.EltwiseDesc("gelu_erf", MemoryDesc(g.shape)), g,
                      eltwise.reference("gelu_erf", g), tolerance.eltwise("gelu_erf"),
                      lambda t: torch.nn.functional.gelu(t)))
        ln = rng.uniform(-4, 4, (8 * 384, 1024)).astype(np.float32)
        cases.append(("layer norm 8x384x1024", triodnn.LayerNormDesc(MemoryDesc(ln.shape)), ln,
                      normalization.layer_reference(ln)[0], tolerance.normalization("layer_normalization"),
                      lambda t: torch.nn.functional.layer_norm(t, (1024,))))
        for name, desc, data, want, tol, torch_op in cases:
            prim = await engine.create_primitive(desc)
            src, dst = await engine.from_numpy(data), engine.memory(desc.dst)
            nbytes = data.nbytes * 2
            torch_fn = None
            if have_torch:
                tx = torch.from_numpy(data).cuda()
                torch_fn = lambda f=torch_op, tx=tx: f(tx)  # noqa: E731
            t, samples = await measure_case(name, stream, prim, {"src": src, "dst": dst}, dst,
                                            checker(name, want, tol), torch_fn, Copy(engine, nbytes, runs, mode, rng),
                                            runs, reps, mode)
            gbs = lambda s: nbytes / s / 1e9  # noqa: E731
            rows.append([name, gbs(t["triodnn"]), gbs(t["torch"]), gbs(t["copy"]), t["torch"] / t["triodnn"],
                         t["copy"] / t["triodnn"], prim.impl])
            results["bandwidth"][name] = {"triodnn_s": t["triodnn"], "torch_s": t["torch"], "copy_s": t["copy"],
                                          "bytes": nbytes, "samples_s": samples}
        common.print_table(["op", "triodnn GB/s", "torch GB/s", "OpenCL copy GB/s", "speed ÷ torch",
                            "speed ÷ copy", "impl"], rows,
                           f"memory-bound ops (bytes read + written once), {mode} time over {runs} queued runs per sample")
        return results, engine


def main() -> None:
    args = common.parse_args(__doc__.splitlines()[0], extra_args)
    results, engine = trio.run(run, args)
    common.write_json(args.json, "bench_gpu", engine, args, results)


if __name__ == "__main__":
    main()

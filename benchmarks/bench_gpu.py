"""bench_gpu: primitives on a GPU engine against torch on the same GPU and the OpenCL copy bandwidth.

f32 matmul M=N=K 1024..4096 in TFLOP/s against torch with TF32 off (cuBLAS fp32); softmax
4096x4096, GELU on 16M elements and layer norm 8x384x1024 in GB/s (bytes read + written once)
against torch and against a device-to-device OpenCL buffer copy of the same bytes (the bandwidth
ceiling a memory-bound kernel can reach). triodnn and copy times are device times from event
profiling (median over executions); torch times are CUDA-event times. Every triodnn output is
checked against the kernels' numpy reference first.

    python benchmarks/bench_gpu.py --engine gpu:0
"""

from __future__ import annotations

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
    parser.add_argument("--reps", type=int, default=None, help="timed executions per variant (default 20)")


async def device_seconds(stream, primitive, args: dict, reps: int) -> float:
    await stream.execute(primitive, args)  # warm (first launch compiles on some drivers)
    events = [stream.execute(primitive, args) for _ in range(reps)]
    await stream.wait()
    return common.median([e.profiling.duration_ns * 1e-9 for e in events])


def copy_seconds(engine, nbytes: int, reps: int) -> float:
    """Device time of a buffer-to-buffer copy of ``nbytes`` (reads and writes nbytes/2 each way
    when compared with an op moving ``nbytes`` in total)."""
    ctx = engine.cl_context
    queue = cl.CommandQueue(ctx, properties=cl.command_queue_properties.PROFILING_ENABLE)
    half = nbytes // 2
    a, b = cl.Buffer(ctx, cl.mem_flags.READ_WRITE, half), cl.Buffer(ctx, cl.mem_flags.READ_WRITE, half)
    cl.enqueue_copy(queue, b, a).wait()
    samples = []
    for _ in range(reps):
        ev = cl.enqueue_copy(queue, b, a)
        ev.wait()
        samples.append((ev.profile.end - ev.profile.start) * 1e-9)
    return common.median(samples)


def torch_seconds(fn, reps: int) -> float:
    fn()
    torch.cuda.synchronize()
    samples = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        samples.append(start.elapsed_time(end) * 1e-3)
    return common.median(samples)


async def run(args):
    reps = args.reps or (5 if args.quick else 20)
    rng = np.random.default_rng(0)
    have_torch = torch is not None and torch.cuda.is_available()
    if have_torch:
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    results: dict = {"matmul": {}, "bandwidth": {}}
    async with triodnn.open_runtime() as rt:
        engine = await common.open_engine(rt, args)
        stream = await engine.stream(StreamFlags.profiling)
        common.print_header("bench_gpu: triodnn vs torch (TF32 off) and the OpenCL copy", engine, args,
                            [f"{reps} timed executions per variant; torch {'on CUDA' if have_torch else 'absent'}"])

        rows = []
        for n in ((512, 1024) if args.quick else (1024, 2048, 4096)):
            a = rng.integers(-4, 5, (n, n)).astype(np.float32)
            b = rng.integers(-4, 5, (n, n)).astype(np.float32)
            desc = triodnn.MatmulDesc(MemoryDesc((n, n)), MemoryDesc((n, n)))
            prim = await engine.create_primitive(desc)
            ma, mb, mc = await engine.from_numpy(a), await engine.from_numpy(b), engine.memory(desc.dst)
            args_ = {"src": ma, "weights": mb, "dst": mc}
            await stream.execute(prim, args_)
            np.testing.assert_array_equal(await mc.to_numpy(), matmul.reference(a, b))
            t_ours = await device_seconds(stream, prim, args_, reps)
            flops = 2.0 * n ** 3
            t_torch = float("nan")
            if have_torch:
                ta, tb = torch.from_numpy(a).cuda(), torch.from_numpy(b).cuda()
                t_torch = torch_seconds(lambda: ta @ tb, reps)
            rows.append([n, flops / t_ours / 1e12, flops / t_torch / 1e12, t_torch / t_ours, prim.impl])
            results["matmul"][n] = {"triodnn_tflops": flops / t_ours / 1e12, "torch_tflops": flops / t_torch / 1e12}
        common.print_table(["matmul M=N=K", "triodnn TFLOP/s", "torch fp32", "triodnn / torch", "impl"], rows)

        rows = []
        cases = []
        x = rng.uniform(-4, 4, (4096, 4096)).astype(np.float32)
        cases.append(("softmax 4096x4096", triodnn.SoftmaxDesc("softmax", MemoryDesc(x.shape)), x,
                      lambda: softmax.reference("softmax", x, axis=-1), tolerance.softmax("softmax"),
                      (lambda t: torch.softmax(t, -1))))
        g = rng.uniform(-4, 4, 1 << 24).astype(np.float32)
        cases.append(("gelu_erf 16M", triodnn.EltwiseDesc("gelu_erf", MemoryDesc(g.shape)), g,
                      lambda: eltwise.reference("gelu_erf", g), tolerance.eltwise("gelu_erf"),
                      (lambda t: torch.nn.functional.gelu(t))))
        ln = rng.uniform(-4, 4, (8 * 384, 1024)).astype(np.float32)
        cases.append(("layer norm 8x384x1024", triodnn.LayerNormDesc(MemoryDesc(ln.shape)), ln,
                      lambda: normalization.layer_reference(ln)[0],
                      tolerance.normalization("layer_normalization"),
                      (lambda t: torch.nn.functional.layer_norm(t, (1024,)))))
        for name, desc, data, ref, tol, torch_fn in cases:
            prim = await engine.create_primitive(desc)
            src, dst = await engine.from_numpy(data), engine.memory(desc.dst)
            await stream.execute(prim, {"src": src, "dst": dst})
            tolerance.check(await dst.to_numpy(), ref(), tol)
            nbytes = data.nbytes * 2
            t_ours = await device_seconds(stream, prim, {"src": src, "dst": dst}, reps)
            t_copy = copy_seconds(engine, nbytes, reps)
            t_torch = float("nan")
            if have_torch:
                tx = torch.from_numpy(data).cuda()
                t_torch = torch_seconds(lambda: torch_fn(tx), reps)
            gbs = lambda t: nbytes / t / 1e9  # noqa: E731
            rows.append([name, gbs(t_ours), gbs(t_torch), gbs(t_copy), t_torch / t_ours, t_copy / t_ours, prim.impl])
            results["bandwidth"][name] = {"triodnn_gbs": gbs(t_ours), "torch_gbs": gbs(t_torch), "copy_gbs": gbs(t_copy)}
        common.print_table(["op", "triodnn GB/s", "torch", "OpenCL copy", "x torch", "x copy", "impl"], rows)
        return results, engine


def main() -> None:
    args = common.parse_args(__doc__.splitlines()[0], extra_args)
    results, engine = trio.run(run, args)
    common.write_json(args.json, "bench_gpu", engine, args, results)


if __name__ == "__main__":
    main()

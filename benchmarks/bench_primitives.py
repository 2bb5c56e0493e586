"""bench_primitives: primitive throughput against numpy (and torch when installed), side by side.

f32 matmul at M=N=K 256..2048 in GFLOP/s; softmax 4096x4096, GELU on 16M elements and layer
norm 8x384x1024 in GB/s (bytes read + written once); a ResNet-50-like 3x3 convolution in
GFLOP/s. Each triodnn figure is the median over repetitions of a batch of back-to-back
executions ended by ``await stream.wait()``; numpy (2 OpenBLAS threads here) runs interleaved
with it. Every triodnn output is checked against the kernels' numpy reference first.
"""

from __future__ import annotations

import time

import _common as common
import numpy as np
import trio

import triodnn
from triodnn import MemoryDesc
from triodnn.kernels import convolution, eltwise, matmul, normalization, softmax, tolerance

try:  # optional peer
    import torch
except ImportError:  # pragma: no cover - depends on the machine
    torch = None


def extra_args(parser) -> None:
    parser.add_argument("--reps", type=int, default=None, help="repetitions per variant (default 5, quick 2)")


async def time_triodnn(engine, stream, primitive, args: dict, reps: int, batch: int) -> float:
    await stream.execute(primitive, args)  # warm
    samples = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(batch):
            stream.execute(primitive, args)
        await stream.wait()
        samples.append((time.perf_counter() - t0) / batch)
    return common.median(samples)


def time_host(fn, reps: int, batch: int) -> float:
    fn()
    samples = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(batch):
            fn()
        samples.append((time.perf_counter() - t0) / batch)
    return common.median(samples)


async def run(args):
    reps = args.reps or (2 if args.quick else 5)
    rng = np.random.default_rng(0)
    results: dict = {"matmul": {}, "bandwidth": {}, "convolution": {}}
    async with triodnn.open_runtime() as rt:
        engine = await common.open_engine(rt, args)
        stream = await engine.stream()
        common.print_header("bench_primitives: triodnn primitives vs numpy / torch", engine, args,
                            [f"{reps} repetitions per variant; torch {'present' if torch else 'not installed'}"])
        rows = []
        for n in (256, 512) if args.quick else (256, 512, 1024, 2048):
            a = rng.standard_normal((n, n)).astype(np.float32)
            b = rng.standard_normal((n, n)).astype(np.float32)
            desc = triodnn.MatmulDesc(MemoryDesc((n, n)), MemoryDesc((n, n)))
            prim = await engine.create_primitive(desc)
            mem = {"src": await engine.from_numpy(a), "weights": await engine.from_numpy(b),
                   "dst": engine.memory(desc.dst)}
            await stream.execute(prim, mem)
            tolerance.check(await mem["dst"].to_numpy(), matmul.reference(a, b), 1e-6 * n)
            # At least 3 executions per sample, so that the wake-up after stream.wait() (0.2 ms, far
            # more on a busy machine) is not paid once per 1024^3 or 2048^3 execution.
            batch = max(3, int(2e8 // (2 * n**3)))
            flops = 2 * n**3
            t_ours = await time_triodnn(engine, stream, prim, mem, reps, batch)
            t_np = time_host(lambda: a @ b, reps, batch)
            t_torch = float("nan")
            if torch:
                ta, tb = torch.from_numpy(a), torch.from_numpy(b)
                t_torch = time_host(lambda: ta @ tb, reps, batch)
            g = lambda t: flops / t / 1e9  # noqa: E731
            rows.append([n, g(t_ours), g(t_np), g(t_torch), t_np / t_ours, prim.impl])
            results["matmul"][n] = {"triodnn_gflops": g(t_ours), "numpy_gflops": g(t_np), "torch_gflops": g(t_torch)}
        common.print_table(["matmul M=N=K", "triodnn GFLOP/s", "numpy", "torch", "triodnn / numpy", "impl"], rows)

        rows = []
        soft_n = 1024 if args.quick else 4096
        x = rng.uniform(-4, 4, (soft_n, soft_n)).astype(np.float32)
        desc = triodnn.SoftmaxDesc("softmax", MemoryDesc(x.shape))
        prim = await engine.create_primitive(desc)
        src, dst = await engine.from_numpy(x), engine.memory(desc.dst)
        await stream.execute(prim, {"src": src, "dst": dst})
        tolerance.check(await dst.to_numpy(), softmax.reference("softmax", x, axis=-1), tolerance.softmax("softmax"))

        def np_softmax():
            e = np.exp(x - x.max(axis=-1, keepdims=True))
            return e / e.sum(axis=-1, keepdims=True)

        cases = [("softmax", x.nbytes * 2, prim, {"src": src, "dst": dst}, np_softmax,
                  (lambda: torch.softmax(tx, -1)) if torch else None)]
        if torch:
            tx = torch.from_numpy(x)

        gelu_n = 1 << (20 if args.quick else 24)
        g_x = rng.uniform(-4, 4, gelu_n).astype(np.float32)
        for alg in ("gelu_tanh", "gelu_erf"):
            gdesc = triodnn.EltwiseDesc(alg, MemoryDesc((gelu_n,)))
            gprim = await engine.create_primitive(gdesc)
            gsrc, gdst = await engine.from_numpy(g_x), engine.memory(gdesc.dst)
            await stream.execute(gprim, {"src": gsrc, "dst": gdst})
            tolerance.check(await gdst.to_numpy(), eltwise.reference(alg, g_x), tolerance.eltwise(alg))

            def np_gelu_tanh():
                return 0.5 * g_x * (1 + np.tanh(0.7978845608 * (g_x + 0.044715 * g_x**3)))

            tg = torch.from_numpy(g_x) if torch else None
            peer = None
            if torch:
                approx = "tanh" if alg == "gelu_tanh" else "none"
                peer = lambda tg=tg, approx=approx: torch.nn.functional.gelu(tg, approximate=approx)  # noqa: E731
            cases.append((alg, g_x.nbytes * 2, gprim, {"src": gsrc, "dst": gdst},
                          np_gelu_tanh if alg == "gelu_tanh" else None, peer))

        ln_shape = (2, 384, 1024) if args.quick else (8, 384, 1024)
        l_x = rng.uniform(-2, 2, ln_shape).astype(np.float32)
        ldesc = triodnn.LayerNormDesc(MemoryDesc(ln_shape))
        lprim = await engine.create_primitive(ldesc)
        lsrc, ldst = await engine.from_numpy(l_x), engine.memory(ldesc.dst)
        await stream.execute(lprim, {"src": lsrc, "dst": ldst})
        got = await ldst.to_numpy()
        tolerance.check(got, normalization.layer_reference(l_x)[0], tolerance.normalization("layer_normalization"))

        def np_layer_norm():
            mean = l_x.mean(-1, keepdims=True)
            return (l_x - mean) / np.sqrt(l_x.var(-1, keepdims=True) + 1e-5)

        tl = torch.from_numpy(l_x) if torch else None
        cases.append(("layer_norm", l_x.nbytes * 2, lprim, {"src": lsrc, "dst": ldst}, np_layer_norm,
                      (lambda: torch.nn.functional.layer_norm(tl, (ln_shape[-1],))) if torch else None))

        for name, nbytes, p, pargs, np_fn, torch_fn in cases:
            t_ours = await time_triodnn(engine, stream, p, pargs, reps, 3)
            t_np = time_host(np_fn, reps, 1) if np_fn else float("nan")
            t_torch = time_host(torch_fn, reps, 1) if torch_fn else float("nan")
            gb = lambda t: nbytes / t / 1e9  # noqa: E731
            rows.append([name, gb(t_ours), gb(t_np), gb(t_torch), t_np / t_ours, t_torch / t_ours, p.impl])
            results["bandwidth"][name] = {"triodnn_gbs": gb(t_ours), "numpy_gbs": gb(t_np), "torch_gbs": gb(t_torch)}
        common.print_table(["op", "triodnn GB/s", "numpy", "torch", "x numpy", "x torch", "impl"], rows,
                           f"bandwidth (softmax {soft_n}x{soft_n}, gelu {gelu_n}, layer norm {ln_shape})")

        # ResNet-50's conv2_x 3x3 layer: 64 -> 64 channels on 56x56, NCHW, one image.
        c_x = rng.integers(-2, 3, (1, 64, 56, 56)).astype(np.float32)
        c_w = rng.integers(-2, 3, (64, 64, 3, 3)).astype(np.float32)
        cdesc = triodnn.ConvolutionDesc(MemoryDesc(c_x.shape), MemoryDesc(c_w.shape), padding_l=1)
        cprim = await engine.create_primitive(cdesc)
        cargs = {"src": await engine.from_numpy(c_x), "weights": await engine.from_numpy(c_w),
                 "dst": engine.memory(cdesc.dst)}
        await stream.execute(cprim, cargs)
        ref = convolution.reference(c_x, c_w, strides=(1, 1), padding_l=(1, 1), padding_r=(1, 1))
        assert np.array_equal(await cargs["dst"].to_numpy(), ref), "convolution output mismatch"
        flops = 2 * 64 * 64 * 9 * 56 * 56
        t_ours = await time_triodnn(engine, stream, cprim, cargs, reps, 3)
        row = ["resnet50 conv2_x 3x3 1x64x56x56", flops / t_ours / 1e9]
        if torch:
            tcx, tcw = torch.from_numpy(c_x), torch.from_numpy(c_w)
            t_torch = time_host(lambda: torch.nn.functional.conv2d(tcx, tcw, padding=1), reps, 3)
            row += [flops / t_torch / 1e9, t_torch / t_ours]
        else:
            row += [float("nan"), float("nan")]
        row.append(cprim.impl)
        results["convolution"]["resnet50_conv2_3x3"] = {"triodnn_gflops": row[1], "torch_gflops": row[2]}
        common.print_table(["convolution", "triodnn GFLOP/s", "torch", "x torch", "impl"], [row])
    return results, engine


def main() -> None:
    args = common.parse_args(__doc__.splitlines()[0], extra_args)
    results, engine = trio.run(run, args)
    common.write_json(args.json, "bench_primitives", engine, args, results)


if __name__ == "__main__":
    main()

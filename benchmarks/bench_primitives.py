"""bench_primitives: primitive throughput against numpy (and torch when installed), side by side.

f32 matmul at M=N=K 256..2048 in GFLOP/s; softmax 4096x4096, GELU on 16M elements and layer
norm 8x384x1024 in GB/s (bytes read + written once); a ResNet-50-like 3x3 convolution in
GFLOP/s.

Timing: wall time over N queued runs, for every variant. triodnn submits N executions and awaits
``stream.wait()`` once; numpy (2 OpenBLAS threads here) and torch CPU make N calls back to back
(they run synchronously). Per run = total / N. Within each repetition the variants of a case
take turns in rotating order (``_common.interleaved``); tables give medians of the repetitions.

Checks: every triodnn output against the kernels' numpy reference before timing and again after
it (the output is filled with NaN in between, so the check proves the timed runs wrote it);
numpy's and torch's results against the same reference, so no side can time a wrong or empty
computation.
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


class Triodnn:
    """A sample: ``runs`` executions queued on the stream, awaited once; seconds per run."""

    def __init__(self, stream, primitive, args: dict, runs: int) -> None:
        self.stream, self.primitive, self.args, self.runs = stream, primitive, args, runs

    async def sample(self) -> float:
        await self.stream.wait()
        t0 = time.perf_counter()
        for _ in range(self.runs):
            self.stream.execute(self.primitive, self.args)
        await self.stream.wait()
        return (time.perf_counter() - t0) / self.runs


class Host:
    """A sample: ``runs`` synchronous calls back to back; seconds per run. ``last`` is the last
    call's result, checked after timing."""

    def __init__(self, fn, runs: int) -> None:
        self.fn, self.runs, self.last = fn, runs, None

    def sample(self) -> float:
        t0 = time.perf_counter()
        for _ in range(self.runs):
            self.last = self.fn()
        return (time.perf_counter() - t0) / self.runs


def as_numpy(value) -> np.ndarray:
    return value.numpy() if torch is not None and isinstance(value, torch.Tensor) else np.asarray(value)


async def case(stream, primitive, args: dict, dst, peers: dict, check, runs: int, reps: int) -> dict[str, float]:
    """Median seconds per run of triodnn and each peer (name -> function or None), interleaved.

    ``check(array, who)`` raises when ``array`` is off the reference. triodnn's output is checked
    before and after timing, each peer's result before and after."""
    await stream.execute(primitive, args)  # warm, and the first check
    check(await dst.to_numpy(), "triodnn")
    await common.poison(dst)
    variants = {"triodnn": Triodnn(stream, primitive, args, runs)}
    for name, fn in peers.items():
        if fn is not None:
            check(as_numpy(fn()), name)
            variants[name] = Host(fn, runs)
    samples = await common.interleaved({k: v.sample for k, v in variants.items()}, reps)
    check(await dst.to_numpy(), "triodnn (timed runs)")
    for name, variant in variants.items():
        if name != "triodnn":
            check(as_numpy(variant.last), f"{name} (timed runs)")
    times = {k: common.median(v) for k, v in samples.items()}
    return {name: times.get(name, float("nan")) for name in ("triodnn", *peers)}


def checker(want: np.ndarray, threshold: float, label: str):
    def check(got: np.ndarray, who: str) -> None:
        try:
            tolerance.check(got, want, threshold)
        except AssertionError as exc:
            raise AssertionError(f"{label}, {who}: {exc}") from None
    return check


async def run(args):
    reps = args.reps or (2 if args.quick else 5)
    rng = np.random.default_rng(0)
    results: dict = {"timing": "wall time over N queued runs", "matmul": {}, "bandwidth": {}, "convolution": {}}
    async with triodnn.open_runtime() as rt:
        engine = await common.open_engine(rt, args)
        stream = await engine.stream()
        common.print_header("bench_primitives: triodnn primitives vs numpy / torch", engine, args, [
            f"timing: wall time over N queued runs (triodnn: submit N, await stream.wait() once; numpy and torch "
            f"CPU: N calls back to back); per run = total / N; median of {reps} interleaved repetitions",
            f"torch {'present (CPU)' if torch else 'not installed'}",
        ])
        rows = []
        for n in (256, 512) if args.quick else (256, 512, 1024, 2048):
            a = rng.standard_normal((n, n)).astype(np.float32)
            b = rng.standard_normal((n, n)).astype(np.float32)
            desc = triodnn.MatmulDesc(MemoryDesc((n, n)), MemoryDesc((n, n)))
            prim = await engine.create_primitive(desc)
            mem = {"src": await engine.from_numpy(a), "weights": await engine.from_numpy(b),
                   "dst": engine.memory(desc.dst)}
            # At least 3 runs per sample, so that the wake-up after stream.wait() (0.2 ms, far more
            # on a busy machine) is not paid once per 1024^3 or 2048^3 execution.
            runs = max(3, int(2e8 // (2 * n**3)))
            peers = {"numpy": lambda a=a, b=b: a @ b, "torch": None}
            if torch:
                ta, tb = torch.from_numpy(a), torch.from_numpy(b)
                peers["torch"] = lambda ta=ta, tb=tb: ta @ tb
            t = await case(stream, prim, mem, mem["dst"], peers,
                           checker(matmul.reference(a, b), 1e-6 * n, f"matmul {n}"), runs, reps)
            flops = 2 * n**3
            g = lambda s: flops / s / 1e9  # noqa: E731
            rows.append([n, runs, g(t["triodnn"]), g(t["numpy"]), g(t["torch"]), t["numpy"] / t["triodnn"], prim.impl])
            results["matmul"][n] = {"runs": runs, **{f"{k}_gflops": g(v) for k, v in t.items()}}
        common.print_table(["matmul M=N=K", "N", "triodnn GFLOP/s", "numpy", "torch", "triodnn / numpy", "impl"],
                           rows, "matmul f32, wall time over N queued runs")

        rows = []
        soft_n = 1024 if args.quick else 4096
        x = rng.uniform(-4, 4, (soft_n, soft_n)).astype(np.float32)
        cases = []

        def np_softmax():
            e = np.exp(x - x.max(axis=-1, keepdims=True))
            return e / e.sum(axis=-1, keepdims=True)

        tx = torch.from_numpy(x) if torch else None
        cases.append(("softmax", triodnn.SoftmaxDesc("softmax", MemoryDesc(x.shape)), x,
                      softmax.reference("softmax", x, axis=-1), tolerance.softmax("softmax"),
                      np_softmax, (lambda: torch.softmax(tx, -1)) if torch else None))

        gelu_n = 1 << (20 if args.quick else 24)
        g_x = rng.uniform(-4, 4, gelu_n).astype(np.float32)
        tg = torch.from_numpy(g_x) if torch else None

        def np_gelu_tanh():
            return 0.5 * g_x * (1 + np.tanh(0.7978845608 * (g_x + 0.044715 * g_x**3)))

        for alg in ("gelu_tanh", "gelu_erf"):
            peer = None
            if torch:
                approx = "tanh" if alg == "gelu_tanh" else "none"
                peer = lambda approx=approx: torch.nn.functional.gelu(tg, approximate=approx)  # noqa: E731
            # numpy has no erf: gelu_erf has no numpy peer (the float64 reference is no rival).
            cases.append((alg, triodnn.EltwiseDesc(alg, MemoryDesc((gelu_n,))), g_x, eltwise.reference(alg, g_x),
                          tolerance.eltwise(alg), np_gelu_tanh if alg == "gelu_tanh" else None, peer))

        ln_shape = (2, 384, 1024) if args.quick else (8, 384, 1024)
        l_x = rng.uniform(-2, 2, ln_shape).astype(np.float32)
        tl = torch.from_numpy(l_x) if torch else None

        def np_layer_norm():
            mean = l_x.mean(-1, keepdims=True)
            return (l_x - mean) / np.sqrt(l_x.var(-1, keepdims=True) + 1e-5)

        cases.append(("layer_norm", triodnn.LayerNormDesc(MemoryDesc(ln_shape)), l_x, normalization.layer_reference(l_x)[0],
                      tolerance.normalization("layer_normalization"), np_layer_norm,
                      (lambda: torch.nn.functional.layer_norm(tl, (ln_shape[-1],))) if torch else None))

        for name, desc, data, want, threshold, np_fn, torch_fn in cases:
            prim = await engine.create_primitive(desc)
            src, dst = await engine.from_numpy(data), engine.memory(desc.dst)
            t = await case(stream, prim, {"src": src, "dst": dst}, dst, {"numpy": np_fn, "torch": torch_fn},
                           checker(want, threshold, name), 3, reps)
            nbytes = data.nbytes * 2
            gb = lambda s: nbytes / s / 1e9  # noqa: E731
            rows.append([name, gb(t["triodnn"]), gb(t["numpy"]), gb(t["torch"]), t["numpy"] / t["triodnn"],
                         t["torch"] / t["triodnn"], prim.impl])
            results["bandwidth"][name] = {f"{k}_gbs": gb(v) for k, v in t.items()}
        common.print_table(["op", "triodnn GB/s", "numpy", "torch", "x numpy", "x torch", "impl"], rows,
                           f"bandwidth (softmax {soft_n}x{soft_n}, gelu {gelu_n}, layer norm {ln_shape}), "
                           f"wall time over 3 queued runs")

        # ResNet-50's conv2_x 3x3 layer: 64 -> 64 channels on 56x56, NCHW, one image. Small
        # integers: every sum is exact in f32, so both sides must equal the reference exactly.
        c_x = rng.integers(-2, 3, (1, 64, 56, 56)).astype(np.float32)
        c_w = rng.integers(-2, 3, (64, 64, 3, 3)).astype(np.float32)
        cdesc = triodnn.ConvolutionDesc(MemoryDesc(c_x.shape), MemoryDesc(c_w.shape), padding_l=1)
        cprim = await engine.create_primitive(cdesc)
        cargs = {"src": await engine.from_numpy(c_x), "weights": await engine.from_numpy(c_w),
                 "dst": engine.memory(cdesc.dst)}
        ref = convolution.reference(c_x, c_w, strides=(1, 1), padding_l=(1, 1), padding_r=(1, 1))

        def exact(got, who):
            np.testing.assert_array_equal(got, ref, err_msg=f"convolution, {who}")

        peers = {"torch": None}
        if torch:
            tcx, tcw = torch.from_numpy(c_x), torch.from_numpy(c_w)
            peers["torch"] = lambda: torch.nn.functional.conv2d(tcx, tcw, padding=1)
        t = await case(stream, cprim, cargs, cargs["dst"], peers, exact, 3, reps)
        flops = 2 * 64 * 64 * 9 * 56 * 56
        row = ["resnet50 conv2_x 3x3 1x64x56x56", flops / t["triodnn"] / 1e9, flops / t["torch"] / 1e9,
               t["torch"] / t["triodnn"], cprim.impl]
        results["convolution"]["resnet50_conv2_3x3"] = {"triodnn_gflops": row[1], "torch_gflops": row[2]}
        common.print_table(["convolution", "triodnn GFLOP/s", "torch", "x torch", "impl"], [row],
                           "convolution f32, wall time over 3 queued runs")
    return results, engine


def main() -> None:
    args = common.parse_args(__doc__.splitlines()[0], extra_args)
    results, engine = trio.run(run, args)
    common.write_json(args.json, "bench_primitives", engine, args, results)


if __name__ == "__main__":
    main()

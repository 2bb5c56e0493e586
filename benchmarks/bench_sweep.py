"""bench_sweep: kernel speed across shape families, triodnn beside the best peer on the same device.

One table per family, one row per shape: matmul (square, skinny, tall-skinny, batched small,
with and without a post-op chain), convolution (ResNet-50 and MobileNet-v2 layers, NCHW and
NHWC), memory-bound ops (eltwise, binary with broadcast, softmax, layer and RMS norm,
reduction, reorders) and SDPA (causal and masked). Every row prints the ratio its goal is
judged on, and every table ends with a one-line summary (worst row, median row).

Peers, each used where importable (a missing one is a left-out column, never an error):

- GPU engine: torch on CUDA (cuBLAS / cuDNN with TF32 off, ``cudnn.benchmark`` on so cuDNN
  picks its fastest algorithm during the untimed calls; fused ``scaled_dot_product_attention``),
  and a buffer-to-buffer OpenCL copy of the row's bytes on the engine's own context;
- CPU engine: numpy (its BLAS), torch CPU, ONNX Runtime's CPU provider (plain matmul and
  convolution rows) and the same OpenCL copy.

Goals (the "goal" column; ratio = the peer's time / triodnn's time, above 1: triodnn faster):
GPU matmul and convolution >= 0.9x torch, memory-bound >= 0.85x the copy (bytes read and
written once), SDPA >= 1.0x torch's fused SDPA; CPU matmul >= 1.0x numpy, convolution >= 1.0x
torch CPU (no CPU goal is set for memory-bound and SDPA rows: their ratio is printed).

Timing (``--timing``, printed in every table header), the same for triodnn and every peer:

- ``wall`` (default): wall time over N queued runs. triodnn submits N executions and awaits
  ``stream.wait()`` once; torch CUDA makes N calls and synchronizes once; the copy enqueues N
  copies and finishes once; host peers (numpy, torch CPU, ONNX Runtime) make N calls. / N.
- ``device``: device time over the same N runs: OpenCL profiling (first start to last end)
  for triodnn and the copy, CUDA events for torch (one untimed lead-in call, as bench_gpu.py).
  Host peers compute synchronously in the calling thread: their wall time is their device time.

N adapts per row (about 20 ms of triodnn work per sample, at most ``--runs``); the variants
take turns in rotating order within each of ``--reps`` repetitions (``_common.interleaved``);
medians are reported. Checks: every triodnn result against its kernel module's float64 numpy
reference and tolerance (``triodnn.kernels.kind_of(desc)``), before timing and again after the
timed runs (dst is filled with NaN in between, so the check proves the timed runs wrote it);
every peer's result against the same reference before and after timing (a peer off it is left
out of the row, with the reason printed); the copy's destination against its source.

``--dtype bf16`` (or ``f16``) runs the matmul rows with both operands and dst of that type
(f32 accumulation; the post-op operand stays f32) and torch on the same types: the tensor-core
rows on an NVIDIA GPU. The other families stay f32.

Rows that exceed ``--max-elements``, the device's memory or ``--row-timeout`` print "skipped
(why)" instead of a time.

    python benchmarks/bench_sweep.py --engine gpu:0 [--timing device] [--family matmul ...] [--dtype bf16]
    python benchmarks/bench_sweep.py --engine cpu:0 [--quick] [--max-elements 16777216] [--json out.json]
"""

from __future__ import annotations

import functools
import math
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import _common as common
import bench_gpu
import numpy as np
import trio

import triodnn
from triodnn import MemoryDesc, StreamFlags
from triodnn._values._dtypes import from_storage, to_storage
from triodnn.kernels import kind_of

try:  # optional peer
    import torch
    import torch.nn.functional as F
except ImportError:  # pragma: no cover - depends on the machine
    torch = F = None

try:  # optional peer
    import onnxruntime as ort
    from onnx import TensorProto, helper
except ImportError:  # pragma: no cover - depends on the machine
    ort = None

FAMILIES = ("matmul", "conv", "memory", "sdpa")
MEMORY_FAMILY = "memory"
# Seconds of triodnn work one sample aims at: N = this / one run's time, within [1, --runs].
SAMPLE_TARGET_S = 0.02
# The kernel-speed goals: (device, family) -> (the peer the goal is judged against, least ratio).
# None: no goal is set there; the ratio against that peer is printed all the same.
GOALS = {
    ("gpu", "matmul"): ("torch", 0.9), ("gpu", "conv"): ("torch", 0.9),
    ("gpu", "memory"): ("copy", 0.85), ("gpu", "sdpa"): ("torch", 1.0),
    ("cpu", "matmul"): ("numpy", 1.0), ("cpu", "conv"): ("torch", 1.0),
    ("cpu", "memory"): ("copy", None), ("cpu", "sdpa"): ("torch", None),
}
HOST_MEMORY = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
LIBRARY_PEERS = {"gpu": ("torch",), "cpu": ("numpy", "torch", "ort")}


def extra_args(parser) -> None:
    parser.add_argument("--timing", choices=(common.WALL, common.DEVICE), default=common.WALL,
                        help="wall: wall time over N queued runs (default); device: device time over "
                             "N queued runs (OpenCL profiling / CUDA events; host peers: wall)")
    parser.add_argument("--dtype", choices=("f32", "bf16", "f16"), default="f32",
                        help="matmul rows' operand and dst type (default f32); other families stay f32")
    parser.add_argument("--family", action="append", choices=FAMILIES,
                        help="family to run (repeatable; default all)")
    parser.add_argument("--row", action="append", metavar="TEXT",
                        help="only rows whose label contains TEXT (repeatable: any of them)")
    parser.add_argument("--max-elements", type=int, default=None,
                        help="skip rows whose largest tensor has more elements than this")
    parser.add_argument("--runs", type=int, default=None, help="most queued runs per sample, N (default 20, quick 5)")
    parser.add_argument("--reps", type=int, default=None, help="samples per variant, interleaved (default 7, quick 3)")
    parser.add_argument("--compare-engine", metavar="KIND:INDEX", default=None,
                        help="a second engine (e.g. cpu:1, another CPU runtime) timed beside --engine in the "
                             "same interleaved rotation, its results checked the same way: column 'alt ms', "
                             "ratio '÷ alt' = alt's time / the engine's")
    parser.add_argument("--row-timeout", type=float, default=60.0,
                        help="seconds one row's first (compiling) run may take before the row is skipped; "
                             "the repetitions shrink to fit a row into about this much time too")


# -- rows ------------------------------------------------------------------------------------------


@dataclass
class Row:
    """One shape: a triodnn descriptor, its inputs (logical arrays by argument name) and the
    same computation for the peers. ``work`` is FLOPs (compute families) or bytes read and
    written once (memory family). ``torch_op`` takes the inputs as torch tensors (4-D ones in
    channels_last where ``channels_last``); ``numpy_op`` takes the numpy inputs; ``ort`` is
    (ONNX graph builder, input names) for ONNX Runtime. Each returns dst's logical values."""

    family: str
    label: str
    desc: object
    inputs: dict[str, np.ndarray]
    work: float
    torch_op: Callable | None = None
    numpy_op: Callable | None = None
    ort: tuple | None = None
    channels_last: bool = False
    ref_key: str | None = None  # rows of one computation in several layouts share a reference
    torch_dtype: str | None = None  # the torch type src and weights take (default float32)
    notes: list[str] = field(default_factory=list)


def uniform(rng, shape, low=-1.0, high=1.0) -> np.ndarray:
    return rng.uniform(low, high, shape).astype(np.float32)


def matmul_row(rng, label, m, k, n, batch=(), post=None, dtype="f32") -> Row:
    """src (batch…, M, K) @ weights (batch…, K, N) of ``dtype`` (values exact in it); ``post``:
    "relu_add" (relu, then a broadcast bias add) or "tanh", the chain fused as post-ops and
    composed by the peers."""
    a, b = uniform(rng, batch + (m, k)), uniform(rng, batch + (k, n))
    if dtype != "f32":
        a, b = (from_storage(to_storage(x, dtype), dtype).reshape(x.shape) for x in (a, b))
    inputs = {"src": a, "weights": b}
    post_ops = ()
    if post == "relu_add":
        inputs["post_op_1_src1"] = uniform(rng, (1, n))
        post_ops = (("eltwise", "relu"), ("binary", "add", MemoryDesc((1, n))))
    elif post == "tanh":
        post_ops = (("eltwise", "tanh"),)
    desc = triodnn.MatmulDesc(MemoryDesc(a.shape, dtype), MemoryDesc(b.shape, dtype), post_ops=post_ops)

    def torch_op(t):
        y = t["src"] @ t["weights"]
        if post == "relu_add":
            return torch.relu(y) + t["post_op_1_src1"]
        return torch.tanh(y) if post == "tanh" else y

    def numpy_op(x):
        y = x["src"] @ x["weights"]
        if post == "relu_add":
            return np.maximum(y, 0) + x["post_op_1_src1"]
        return np.tanh(y) if post == "tanh" else y

    ort_spec = None if post or dtype != "f32" else (lambda: ort_matmul(a.shape, b.shape), ("src", "weights"))
    flops = 2.0 * math.prod(batch) * m * n * k
    torch_dtype = {"bf16": "bfloat16", "f16": "float16"}.get(dtype)
    return Row("matmul", label, desc, inputs, flops, torch_op, numpy_op, ort_spec, torch_dtype=torch_dtype)


def matmul_rows(gpu: bool, quick: bool, rng, dtype: str = "f32") -> list:
    """(label, builder) pairs; builders run lazily, so a skipped family costs no data."""
    rows = []
    squares = (256, 512) if quick else ((256, 512, 1024, 2048, 4096, 8192) if gpu else (256, 512, 1024, 2048))
    for s in squares:
        rows.append((f"square {s}", lambda s=s: matmul_row(rng, f"square {s}", s, s, s, dtype=dtype)))
    skinny = ((1, 1024, 1024), (8, 4096, 32)) if quick else (
        (1, 4096, 4096), (8, 32768, 32), (16, 4096, 4096), (16, 32768, 1024))
    for m, k, n in skinny:
        rows.append((f"skinny {m}x{k}x{n}",
                     lambda m=m, k=k, n=n: matmul_row(rng, f"skinny {m}x{k}x{n}", m, k, n, dtype=dtype)))
    tall = ((4096, 64, 64),) if quick else (((65536, 1024, 16), (262144, 64, 64), (131072, 256, 256)) if gpu else
                                            ((16384, 1024, 16), (65536, 64, 64), (32768, 256, 256)))
    for m, k, n in tall:
        rows.append((f"tall {m}x{k}x{n}",
                     lambda m=m, k=k, n=n: matmul_row(rng, f"tall {m}x{k}x{n}", m, k, n, dtype=dtype)))
    batched = ((8, 64),) if quick else ((8, 64), (64, 128), (256, 64), (256, 256))
    for b, s in batched:
        label = f"batched {b}x{s}x{s}x{s}"
        rows.append((label, lambda b=b, s=s, label=label: matmul_row(rng, label, s, s, s, batch=(b,), dtype=dtype)))
    posts = ((256, 256, 256, "relu_add"), (8, 4096, 32, "tanh")) if quick else (
        (1024, 1024, 1024, "relu_add"), (4096, 4096, 4096, "relu_add") if gpu else (2048, 2048, 2048, "relu_add"),
        (8, 32768, 32, "tanh"), (16, 4096, 4096, "relu_add"))
    for m, k, n, post in posts:
        label = f"{m}x{k}x{n} +{post}"
        rows.append((label, lambda m=m, k=k, n=n, post=post, label=label: matmul_row(rng, label, m, k, n, post=post,
                                                                                     dtype=dtype)))
    return rows


# name, N-independent geometry: (IC, OC, H=W, kernel, stride, pad, groups)
RESNET = (
    ("rn50 conv1 7x7/2", 3, 64, 224, 7, 2, 3, 1),
    ("rn50 res2 1x1 64>256", 64, 256, 56, 1, 1, 0, 1),
    ("rn50 res2 3x3 64", 64, 64, 56, 3, 1, 1, 1),
    ("rn50 res3 3x3/2 128", 128, 128, 56, 3, 2, 1, 1),
    ("rn50 res4 1x1 1024>256", 1024, 256, 14, 1, 1, 0, 1),
    ("rn50 res5 3x3 512", 512, 512, 7, 3, 1, 1, 1),
)
MOBILENET = (
    ("mbv2 dw3x3 32@112", 32, 32, 112, 3, 1, 1, 32),
    ("mbv2 dw3x3/2 96@112", 96, 96, 112, 3, 2, 1, 96),
    ("mbv2 dw3x3 576@14", 576, 576, 14, 3, 1, 1, 576),
    ("mbv2 pw1x1 96>24@56", 96, 24, 56, 1, 1, 0, 1),
)
QUICK_CONV = (
    ("3x3 16@14", 16, 16, 14, 3, 1, 1, 1),
    ("dw3x3/2 16@14", 16, 16, 14, 3, 2, 1, 16),
)


def conv_row(rng, label, n, ic, oc, hw, k, s, p, g, layout, cache) -> Row:
    key = (label, n)
    if key not in cache:  # one layer's data serves both layouts (the same logical values)
        cache[key] = {"src": uniform(rng, (n, ic, hw, hw)), "weights": uniform(rng, (oc, ic // g, k, k))}
    inputs = cache[key]
    src_dims, w_dims = inputs["src"].shape, inputs["weights"].shape
    nhwc = layout == "nhwc"
    desc = triodnn.ConvolutionDesc(
        MemoryDesc(src_dims, strides="nhwc" if nhwc else None),
        MemoryDesc(w_dims, strides="hwio" if nhwc else None),
        None, None, (s, s), (p, p), (p, p), None, g)
    if nhwc:  # dst in the layout of src, as a NHWC network chains them
        desc = triodnn.ConvolutionDesc(desc.src, desc.weights, MemoryDesc(desc.dst.dims, strides="nhwc"),
                                       None, (s, s), (p, p), (p, p), None, g)
    oh = desc.dst.dims[2]
    flops = 2.0 * n * oc * oh * oh * (ic // g) * k * k

    def torch_op(t):
        return F.conv2d(t["src"], t["weights"], stride=s, padding=p, groups=g)

    ort_spec = (lambda: ort_conv(src_dims, w_dims, s, p, g), ("src", "weights"))
    row = Row("conv", f"{label} n{n} {layout}", desc, inputs, flops, torch_op, None, ort_spec,
              channels_last=nhwc, ref_key=f"conv {label} n{n}")
    return row


def conv_rows(gpu: bool, quick: bool, rng) -> list:
    cache: dict = {}
    n = 1 if quick or not gpu else 8
    layers = QUICK_CONV if quick else RESNET + MOBILENET
    rows = []
    for layer in layers:
        for layout in ("nchw", "nhwc"):
            label = f"{layer[0]} n{n} {layout}"
            rows.append((label, lambda layer=layer, layout=layout: conv_row(rng, *layer[:1], n, *layer[1:],
                                                                            layout, cache)))
    return rows


def memory_row(label, desc, inputs, torch_op, numpy_op=None, channels_last=False) -> Row:
    nbytes = sum(x.nbytes for x in inputs.values()) + desc.dst.nbytes
    return Row(MEMORY_FAMILY, label, desc, inputs, float(nbytes), torch_op, numpy_op, channels_last=channels_last)


def size_label(count: int) -> str:
    for unit, size in (("M", 1 << 20), ("K", 1 << 10)):
        if count >= size and count % size == 0:
            return f"{count // size}{unit}"
    return str(count)


def eltwise_row(rng, alg, count) -> Row:
    x = uniform(rng, (count,), -4, 4)
    torch_ops = {"relu": lambda t: F.relu(t["src"]), "gelu_erf": lambda t: F.gelu(t["src"]),
                 "swish": lambda t: F.silu(t["src"])}
    numpy_ops = {"relu": lambda x: np.maximum(x["src"], 0), "swish": lambda x: x["src"] / (1 + np.exp(-x["src"]))}
    # swish's alpha: oneDNN's default is 0 (x / 2); torch's silu and the numpy peer are alpha 1.
    params = {"alpha": 1.0} if alg == "swish" else {}
    desc = triodnn.EltwiseDesc(alg, MemoryDesc(x.shape), **params)
    return memory_row(f"{alg} {size_label(count)}", desc, {"src": x},
                      torch_ops[alg], numpy_ops.get(alg))


def two_d(count: int, cols: int) -> tuple[int, int]:
    cols = min(cols, count)
    return count // cols, cols


def binary_row(rng, count) -> Row:
    rows, cols = two_d(count, 1024)
    a, b = uniform(rng, (rows, cols)), uniform(rng, (1, cols))
    desc = triodnn.BinaryDesc("add", MemoryDesc(a.shape), MemoryDesc(b.shape))
    return memory_row(f"add {rows}x{cols} + 1x{cols}", desc, {"src0": a, "src1": b},
                      lambda t: t["src0"] + t["src1"], lambda x: x["src0"] + x["src1"])


def softmax_row(rng, count) -> Row:
    shape = two_d(count, 4096 if count >= 1 << 24 else 1024)
    x = uniform(rng, shape, -4, 4)

    def numpy_op(v):
        e = np.exp(v["src"] - v["src"].max(-1, keepdims=True))
        return e / e.sum(-1, keepdims=True)
    return memory_row(f"softmax {shape[0]}x{shape[1]}", triodnn.SoftmaxDesc("softmax", MemoryDesc(shape)), {"src": x},
                      lambda t: torch.softmax(t["src"], -1), numpy_op)


def norm_row(rng, kind, count) -> Row:
    shape = two_d(count, 1024 if count < 1 << 24 else 4096)
    x = uniform(rng, shape, -4, 4)
    c = shape[1]
    if kind == "layer":
        desc = triodnn.LayerNormDesc(MemoryDesc(shape))

        def numpy_op(v):
            d = v["src"] - v["src"].mean(-1, keepdims=True)
            return d / np.sqrt((d * d).mean(-1, keepdims=True) + np.float32(1e-5))
        torch_op = lambda t: F.layer_norm(t["src"], (c,), eps=1e-5)  # noqa: E731
    else:
        desc = triodnn.RMSNormDesc(MemoryDesc(shape))

        def numpy_op(v):
            return v["src"] / np.sqrt((v["src"] * v["src"]).mean(-1, keepdims=True) + np.float32(1e-5))
        torch_op = (lambda t: F.rms_norm(t["src"], (c,), eps=1e-5)) if hasattr(F, "rms_norm") else None  # noqa: E731
    return memory_row(f"{kind} norm {shape[0]}x{shape[1]}", desc, {"src": x}, torch_op, numpy_op)


def reduction_row(rng, count) -> Row:
    rows, cols = two_d(count, 4096)
    # Small integers: every sum is exact in f32, so every side must equal the reference exactly.
    x = rng.integers(-4, 5, (rows, cols)).astype(np.float32)
    desc = triodnn.ReductionDesc("sum", MemoryDesc(x.shape), MemoryDesc((rows, 1)))
    return memory_row(f"sum {rows}x{cols} > {rows}x1", desc, {"src": x},
                      lambda t: t["src"].sum(-1, keepdim=True), lambda v: v["src"].sum(-1, keepdims=True))


def transpose_row(rng, count) -> Row:
    side = int(math.isqrt(count))
    x = uniform(rng, (side, side))
    desc = triodnn.ReorderDesc(MemoryDesc(x.shape), MemoryDesc(x.shape, strides="ba"))
    return memory_row(f"transpose {side}x{side}", desc, {"src": x},
                      lambda t: t["src"].t().contiguous().t(), lambda v: np.asfortranarray(v["src"]))


def nchw_to_nhwc_row(rng, count) -> Row:
    c, hw = 64, 56
    n = max(1, count // (c * hw * hw))
    x = uniform(rng, (n, c, hw, hw))
    desc = triodnn.ReorderDesc(MemoryDesc(x.shape), MemoryDesc(x.shape, strides="nhwc"))
    return memory_row(f"nchw>nhwc {n}x{c}x{hw}x{hw}", desc, {"src": x},
                      lambda t: t["src"].contiguous(memory_format=torch.channels_last),
                      lambda v: np.ascontiguousarray(v["src"].transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2))


def memory_rows(gpu: bool, quick: bool, rng) -> list:
    k4, m1, m16, m64 = 1 << 12, 1 << 20, 1 << 24, 1 << 26
    if quick:
        plan = [("eltwise", "swish", k4), ("eltwise", "gelu_erf", m1), ("binary", None, m1), ("softmax", None, m1),
                ("layer", None, k4), ("rms", None, m1), ("sum", None, m1), ("transpose", None, m1)]
    else:
        big = (m16, m64) if gpu else (m16,)
        plan = [("eltwise", alg, n) for alg in ("relu", "gelu_erf", "swish") for n in (k4, m1) + big]
        plan += [(op, None, n) for op in ("binary", "softmax", "layer", "rms", "sum", "transpose")
                 for n in (k4, m1) + big]
        plan += [("nchw>nhwc", None, 8 * 64 * 56 * 56)]
    builders = {
        "eltwise": lambda alg, n: eltwise_row(rng, alg, n), "binary": lambda alg, n: binary_row(rng, n),
        "softmax": lambda alg, n: softmax_row(rng, n), "layer": lambda alg, n: norm_row(rng, "layer", n),
        "rms": lambda alg, n: norm_row(rng, "rms", n), "sum": lambda alg, n: reduction_row(rng, n),
        "transpose": lambda alg, n: transpose_row(rng, n), "nchw>nhwc": lambda alg, n: nchw_to_nhwc_row(rng, n),
    }
    return [(f"{op} {alg or ''} {size_label(n)}".replace("  ", " "),
             lambda op=op, alg=alg, n=n: builders[op](alg, n)) for op, alg, n in plan]


def sdpa_row(rng, b, h, s, d, variant) -> Row:
    q, k, v = (uniform(rng, (b, h, s, d)) for _ in range(3))
    scale = np.array([1.0 / math.sqrt(d)], dtype=np.float32)
    inputs = {"query": q, "key": k, "value": v, "scale": scale}
    masked = variant == "masked"
    if masked:  # an additive padding mask: the last eighth of the keys masked for every query
        mask = np.zeros((1, 1, s, s), dtype=np.float32)
        mask[..., s - s // 8:] = -np.inf
        inputs["mask"] = mask
    desc = triodnn.SdpaDesc(MemoryDesc(q.shape), MemoryDesc(k.shape), MemoryDesc(v.shape),
                            mask=MemoryDesc((1, 1, s, s)) if masked else None, scale=MemoryDesc((1,)),
                            causal=None if masked else "top_left")

    def torch_op(t):
        return F.scaled_dot_product_attention(t["query"], t["key"], t["value"], attn_mask=t.get("mask"),
                                              is_causal=not masked, scale=1.0 / math.sqrt(d))
    # Q K^T and P V; a causal row does about half the work, counted whole as torch's benchmarks do.
    flops = 4.0 * b * h * s * s * d
    return Row("sdpa", f"b{b} h{h} s{s} d{d} {variant}", desc, inputs, flops, torch_op)


def sdpa_rows(gpu: bool, quick: bool, rng) -> list:
    if quick:
        plan = ((1, 2, 128, 64, "causal"), (1, 2, 128, 64, "masked"))
    elif gpu:
        plan = ((8, 16, 128, 64, "causal"), (8, 16, 128, 64, "masked"), (4, 16, 512, 64, "causal"),
                (4, 16, 512, 128, "masked"), (2, 16, 1024, 128, "causal"), (1, 16, 2048, 64, "masked"),
                (1, 16, 2048, 128, "causal"), (1, 8, 4096, 64, "causal"), (1, 8, 4096, 128, "masked"))
    else:
        plan = ((1, 8, 128, 64, "causal"), (1, 8, 128, 64, "masked"), (1, 8, 512, 64, "causal"),
                (1, 8, 512, 128, "masked"), (1, 8, 1024, 128, "causal"), (1, 4, 2048, 64, "masked"))
    return [("b{} h{} s{} d{} {}".format(*p), lambda p=p: sdpa_row(rng, *p)) for p in plan]


ROW_PLANS = {"matmul": matmul_rows, "conv": conv_rows, "memory": memory_rows, "sdpa": sdpa_rows}


# -- ONNX Runtime models ---------------------------------------------------------------------------


def ort_session(graph):
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


def ort_matmul(a_shape, b_shape):
    f = TensorProto.FLOAT
    node = helper.make_node("MatMul", ["src", "weights"], ["dst"])
    graph = helper.make_graph([node], "matmul", [helper.make_tensor_value_info("src", f, list(a_shape)),
                                                 helper.make_tensor_value_info("weights", f, list(b_shape))],
                              [helper.make_tensor_value_info("dst", f, None)])
    return ort_session(graph)


def ort_conv(src_shape, w_shape, stride, pad, groups):
    f = TensorProto.FLOAT
    node = helper.make_node("Conv", ["src", "weights"], ["dst"], strides=[stride, stride], pads=[pad] * 4,
                            group=groups)
    graph = helper.make_graph([node], "conv", [helper.make_tensor_value_info("src", f, list(src_shape)),
                                               helper.make_tensor_value_info("weights", f, list(w_shape))],
                              [helper.make_tensor_value_info("dst", f, None)])
    return ort_session(graph)


# -- peers -----------------------------------------------------------------------------------------


class Host:
    """A synchronous host call (numpy, torch CPU, ONNX Runtime); a sample is N calls in a row.
    Computing in the calling thread, its wall time is its device time in either timing mode."""

    def __init__(self, fn) -> None:
        self.fn, self.runs, self.last = fn, 1, None

    def sample(self) -> float:
        t0 = time.perf_counter()
        for _ in range(self.runs):
            self.last = self.fn()
        return (time.perf_counter() - t0) / self.runs


def torch_tensors(row: Row, device: str) -> dict:
    out = {}
    for name, x in row.inputs.items():
        t = torch.from_numpy(x).to(device)
        if row.torch_dtype is not None and name in ("src", "weights"):
            t = t.to(getattr(torch, row.torch_dtype))
        if row.channels_last and t.ndim == 4:
            t = t.contiguous(memory_format=torch.channels_last)
        out[name] = t
    return out


def build_peers(row: Row, device: str, have: dict, runs: int, mode: str) -> dict:
    """name -> (runner with ``sample()`` and ``last``, fn(last) -> logical numpy result)."""
    peers = {}
    if have["torch_cuda"] and device == "gpu" and row.torch_op is not None:
        t = torch_tensors(row, "cuda")
        peers["torch"] = (bench_gpu.Torch(lambda t=t: row.torch_op(t), runs, mode),
                          lambda r: r.detach().float().cpu().numpy())
    if device == "cpu":
        if row.numpy_op is not None:
            peers["numpy"] = (Host(lambda: row.numpy_op(row.inputs)), np.asarray)
        if have["torch"] and row.torch_op is not None:
            t = torch_tensors(row, "cpu")
            peers["torch"] = (Host(lambda t=t: row.torch_op(t)), lambda r: r.detach().numpy())
        if have["ort"] and row.ort is not None:
            make, names = row.ort
            session = make()
            feed = {name: row.inputs[name] for name in names}
            peers["ort"] = (Host(lambda s=session, feed=feed: s.run(None, feed)[0]), np.asarray)
            if row.channels_last:
                row.notes.append("ort computes in NCHW, its CPU layout")
    return peers


def peer_problem(check, to_numpy, value) -> str | None:
    try:
        check(to_numpy(value))
    except AssertionError as exc:
        return str(exc)
    return None


# -- one row ---------------------------------------------------------------------------------------


class Skip(Exception):
    """A row that cannot run here; its message says why."""


def largest_tensor(row: Row) -> int:
    return max([x.size for x in row.inputs.values()] + [math.prod(row.desc.dst.dims)])


async def measure_row(row: Row, engine, stream, ctx: dict) -> dict:
    """The row's median seconds per run for triodnn and each peer, all checked; raises Skip."""
    args, mode = ctx["args"], ctx["mode"]
    device_bytes = sum(x.nbytes for x in row.inputs.values()) + row.desc.dst.nbytes
    if row.family == MEMORY_FAMILY:
        device_bytes *= 2  # the copy's buffers beside the op's
    if ctx["have"]["torch_cuda"] and ctx["device"] == "gpu":
        device_bytes *= 2  # torch's copies of the tensors on the same GPU
    if device_bytes > 0.7 * engine.info.global_mem_size:
        raise Skip(f"needs {device_bytes / 2**30:.1f} GiB, the device holds {engine.info.global_mem_size / 2**30:.1f}")
    # The float64 reference and the checks' float64 copies: about 6 times the row's f32 bytes on the host.
    host_bytes = 6 * (sum(x.nbytes for x in row.inputs.values()) + row.desc.dst.nbytes)
    if row.family == "sdpa":  # its reference holds a few float64 score matrices
        host_bytes += 4 * 8 * math.prod(row.desc.dst.dims[:-1]) * row.desc.key.dims[-2]
    if host_bytes > 0.7 * HOST_MEMORY:
        raise Skip(f"its reference needs about {host_bytes / 2**30:.1f} GiB of host memory, "
                   f"the host has {HOST_MEMORY / 2**30:.1f}")
    try:
        primitive = await engine.create_primitive(row.desc)
    except triodnn.TriodnnError as exc:
        raise Skip(f"{type(exc).__name__}: {exc}") from None
    memories = {}
    try:
        for name, desc in row.desc.arg_descs.items():
            if name != "dst":
                memories[name] = await engine.from_numpy(row.inputs[name], desc)
        dst = memories["dst"] = engine.memory(row.desc.dst)
        ref_key = row.ref_key or row.label
        if ref_key not in ctx["refs"]:
            ctx["refs"].clear()  # one reference at a time: the big rows' would fill the host
            kind = kind_of(row.desc)
            ctx["refs"][ref_key] = np.asarray(kind.reference(row.desc, row.inputs))
        want = ctx["refs"][ref_key]
        check = bench_gpu.checker(row.label, want, kind_of(row.desc).tolerance(row.desc))

        t0 = time.perf_counter()
        with trio.move_on_after(args.row_timeout) as scope:
            await stream.execute(primitive, memories)  # warm (compiles on some drivers), first check
        if scope.cancelled_caught:
            raise Skip(f"first run over --row-timeout {args.row_timeout:g} s")
        check(await dst.to_numpy())
        first_s = time.perf_counter() - t0
        await stream.wait()
        t0 = time.perf_counter()
        await stream.execute(primitive, memories)
        one = time.perf_counter() - t0
        runs = max(1, min(ctx["runs"], int(SAMPLE_TARGET_S / max(one, 1e-6))))
        await common.poison(dst)

        variants = {"triodnn": bench_gpu.Triodnn(stream, primitive, dict(memories), runs, mode)}
        if ctx["alt"] is not None:
            alt_engine, alt_stream = ctx["alt"]
            variants["alt"] = await alt_variant(row, alt_engine, alt_stream, memories, check, runs, mode)
        converters = {}
        try:
            peers = build_peers(row, ctx["device"], ctx["have"], runs, mode)
        except Exception as exc:  # a peer that cannot build this row (memory, unsupported) is left out
            row.notes.append(f"peers left out: {type(exc).__name__}: {str(exc)[:120]}")
            peers = {}
        for name, (runner, to_numpy) in peers.items():
            runner.runs = runs
            try:
                runner.sample()  # warm (cuDNN picks its algorithm here), and the first check
                problem = peer_problem(check, to_numpy, runner.last)
            except Exception as exc:  # e.g. out of memory on a big row
                problem = f"{type(exc).__name__}: {str(exc)[:120]}"
            if problem is None:
                variants[name], converters[name] = runner, to_numpy
            else:
                row.notes.append(f"{name} left out: {problem}")
        copy = None
        if row.family == MEMORY_FAMILY:
            copy = bench_gpu.Copy(engine, int(row.work), runs, mode, ctx["rng"])
            copy.clear()
            variants["copy"] = copy
        # Fit the row into about --row-timeout: fewer repetitions where one run is long.
        reps = max(2, min(ctx["reps"], int(args.row_timeout / max(one * runs * len(variants) * 2, 1e-9))))
        samples = await common.interleaved({k: v.sample for k, v in variants.items()}, reps)
        check(await dst.to_numpy())  # NaN unless the timed runs wrote it
        if "alt" in variants:
            check(await variants["alt"].args["dst"].to_numpy())
        if copy is not None:
            copy.check()
        times = {k: common.median(v) for k, v in samples.items()}
        for name, to_numpy in converters.items():
            problem = peer_problem(check, to_numpy, variants[name].last)
            if problem is not None:
                row.notes.append(f"{name} left out, its timed result is off: {problem}")
                times[name] = math.nan
        return {"times": times, "samples": samples, "runs": runs, "reps": reps, "impl": primitive.impl,
                "first_run_s": first_s}
    finally:
        for memory in memories.values():
            memory.release()


async def alt_variant(row: Row, engine, stream, memories: dict, check, runs: int, mode: str):
    """The row on the --compare-engine: its own primitive and copies of the inputs, checked
    before timing; its dst poisoned so the check after timing proves the timed runs wrote it.
    Its buffers join ``memories`` under alt: keys, released with the row's."""
    primitive = await engine.create_primitive(row.desc)
    args = {}
    for name, desc in row.desc.arg_descs.items():
        args[name] = engine.memory(desc) if name == "dst" else await engine.from_numpy(row.inputs[name], desc)
        memories[f"alt:{name}"] = args[name]
    await stream.execute(primitive, args)
    check(await args["dst"].to_numpy())
    await common.poison(args["dst"])
    row.notes.append(f"alt impl {primitive.impl}")
    return bench_gpu.Triodnn(stream, primitive, args, runs, mode)


# -- tables ----------------------------------------------------------------------------------------


def ratio(times: dict, peer: str) -> float:
    return times.get(peer, math.nan) / times["triodnn"]


def best_library(times: dict, device: str) -> tuple[str | None, float]:
    present = [(times[p], p) for p in LIBRARY_PEERS[device] if not math.isnan(times.get(p, math.nan))]
    if not present:
        return None, math.nan
    best, name = min(present)
    return name, best


def family_table(family: str, results: list, device: str, peers_shown: list, ctx: dict) -> dict:
    goal_peer, goal = GOALS[(device, family)]
    memory = family == MEMORY_FAMILY
    unit, scale = ("GB/s", 1e9) if memory else (("TFLOP/s", 1e12) if device == "gpu" else ("GFLOP/s", 1e9))
    alt = ctx["alt"] is not None
    headers = ["shape", "triodnn ms", f"triodnn {unit}"] + (["alt ms", "÷ alt"] if alt else []) + [
        f"{p} ms" for p in peers_shown] + ["best lib", "÷ best lib", f"÷ {goal_peer}", "goal", "ok", "impl / why skipped"]
    table, ratios = [], []
    for row, res in results:
        if "skipped" in res:
            table.append([row, "skipped"] + [""] * (len(headers) - 3) + [res["skipped"]])
            continue
        t = res["times"]
        name, best = best_library(t, device)
        r = ratio(t, goal_peer)
        ok = "-" if goal is None or math.isnan(r) else ("yes" if r >= goal else "NO")
        if not math.isnan(r):
            ratios.append((r, row))
        table.append([row, t["triodnn"] * 1e3, res["work"] / t["triodnn"] / scale]
                     + ([t.get("alt", math.nan) * 1e3, ratio(t, "alt")] if alt else [])
                     + [t.get(p, math.nan) * 1e3 for p in peers_shown]
                     + [name or "-", best / t["triodnn"] if name else math.nan, r,
                        "-" if goal is None else f">= {goal}", ok, res["impl"]])
    title = (f"{family}: {ctx['note']}\n   command: {common.command_line()}\n"
             f"   ratio ÷ X = X's time / triodnn's time (above 1: triodnn faster); goal judged on ÷ {goal_peer}")
    common.print_table(headers, table, title)
    for row, res in results:
        for note in res.get("notes", ()):
            print(f"   {row}: {note}")
    summary = {"goal_peer": goal_peer, "goal": goal, "rows": len(results), "measured": len(ratios)}
    alt_ratios = [ratio(res["times"], "alt") for _, res in results if "alt" in res.get("times", {})]
    if alt_ratios:
        summary.update(alt=ctx["alt_label"], alt_median=statistics.median(alt_ratios), alt_worst=min(alt_ratios),
                       alt_best=max(alt_ratios), alt_rows=len(alt_ratios))
        print(f"summary {family}: ÷ alt ({ctx['alt_label']}'s time / {ctx['engine_label']}'s) median "
              f"{summary['alt_median']:.2f}x, range {summary['alt_worst']:.2f}-{summary['alt_best']:.2f}x "
              f"over {len(alt_ratios)} rows")
    if ratios:
        worst = min(ratios)
        med = statistics.median(r for r, _ in ratios)
        met = sum(r >= goal for r, _ in ratios) if goal is not None else None
        summary.update(worst=worst[0], worst_row=worst[1], median=med, at_goal=met)
        goal_text = f"; {met}/{len(ratios)} rows >= {goal}x" if goal is not None else "; no goal set for this device"
        print(f"summary {family} ({device}): ÷ {goal_peer} worst {worst[0]:.2f}x ({worst[1]}), "
              f"median {med:.2f}x over {len(ratios)} rows{goal_text}")
    else:
        print(f"summary {family} ({device}): no row measured against {goal_peer}")
    skipped = sum("skipped" in res for _, res in results)
    if skipped:
        print(f"   {skipped} row(s) skipped")
    print()
    return summary


def timing_note(mode: str, runs: int, reps: int) -> str:
    how = ("wall time over N queued runs (submit N, wait once; per run = total / N)" if mode == common.WALL else
           "device time over N queued runs (first start to last end; per run = span / N)")
    return (f"timing: {how}; N per row = {SAMPLE_TARGET_S * 1e3:g} ms / one triodnn run, within [1, {runs}]; "
            f"median of up to {reps} interleaved samples per variant")


# -- main ------------------------------------------------------------------------------------------


async def run(args):
    mode = args.timing
    runs = args.runs or (5 if args.quick else 20)
    reps = args.reps or (3 if args.quick else 7)
    rng = np.random.default_rng(0)
    families = args.family or list(FAMILIES)
    have = {"torch": torch is not None, "torch_cuda": torch is not None and torch.cuda.is_available(),
            "ort": ort is not None}
    if have["torch_cuda"]:
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        torch.backends.cudnn.benchmark = True
    results: dict = {"timing": mode, "max_runs": runs, "reps": reps, "families": {}}
    async with triodnn.open_runtime() as rt:
        engine = await common.open_engine(rt, args)
        device = "gpu" if "gpu" in engine.info.type.lower() else "cpu"
        stream = await engine.stream(StreamFlags.profiling if mode == common.DEVICE else StreamFlags.in_order)
        timing = timing_note(mode, runs, reps)
        if device == "gpu":
            peer_note = ("peers: torch on CUDA (TF32 off, cudnn.benchmark on)" if have["torch_cuda"]
                         else "peers: torch absent or without CUDA: triodnn and the OpenCL copy only")
        else:
            present = [n for n, ok in (("numpy", True), ("torch CPU", have["torch"]), ("ONNX Runtime", have["ort"]))
                       if ok]
            absent = [n for n, ok in (("torch CPU", have["torch"]), ("ONNX Runtime", have["ort"])) if not ok]
            peer_note = f"peers: {', '.join(present)}" + (f" (absent: {', '.join(absent)})" if absent else "") + \
                "; host peers timed by wall time in both modes"
        common.print_header("bench_sweep: kernel speed across shape families", engine, args,
                            [timing, peer_note, "memory-bound rows: the OpenCL copy moves the row's bytes "
                             "(half read, half written)"])
        alt = None
        if args.compare_engine:
            alt_kind, _, alt_index = args.compare_engine.partition(":")
            alt_engine = await rt.engine(alt_kind, int(alt_index or 0))
            alt = (alt_engine, await alt_engine.stream(
                StreamFlags.profiling if mode == common.DEVICE else StreamFlags.in_order))
            facts = common.engine_facts(alt_engine)
            print(f"   alt engine {facts['engine']} | {facts['platform']} | driver {facts['driver']}\n")
        ctx = {"args": args, "mode": mode, "runs": runs, "reps": reps, "rng": rng, "have": have, "device": device,
               "refs": {}, "note": timing, "alt": alt, "alt_label": args.compare_engine,
               "engine_label": args.engine}
        for family in families:
            rows_out = []
            plan = ROW_PLANS[family]
            if family == "matmul":
                plan = functools.partial(matmul_rows, dtype=args.dtype)
            for label, build in plan(device == "gpu", args.quick, rng):
                if args.row and not any(text in label for text in args.row):
                    continue
                try:
                    row = build()
                    label = row.label
                    if args.max_elements is not None and largest_tensor(row) > args.max_elements:
                        raise Skip(f"{largest_tensor(row)} elements > --max-elements {args.max_elements}")
                    res = await measure_row(row, engine, stream, ctx)
                    res.update(work=row.work, notes=row.notes)
                except Skip as exc:
                    res = {"skipped": str(exc)}
                except MemoryError as exc:
                    res = {"skipped": f"host memory: {exc}"}
                except AssertionError as exc:  # triodnn's result off its reference: a finding, shown as such
                    res = {"skipped": f"CHECK FAILED: {str(exc)[:200]}"}
                except Exception as exc:  # one row's failure (a build, an allocation) must not end the sweep
                    res = {"skipped": f"{type(exc).__name__}: {str(exc)[:200]}"}
                rows_out.append((label, res))
            peers_shown = [p for p in ("torch", "numpy", "ort", "copy")
                           if any(p in r.get("times", {}) for _, r in rows_out)]
            summary = family_table(family, rows_out, device, peers_shown, ctx)
            results["families"][family] = {"summary": summary, "rows": {label: res for label, res in rows_out}}
        return results, engine


def main() -> None:
    args = common.parse_args(__doc__.splitlines()[0], extra_args)
    results, engine = trio.run(run, args)
    common.write_json(args.json, "bench_sweep", engine, args, results)


if __name__ == "__main__":
    main()

"""Pooling backward: the generator of ``PoolingBackwardDesc``, its float64 reference and threshold.

One work-item per diff_src element gathers from every diff_dst element whose window holds it, so
no two work-items write one place (no atomics). Per spatial dimension the taps ``k`` with
``i + pl - k * dil`` a non-negative multiple of the stride name the windows ``o`` containing
``i``. ``avg_include_padding`` divides each diff_dst element by the kernel size,
``avg_exclude_padding`` by the number of its window's taps inside the input (the forward's
divisors). ``max`` recomputes each such window's argmax from src, the first maximum in tap order
as oneDNN's workspace records it (a later tap replaces it only when strictly greater; NaN never
does), and takes the diff_dst element when that argmax is this element.

Storage any of ``_dtype_io.DTYPES`` for each tensor, f32 math; max compares loaded values, exact
in every type.
"""

from __future__ import annotations

import math

import numpy as np

from .._values._pooling_bwd_desc import PoolingBackwardDesc
from .._values._pooling_desc import POOLING_ALGORITHMS, output_extent
from . import _dtype_io
from ._registry import register
from ._spec import KernelConfig, KernelSpec, c_float, padded_global

_F32_EPS = float(np.finfo(np.float32).eps)


def windows_per_element(kernel, strides, dilation) -> int:
    """The most windows one input element lies in: per dimension, the taps a stride apart."""
    # Taps k and k' reach one element's windows when (k - k') * d is a multiple of s.
    return math.prod(-(-k // (s // math.gcd(s, d))) for k, s, d in zip(kernel, strides, dilation))


def tolerance(kernel, strides, dilation) -> float:
    """diff_src sums up to ``windows_per_element`` rounded terms (avg: each a rounded quotient):
    one eps each, after the forward's ``n * eps`` for its window sums."""
    return max(2, windows_per_element(kernel, strides, dilation) + 1) * _F32_EPS


def _window_ranges(lines: list[str], k: int, o: str, i_len: int, kk: int, s: int, p: int, d: int) -> None:
    # The taps of window ``o`` inside the input, as the forward kernel's lo/hi.
    lines.append(f"const long ws{k} = {o} * {s}L - {p}L;")
    lines.append(f"const long wl{k} = ws{k} < 0 ? (-ws{k} + {d - 1}L) / {d}L : 0L;")
    lines.append(f"long wh{k} = ({i_len}L - ws{k} + {d - 1}L) / {d}L; wh{k} = wh{k} > {kk}L ? {kk}L : wh{k};")


def generate(desc: PoolingBackwardDesc, config: KernelConfig) -> KernelSpec:
    """The kernel writing ``desc.diff_src``: one work-item per element (see the module docstring)."""
    desc.check_supported()
    alg, kernel, strides, padding_l, dilation = desc.alg, desc.kernel, desc.strides, desc.padding_l, desc.dilation
    ds, dd = desc.diff_src, desc.diff_dst
    dims, nsp = ds.dims, ds.ndims - 2
    n = math.prod(dims)
    local = config.local_size
    src, is_max = desc.src, alg == "max"

    lines = ["ulong r = i;"]
    for axis in reversed(range(1, len(dims))):
        lines.append(f"const long x{axis} = (long)(r % {dims[axis]}UL); r /= {dims[axis]}UL;")
    lines.append("const long x0 = (long)r;")
    lines.append("const ulong off_ds = " + " + ".join(f"(ulong)x{a} * {ds.strides[a]}UL" for a in range(len(dims))) + ";")
    lines.append(f"const ulong base_dd = (ulong)x0 * {dd.strides[0]}UL + (ulong)x1 * {dd.strides[1]}UL;")
    if src is not None:  # max: the descriptor requires it there and refuses it elsewhere
        lines.append(f"const ulong base_src = (ulong)x0 * {src.strides[0]}UL + (ulong)x1 * {src.strides[1]}UL;")
        lines.append("const ulong self_src = " + " + ".join(f"(ulong)x{a} * {src.strides[a]}UL" for a in range(len(dims))) + ";")
    lines.append("float acc = 0.0f;")

    # Loops over the windows containing this element, one per spatial dimension.
    body: list[str] = []
    closes = 0
    for k in range(nsp):
        a = k + 2
        o_len = dd.dims[a]
        kk, s, p, d = kernel[k], strides[k], padding_l[k], dilation[k]
        body.append(f"for (long t{k} = 0; t{k} < {kk}L; ++t{k}) {{")
        body.append(f"const long q{k} = x{a} + {p}L - t{k} * {d}L;")
        body.append(f"if (q{k} < 0 || q{k} % {s}L != 0 || q{k} / {s}L >= {o_len}L) continue;")
        body.append(f"const long o{k} = q{k} / {s}L;")
        closes += 1
    dd_off = "base_dd + " + " + ".join(f"(ulong)o{k} * {dd.strides[k + 2]}UL" for k in range(nsp))
    grad = _dtype_io.load(dd.dtype, "diff_dst", dd_off)
    if alg == "avg_include_padding":
        body.append(f"acc += {grad} / {c_float(math.prod(kernel))};")
    elif alg == "avg_exclude_padding":
        for k in range(nsp):
            _window_ranges(body, k, f"o{k}", dims[k + 2], kernel[k], strides[k], padding_l[k], dilation[k])
        count = " * ".join(f"(wh{k} - wl{k})" for k in range(nsp))
        body.append(f"acc += {grad} / (float)({count});")
    elif src is not None:
        for k in range(nsp):
            _window_ranges(body, k, f"o{k}", dims[k + 2], kernel[k], strides[k], padding_l[k], dilation[k])
        body.append("float best = -INFINITY; ulong arg = ~0UL;")
        base = "base_src"
        for k in range(nsp):
            body.append(f"for (long k{k} = wl{k}; k{k} < wh{k}; ++k{k}) {{ "
                        f"const ulong p{k} = {base} + (ulong)(ws{k} + k{k} * {dilation[k]}L) * {src.strides[k + 2]}UL;")
            base = f"p{k}"
        body.append(f"const float v = {_dtype_io.load(src.dtype, 'src', base)}; "
                    f"if (v > best) {{ best = v; arg = {base}; }}")
        body.append("}" * nsp)
        body.append(f"if (arg == self_src) acc += {grad};")
    body.append("}" * closes)

    helpers = _dtype_io.functions(loads=(dd.dtype,) if src is None else (src.dtype, dd.dtype), stores=(ds.dtype,))
    params = [] if src is None else [_dtype_io.param(src.dtype, "src", const=True)]
    params += [_dtype_io.param(dd.dtype, "diff_dst", const=True), _dtype_io.param(ds.dtype, "diff_src", const=False)]
    code = "\n    ".join(lines + body)
    source = helpers + f"""__kernel void pooling_bwd({", ".join(params)}) {{
    const ulong i = get_global_id(0);
    if (i >= {n}UL) return;
    {code}
    {_dtype_io.store(ds.dtype, "diff_src", "off_ds", "acc")}
}}
"""
    return KernelSpec(
        source=source,
        name="pooling_bwd",
        arg_names=(("src",) if is_max else ()) + ("diff_dst", "diff_src"),
        global_size=(padded_global(n, local),),
        local_size=(local,),
        impl=f"ocl:gather:l{local}",
    )


def reference(
    alg: str,
    diff_dst: np.ndarray,
    src_dims,
    *,
    src: np.ndarray | None = None,
    kernel,
    strides,
    padding_l,
    padding_r=None,
    dilation=None,
    diff_src_dtype: str = "f32",
) -> np.ndarray:
    """diff_src of ``alg`` pooling backward in float64 (``(N, C, spatial...)`` arrays of
    user-facing values; ``src`` for max), rounded to float32 and stored as ``diff_src_dtype``."""
    if alg not in POOLING_ALGORITHMS:
        raise ValueError(f"unknown pooling algorithm {alg!r}; known: {', '.join(POOLING_ALGORITHMS)}")
    g = _dtype_io.widen(diff_dst)
    src_dims = tuple(int(v) for v in src_dims)
    nsp = len(src_dims) - 2

    def per_dim(value):
        value = (value,) if isinstance(value, int) else tuple(value)
        return value * nsp if len(value) == 1 else value

    kernel, strides, padding_l = per_dim(kernel), per_dim(strides), per_dim(padding_l)
    padding_r = padding_l if padding_r is None else per_dim(padding_r)
    dilation = (1,) * nsp if dilation is None else per_dim(dilation)
    out = tuple(output_extent(src_dims[2 + k], kernel[k], strides[k], padding_l[k], padding_r[k], dilation[k])
                for k in range(nsp))
    if g.shape != src_dims[:2] + out:
        raise ValueError(f"diff_dst shape {g.shape} is not the pooled shape {src_dims[:2] + out}")
    # Pad so every tap of every window indexes the buffer; padded places are cut off at the end.
    widths = [(0, 0), (0, 0)] + [
        (padding_l[k], max(0, (out[k] - 1) * strides[k] + (kernel[k] - 1) * dilation[k] + 1
                           - padding_l[k] - src_dims[2 + k]))
        for k in range(nsp)
    ]
    valid = np.pad(np.ones(src_dims[2:]), widths[2:], constant_values=0.0)
    taps = list(np.ndindex(*kernel))

    def tap_index(tap):
        return tuple(slice(tap[k] * dilation[k], tap[k] * dilation[k] + (out[k] - 1) * strides[k] + 1, strides[k])
                     for k in range(nsp))

    acc = np.zeros(src_dims[:2] + valid.shape)
    if alg == "max":
        if src is None:
            raise ValueError("max pooling backward needs src")
        xp = np.pad(_dtype_io.widen(src), widths, constant_values=-np.inf)
        best = np.full(g.shape, -np.inf)
        winner = np.full(g.shape, -1, dtype=np.int64)
        for t, tap in enumerate(taps):
            window = xp[(slice(None), slice(None)) + tap_index(tap)]
            better = window > best  # strictly: the first maximum in tap order stays
            best = np.where(better, window, best)
            winner = np.where(better, t, winner)
        for t, tap in enumerate(taps):
            acc[(slice(None), slice(None)) + tap_index(tap)] += np.where(winner == t, g, 0.0)
    else:
        if alg == "avg_include_padding":
            share = g / math.prod(kernel)
        else:
            count = sum(valid[tap_index(tap)] for tap in taps)
            share = g / count
        for tap in taps:
            acc[(slice(None), slice(None)) + tap_index(tap)] += share
    inner = tuple(slice(widths[2 + k][0], widths[2 + k][0] + src_dims[2 + k]) for k in range(nsp))
    return _dtype_io.store_reference(acc[(slice(None), slice(None)) + inner].astype(np.float32), diff_src_dtype)


def desc_reference(desc: PoolingBackwardDesc, inputs: dict[str, np.ndarray]) -> np.ndarray:
    """diff_src of ``desc`` from ``{"diff_dst": ..., "src": ...}``, stored as diff_src's type."""
    return reference(
        desc.alg, inputs["diff_dst"], desc.diff_src.dims, src=inputs.get("src"), kernel=desc.kernel,
        strides=desc.strides, padding_l=desc.padding_l, padding_r=desc.padding_r, dilation=desc.dilation,
        diff_src_dtype=desc.diff_src.dtype,
    )


def desc_tolerance(desc: PoolingBackwardDesc) -> float:
    return tolerance(desc.kernel, desc.strides, desc.dilation)


register(PoolingBackwardDesc, generate=generate, reference=desc_reference, tolerance=desc_tolerance)

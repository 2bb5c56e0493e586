"""Pooling forward: generator beside its OpenCL source, the float64 reference and thresholds.

Algorithms, by oneDNN name: ``max`` (``pooling_max``), ``avg_include_padding`` and
``avg_exclude_padding``. Tensors are ``(N, C, spatial...)`` by dims with 1, 2 or 3 spatial
dimensions, in any strides (NXC layouts are NCX dims with channel-last strides).

Output extent per spatial dimension, as oneDNN's: ``out = (in + pl + pr - ((k - 1) * dil + 1)) // s + 1``.
``dilation`` here is the plain factor (1 = no dilation); oneDNN counts it from 0, so oneDNN's
``dilation`` d is this module's ``d + 1``.

One work-item per output element. For each spatial dimension the range of kernel taps that land
inside the input is computed once (``lo``/``hi``), so the tap loops carry no bounds checks;
``avg_exclude_padding`` divides by the number of those taps, ``avg_include_padding`` by the full
kernel size (oneDNN's rule: padding counts as zeros). ``max`` ignores NaN inputs (ternaries, as
reduction's max). Every window must hold at least one input element; the descriptor refuses
geometries where one does not (oneDNN would write -FLT_MAX or divide by zero there).

``src`` and ``dst`` each have any storage type of ``_dtype_io.DTYPES``: f32 math, loads convert to
float and the store converts to dst's type (max of one type is exact: it stores a loaded value).
The all-f32 kernel is the plain one.
"""

from __future__ import annotations

import math

import numpy as np

from .._values._pooling_desc import POOLING_ALGORITHMS, PoolingDesc
from .._values._pooling_desc import empty_window as empty_window
from .._values._pooling_desc import output_extent as output_extent
from . import _dtype_io
from ._registry import register
from ._spec import KernelConfig, KernelSpec, c_float, padded_global

ALGORITHMS: tuple[str, ...] = POOLING_ALGORITHMS

_F32_EPS = float(np.finfo(np.float32).eps)

# Thresholds, after benchdnn's pool driver (tests/benchdnn/pool/pool.cpp, setup_cmp, and the f32
# cfg in pool/cfg.cpp): benchdnn fills pooling inputs with small integers so that averages of a
# window are exact and compares f32 with an eps-level threshold. ``max`` copies an input element:
# nothing rounds, threshold 0. The tests here use random floats, where the f32 window sum rounds
# at each of its n - 1 additions and the division once more, so the average gets n * eps (the
# sum's error is relative to the partial sums' magnitude, not to the possibly small average).
POOLING_MAX = 0.0


def tolerance(alg: str, window: int) -> float:
    """Threshold for ``alg`` with windows of ``window`` taps (kernel size product)."""
    if alg == "max":
        return POOLING_MAX
    return max(2, window) * _F32_EPS


def generate(desc: PoolingDesc, config: KernelConfig) -> KernelSpec:
    """The kernel pooling ``desc.src`` into ``desc.dst`` for ``config`` (the descriptor validated
    the geometry); src and dst of any storage types, the math f32."""
    desc.check_supported()
    alg, kernel, strides, padding_l, dilation = desc.alg, desc.kernel, desc.strides, desc.padding_l, desc.dilation
    src_dims, src_strides, src_dtype = desc.src.dims, desc.src.strides, desc.src.dtype
    dst_dims, dst_strides, dst_dtype = desc.dst.dims, desc.dst.strides, desc.dst.dtype
    nsp = len(src_dims) - 2
    outputs = math.prod(dst_dims)
    local = config.local_size

    # Decode the dst coordinates, innermost first.
    lines = ["ulong r = i;"]
    for axis in reversed(range(len(dst_dims))):
        d = dst_dims[axis]
        if axis == 0:
            lines.append("const ulong x0 = r;")
        else:
            lines.append(f"const ulong x{axis} = r % {d}UL; r /= {d}UL;")
    dst_off = " + ".join(f"x{a} * {dst_strides[a]}UL" for a in range(len(dst_dims)))
    lines.append(f"const ulong off_dst = {dst_off};")
    lines.append(f"const ulong base = x0 * {src_strides[0]}UL + x1 * {src_strides[1]}UL;")
    for k in range(nsp):
        a = k + 2
        i_len, kk, s, p, d = src_dims[a], kernel[k], strides[k], padding_l[k], dilation[k]
        lines.append(f"const long is{k} = (long)x{a} * {s}L - {p}L;")
        # First tap at or after index 0, and one past the last tap before in_len (C division
        # truncates toward zero; hi <= 0 leaves the loop empty, which validation rules out anyway).
        lines.append(f"const long lo{k} = is{k} < 0 ? (-is{k} + {d - 1}L) / {d}L : 0L;")
        lines.append(f"long hi{k} = ({i_len}L - is{k} + {d - 1}L) / {d}L; hi{k} = hi{k} > {kk}L ? {kk}L : hi{k};")

    if alg == "max":
        init = "float acc = -INFINITY;"
        step = "acc = x > acc ? x : acc;"
    else:
        init = "float acc = 0.0f;"
        step = "acc += x;"
    loops, closes = [], []
    base = "base"
    for k in range(nsp):
        a = k + 2
        loops.append(
            f"for (long k{k} = lo{k}; k{k} < hi{k}; ++k{k}) {{ "
            f"const ulong o{k} = {base} + (ulong)(is{k} + k{k} * {dilation[k]}L) * {src_strides[a]}UL;"
        )
        closes.append("}")
        base = f"o{k}"
    inner = f"{{ const float x = {_dtype_io.load(src_dtype, 'src', base)}; {step} }}"
    if alg == "max":
        result = "acc"
    elif alg == "avg_include_padding":
        result = f"acc / {c_float(math.prod(kernel))}"
    else:
        count = " * ".join(f"(hi{k} - lo{k})" for k in range(nsp))
        result = f"acc / (float)({count})"
    decode = "\n    ".join(lines)
    loop_code = "\n    ".join(loops + [inner, "".join(closes)])
    helpers = _dtype_io.functions(loads=(src_dtype,), stores=(dst_dtype,))
    src_param = _dtype_io.param(src_dtype, "src", const=True)
    dst_param = _dtype_io.param(dst_dtype, "dst", const=False)
    source = helpers + f"""__kernel void pooling_fwd({src_param}, {dst_param}) {{
    const ulong i = get_global_id(0);
    if (i >= {outputs}UL) return;
    {decode}
    {init}
    {loop_code}
    {_dtype_io.store(dst_dtype, "dst", "off_dst", result)}
}}
"""
    return KernelSpec(
        source=source,
        name="pooling_fwd",
        arg_names=("src", "dst"),
        global_size=(padded_global(outputs, local),),
        local_size=(local,),
        impl=f"ocl:per_output:l{local}",
    )


def reference(
    alg: str,
    src: np.ndarray,
    *,
    kernel,
    strides,
    padding_l,
    padding_r=None,
    dilation=None,
    dst_dtype: str = "f32",
) -> np.ndarray:
    """``alg`` pooling of ``src`` (N, C, spatial...; user-facing values of any data type) in
    float64, rounded to float32 and stored as ``dst_dtype``."""
    if alg not in ALGORITHMS:
        raise ValueError(f"unknown pooling algorithm {alg!r}; known: {', '.join(ALGORITHMS)}")
    x = _dtype_io.widen(src)
    nsp = x.ndim - 2

    def per_dim(value):  # an int means the same for every spatial dim, as the descriptor's
        value = (value,) if isinstance(value, int) else tuple(value)
        return value * nsp if len(value) == 1 else value

    kernel, strides, padding_l = per_dim(kernel), per_dim(strides), per_dim(padding_l)
    padding_r = padding_l if padding_r is None else per_dim(padding_r)
    dilation = (1,) * nsp if dilation is None else per_dim(dilation)
    out = tuple(
        output_extent(x.shape[2 + k], kernel[k], strides[k], padding_l[k], padding_r[k], dilation[k])
        for k in range(nsp)
    )
    pad_value = -np.inf if alg == "max" else 0.0
    # Pad generously on the right so every tap index is valid; padded taps are masked out.
    widths = [(0, 0), (0, 0)] + [
        (padding_l[k], max(0, (out[k] - 1) * strides[k] + (kernel[k] - 1) * dilation[k] + 1
                           - padding_l[k] - x.shape[2 + k]))
        for k in range(nsp)
    ]
    xp = np.pad(x, widths, constant_values=pad_value)
    valid = np.pad(np.ones(x.shape[2:], dtype=np.float64), widths[2:], constant_values=0.0)
    acc = np.full(x.shape[:2] + out, -np.inf if alg == "max" else 0.0)
    count = np.zeros(out)
    for taps in np.ndindex(*kernel):
        index = tuple(
            slice(taps[k] * dilation[k], taps[k] * dilation[k] + (out[k] - 1) * strides[k] + 1, strides[k])
            for k in range(nsp)
        )
        window = xp[(slice(None), slice(None)) + index]
        if alg == "max":
            acc = np.maximum(acc, window)
        else:
            acc = acc + window
        count = count + valid[index]
    if alg == "avg_include_padding":
        acc = acc / math.prod(kernel)
    elif alg == "avg_exclude_padding":
        acc = acc / count
    return _dtype_io.store_reference(acc.astype(np.float32), dst_dtype)


def desc_reference(desc: PoolingDesc, inputs: dict[str, np.ndarray]) -> np.ndarray:
    """dst of ``desc`` from ``{"src": array}``, stored as dst's data type."""
    return reference(
        desc.alg, inputs["src"], kernel=desc.kernel, strides=desc.strides, padding_l=desc.padding_l,
        padding_r=desc.padding_r, dilation=desc.dilation, dst_dtype=desc.dst.dtype,
    )


def desc_tolerance(desc: PoolingDesc) -> float:
    # ``tolerance`` above, which kernels/tolerance.py's ``pooling`` returns too; that module
    # imports this one, so importing it here would make a cycle.
    return tolerance(desc.alg, math.prod(desc.kernel))


register(PoolingDesc, generate=generate, reference=desc_reference, tolerance=desc_tolerance)

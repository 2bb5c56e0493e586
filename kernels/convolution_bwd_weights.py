"""Convolution backward weights: the generator of ``ConvolutionBackwardWeightsDesc`` and its
reference.

``diff_weights[oc, ic, k...] = sum_{n, o...} src[n, g * ICg + ic, o * s - pl + k * dil] *
diff_dst[n, oc, o...]``. One work-item per diff_weights element reduces over the batch and the
output positions: every element is written once, with no atomics and no second pass, which keeps
the kernel plain OpenCL C 1.2 for PoCL and NVIDIA alike. For each tap the work-item first solves
the range of output positions whose input falls inside src (``lo``/``hi`` per spatial axis), so
the inner loops carry no padding checks. Dims and strides are baked into the source.

Any storage type for each tensor (``_dtype_io``), f32 math.
"""

from __future__ import annotations

import itertools
import math

import numpy as np

from .._values._convolution_bwd_weights_desc import ConvolutionBackwardWeightsDesc
from . import _dtype_io, tolerance
from ._registry import register
from ._spec import KernelConfig, KernelSpec, padded_global


def generate(desc: ConvolutionBackwardWeightsDesc, config: KernelConfig) -> KernelSpec:
    """One work-item per diff_weights element, its last dim innermost."""
    desc.check_supported()
    ss, ds, ws = desc.src.strides, desc.diff_dst.strides, desc.diff_weights.strides
    wdims = desc.diff_weights.dims
    nsp = len(wdims) - 2
    n = desc.src.dims[0]
    isp, osp = desc.src.dims[2:], desc.diff_dst.dims[2:]
    icg, ocg = wdims[1], wdims[0] // desc.groups
    total = math.prod(wdims)
    lines = ["ulong r = gid;"]
    for d in reversed(range(len(wdims))):
        lines.append(f"const long c{d} = (long)(r % {wdims[d]}UL); r /= {wdims[d]}UL;")
    lines.append(f"const long ic = (c0 / {ocg}L) * {icg}L + c1;")
    # Per axis: the output positions o with 0 <= o * s - pl + k * dil < in.
    for i in range(nsp):
        s, pl, dil = desc.strides[i], desc.padding_l[i], desc.dilation[i]
        lines.append(f"const long t{i} = {pl}L - c{i + 2} * {dil}L, u{i} = {isp[i] - 1}L + t{i};")
        lines.append(f"const long lo{i} = t{i} > 0 ? (t{i} + {s - 1}L) / {s}L : 0L;")
        lines.append(f"const long hi{i} = u{i} < 0 ? -1L : min(u{i} / {s}L, {osp[i] - 1}L);")
    lines.append("float acc = 0.0f;")
    lines.append(f"for (long b = 0; b < {n}L; ++b) {{")
    indent = "    "
    lines.append(f"{indent}const ulong sb = (ulong)b * {ss[0]}UL + (ulong)ic * {ss[1]}UL;")
    lines.append(f"{indent}const ulong db = (ulong)b * {ds[0]}UL + (ulong)c0 * {ds[1]}UL;")
    for i in range(nsp):
        lines.append(f"{indent}for (long o{i} = lo{i}; o{i} <= hi{i}; ++o{i}) {{")
        indent += "    "
    src_off = " + ".join(["sb"] + [f"(ulong)(o{i} * {desc.strides[i]}L - t{i}) * {ss[2 + i]}UL" for i in range(nsp)])
    dst_off = " + ".join(["db"] + [f"(ulong)o{i} * {ds[2 + i]}UL" for i in range(nsp)])
    x = _dtype_io.load(desc.src.dtype, "src", src_off)
    dy = _dtype_io.load(desc.diff_dst.dtype, "diff_dst", dst_off)
    lines.append(f"{indent}acc += {x} * {dy};")
    for _ in range(nsp + 1):
        indent = indent[:-4]
        lines.append(f"{indent}}}")
    w_off = " + ".join(f"(ulong)c{d} * {ws[d]}UL" for d in range(len(wdims)))
    lines.append(_dtype_io.store(desc.diff_weights.dtype, "diff_weights", w_off, "acc"))
    params = [
        _dtype_io.param(desc.src.dtype, "src", const=True),
        _dtype_io.param(desc.diff_dst.dtype, "diff_dst", const=True),
        _dtype_io.param(desc.diff_weights.dtype, "diff_weights", const=False),
    ]
    local = config.local_size
    source = (
        _dtype_io.functions(loads=(desc.src.dtype, desc.diff_dst.dtype), stores=(desc.diff_weights.dtype,))
        + f"__kernel void convolution_bwd_weights({', '.join(params)}) {{\n"
        "    const ulong gid = get_global_id(0);\n"
        f"    if (gid >= {total}UL) return;\n"
        "    " + "\n    ".join(lines) + "\n}\n"
    )
    return KernelSpec(
        source=source,
        name="convolution_bwd_weights",
        arg_names=("src", "diff_dst", "diff_weights"),
        global_size=(padded_global(total, local),),
        local_size=(local,),
        impl=f"ocl:conv_bwd_w_direct:l{local}",
    )


def reference(src: np.ndarray, diff_dst: np.ndarray, kernel, *, strides=None, padding_l=None, dilation=None,
              groups: int = 1, diff_weights_dtype: str = "f32") -> np.ndarray:
    """Float64: for each tap, the strided window of zero-padded src against diff_dst, summed over
    the batch and the positions; ``(OC, C/groups, k...)`` stored as ``diff_weights_dtype``."""
    x = _dtype_io.widen(src)
    dy = _dtype_io.widen(diff_dst)
    nsp = x.ndim - 2
    ksz = tuple(kernel)
    s = tuple(strides or (1,) * nsp)
    pl = tuple(padding_l or (0,) * nsp)
    dil = tuple(dilation or (1,) * nsp)
    n, c = x.shape[:2]
    oc, osp = dy.shape[1], dy.shape[2:]
    icg, ocg = c // groups, oc // groups
    # Pad wide enough for every tap of every output position, on both sides.
    hi = tuple(max(0, (osp[i] - 1) * s[i] - pl[i] + (ksz[i] - 1) * dil[i] + 1 - x.shape[2 + i]) for i in range(nsp))
    xp = np.pad(x, ((0, 0), (0, 0)) + tuple((pl[i], hi[i]) for i in range(nsp)))
    xg = xp.reshape((n, groups, icg) + xp.shape[2:])
    dyg = dy.reshape((n, groups, ocg) + osp)
    w = np.zeros((groups, ocg, icg) + ksz)
    for tap in itertools.product(*(range(k) for k in ksz)):
        window = (slice(None),) * 3 + tuple(
            slice(tap[i] * dil[i], tap[i] * dil[i] + (osp[i] - 1) * s[i] + 1, s[i]) for i in range(nsp))
        w[(Ellipsis,) + tap] = np.einsum("ngcp,ngop->goc", xg[window].reshape(n, groups, icg, -1),
                                         dyg.reshape(n, groups, ocg, -1))
    return _dtype_io.store_reference(w.reshape((oc, icg) + ksz).astype(np.float32), diff_weights_dtype)


def desc_reference(desc: ConvolutionBackwardWeightsDesc, inputs: dict[str, np.ndarray]) -> np.ndarray:
    return reference(inputs["src"], inputs["diff_dst"], desc.diff_weights.dims[2:], strides=desc.strides,
                     padding_l=desc.padding_l, dilation=desc.dilation, groups=desc.groups,
                     diff_weights_dtype=desc.diff_weights.dtype)


register(
    ConvolutionBackwardWeightsDesc, generate=generate, reference=desc_reference,
    # One product per batch item and output position reaches each element.
    tolerance=lambda desc: tolerance.convolution(desc.diff_dst.dims[0] * math.prod(desc.diff_dst.dims[2:])),
)

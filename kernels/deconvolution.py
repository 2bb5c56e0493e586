"""Deconvolution (transposed convolution) forward, direct gather form: 1D/2D/3D, strides,
asymmetric padding, dilation, output padding, groups, bias.

``dst[n, oc, o...] = bias[oc] + sum_{ic in oc's group, k...} src[n, ic, i...] * weights[ic,
oc % OCg, k...]`` over the taps where ``o = i * s - pl + k * dil`` for an integer ``i`` in
``[0, in)``. Each work-item computes one output position for a block of ``OCB`` output channels
of one group from the inputs that reach it (the gather form: no atomics, every dst element
written once); for each tap it solves ``i = (o + pl - k * dil) / s``, skips taps where that is
negative, fractional or past the input, and sums over the group's input channels, each src value
loaded once for the whole channel block (register blocking, as ``convolution``'s direct kernel;
benchdnn's op/f32/deconv.json at batch 8 on PoCL, 2 busy CPU cores: 8-15 ms a run with one channel
per work-item, 1.9-3.0 ms with blocks of 8). ``OCB`` divides the group's channels, so no block
runs past them. Weights are ``(IC, OC/groups, k...)``; dims and strides of every tensor are
baked into the source.

Any storage type for each tensor (``_dtype_io``), f32 math.
"""

from __future__ import annotations

import itertools
import math

import numpy as np

from .._values._deconvolution_desc import DeconvolutionDesc, deconv_out_size
from . import _dtype_io, tolerance
from ._registry import register
from ._spec import KernelConfig, KernelSpec, padded_global

# Output channels per work-item: at most 8 on the CPU configuration, 4 on GPUs (fewer registers
# per work-item, more work-items).
OCB_CAP = {"cpu": 8, "gpu": 4}


def channel_block(config: KernelConfig, ocg: int) -> int:
    """The largest divisor of the group's ``ocg`` output channels up to the configuration's cap."""
    cap = OCB_CAP["cpu" if config.vector_width >= 16 else "gpu"]
    return max(b for b in range(1, min(cap, ocg) + 1) if ocg % b == 0)


def generate(desc: DeconvolutionDesc, config: KernelConfig) -> KernelSpec:
    """One work-item per (batch, group, channel block, output position), the position innermost."""
    desc.check_supported()
    src_strides, wei_strides, dst_strides = desc.src.strides, desc.weights.strides, desc.dst.strides
    dims = desc.dst.dims
    nsp = len(dims) - 2
    isp, ksz = desc.src.dims[2:], desc.weights.dims[2:]
    icg, ocg = desc.src.dims[1] // desc.groups, desc.weights.dims[1]
    ocb = channel_block(config, ocg)
    nblk = ocg // ocb
    # The work-items' index space: dst's dims with the channels counted in blocks.
    space = (dims[0], desc.groups * nblk) + dims[2:]
    total = math.prod(space)
    load_src = lambda off: _dtype_io.load(desc.src.dtype, "src", off)  # noqa: E731
    load_wei = lambda off: _dtype_io.load(desc.weights.dtype, "weights", off)  # noqa: E731
    lines = ["ulong r = gid;"]
    for d in reversed(range(len(space))):
        lines.append(f"const long c{d} = (long)(r % {space[d]}UL); r /= {space[d]}UL;")
    lines.append(f"const long g = c1 / {nblk}L, oc0 = (c1 % {nblk}L) * {ocb}L;")
    lines.append(f"const ulong src_base = (ulong)c0 * {src_strides[0]}UL + (ulong)(g * {icg}L) * {src_strides[1]}UL;")
    lines.append(f"const ulong wei_base = (ulong)(g * {icg}L) * {wei_strides[0]}UL + (ulong)oc0 * {wei_strides[1]}UL;")
    lines.append(" ".join(f"float acc{j} = 0.0f;" for j in range(ocb)))
    indent = ""
    for i in range(nsp):
        s, pl, dil = desc.strides[i], desc.padding_l[i], desc.dilation[i]
        lines.append(f"{indent}for (long k{i} = 0; k{i} < {ksz[i]}L; ++k{i}) {{")
        indent += "    "
        lines.append(f"{indent}const long t{i} = c{i + 2} + {pl}L - k{i} * {dil}L;")
        # A tap reaches this output from input t / s only where the stride divides t.
        lines.append(f"{indent}if (t{i} < 0 || t{i} % {s}L != 0 || t{i} / {s}L >= {isp[i]}L) continue;")
    src_off = " + ".join(["src_base"] + [f"(ulong)(t{i} / {desc.strides[i]}L) * {src_strides[2 + i]}UL"
                                         for i in range(nsp)])
    wei_off = " + ".join(["wei_base"] + [f"(ulong)k{i} * {wei_strides[2 + i]}UL" for i in range(nsp)])
    lines.append(f"{indent}const ulong so = {src_off}, wo = {wei_off};")
    lines.append(f"{indent}for (ulong ic = 0; ic < {icg}UL; ++ic) {{")
    lines.append(f"{indent}    const float x = {load_src(f'so + ic * {src_strides[1]}UL')};")
    lines.append(f"{indent}    const ulong wi = wo + ic * {wei_strides[0]}UL;")
    for j in range(ocb):
        lines.append(f"{indent}    acc{j} += x * {load_wei(f'wi + {j * wei_strides[1]}UL')};")
    lines.append(f"{indent}}}")
    for _ in range(nsp):
        indent = indent[:-4]
        lines.append(f"{indent}}}")
    dtypes = [desc.src.dtype, desc.weights.dtype]
    params = [_dtype_io.param(desc.src.dtype, "src", const=True), _dtype_io.param(desc.weights.dtype, "weights", const=True)]
    arg_names = ["src", "weights"]
    lines.append(f"const long oc = g * {ocg}L + oc0;")
    if desc.bias is not None:
        dtypes.append(desc.bias.dtype)
        params.append(_dtype_io.param(desc.bias.dtype, "bias", const=True))
        arg_names.append("bias")
        for j in range(ocb):
            bias = _dtype_io.load(desc.bias.dtype, "bias", f"(ulong)(oc + {j}L) * {desc.bias.strides[0]}UL")
            lines.append(f"acc{j} += {bias};")
    params.append(_dtype_io.param(desc.dst.dtype, "dst", const=False))
    arg_names.append("dst")
    dst_base = " + ".join([f"(ulong)c0 * {dst_strides[0]}UL", f"(ulong)oc * {dst_strides[1]}UL"]
                          + [f"(ulong)c{d} * {dst_strides[d]}UL" for d in range(2, len(dims))])
    lines.append(f"const ulong dst_base = {dst_base};")
    for j in range(ocb):
        lines.append(_dtype_io.store(desc.dst.dtype, "dst", f"dst_base + {j * dst_strides[1]}UL", f"acc{j}"))
    local = config.local_size
    source = (
        _dtype_io.functions(loads=dtypes, stores=(desc.dst.dtype,))
        + f"__kernel void deconvolution_fwd({', '.join(params)}) {{\n"
        "    const ulong gid = get_global_id(0);\n"
        f"    if (gid >= {total}UL) return;\n"
        "    " + "\n    ".join(lines) + "\n}\n"
    )
    return KernelSpec(
        source=source,
        name="deconvolution_fwd",
        arg_names=tuple(arg_names),
        global_size=(padded_global(total, local),),
        local_size=(local,),
        impl=f"ocl:deconv_gather:b{ocb}l{local}",
    )


def reference(src: np.ndarray, weights: np.ndarray, bias: np.ndarray | None = None, *, strides=None,
              padding_l=None, padding_r=None, dilation=None, groups: int = 1, output_padding=None,
              dst_dtype: str = "f32") -> np.ndarray:
    """The scatter form in float64: each input element times each tap added at ``i * s - pl +
    k * dil``, on a canvas wide enough for every tap and for dst, then dst's window of it;
    bias added; stored as ``dst_dtype``. Weights ``(IC, OC/groups, k...)``."""
    x = _dtype_io.widen(src)
    w = _dtype_io.widen(weights)
    nsp = x.ndim - 2
    s = tuple(strides or (1,) * nsp)
    pl = tuple(padding_l or (0,) * nsp)
    pr = tuple(padding_r or pl)
    dil = tuple(dilation or (1,) * nsp)
    op = tuple(output_padding or (0,) * nsp)
    n, ic = x.shape[:2]
    ocg, ksz, isp = w.shape[1], w.shape[2:], x.shape[2:]
    icg = ic // groups
    osp = tuple(deconv_out_size(isp[i], ksz[i], s[i], pl[i], pr[i], dil[i], op[i]) for i in range(nsp))
    canvas = tuple(max((isp[i] - 1) * s[i] + (ksz[i] - 1) * dil[i] + 1, pl[i] + osp[i]) for i in range(nsp))
    y = np.zeros((n, groups, ocg) + canvas)
    xg = x.reshape((n, groups, icg) + isp)
    wg = w.reshape((groups, icg, ocg) + tuple(ksz))
    for tap in itertools.product(*(range(k) for k in ksz)):
        window = (slice(None),) * 3 + tuple(
            slice(tap[i] * dil[i], tap[i] * dil[i] + (isp[i] - 1) * s[i] + 1, s[i]) for i in range(nsp)
        )
        y[window] += np.einsum("ngc...,gco->ngo...", xg, wg[(Ellipsis,) + tap])
    y = y.reshape((n, groups * ocg) + canvas)[(slice(None), slice(None)) + tuple(
        slice(pl[i], pl[i] + osp[i]) for i in range(nsp))]
    if bias is not None:
        y = y + _dtype_io.widen(bias).reshape((1, groups * ocg) + (1,) * nsp)
    return _dtype_io.store_reference(y.astype(np.float32), dst_dtype)


def desc_reference(desc: DeconvolutionDesc, inputs: dict[str, np.ndarray]) -> np.ndarray:
    return reference(
        inputs["src"], inputs["weights"], inputs.get("bias"), strides=desc.strides, padding_l=desc.padding_l,
        padding_r=desc.padding_r, dilation=desc.dilation, groups=desc.groups, output_padding=desc.output_padding,
        dst_dtype=desc.dst.dtype,
    )


register(
    DeconvolutionDesc, generate=generate, reference=desc_reference,
    # At most IC/groups x kernel-size products reach one element, as in a convolution.
    tolerance=lambda desc: tolerance.convolution((desc.src.dims[1] // desc.groups) * math.prod(desc.weights.dims[2:])),
)

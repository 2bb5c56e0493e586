"""Convolution forward, direct: 1D/2D/3D, strides, asymmetric padding, dilation, groups, bias.

``dst[n, oc, o...] = bias[oc] + sum_{ic in group, k...} src[n, g*ICg + ic, o*s - pl + k*dil] *
weights[oc, ic, k...]`` where ``g = oc // OCg`` and out-of-range src positions (the padding) read
as zero. Weights are ``(OC, IC/groups, k...)``; every tensor takes any strides (NCHW and NHWC
are both just strides), which are baked into the source as constants.

Each work-item computes one output position for a block of ``OCB`` output channels of one group,
keeping the accumulators in registers (register blocking, no local memory: on PoCL's CPU device
that is the faster choice). It walks (ic, kernel window) once, loading each src value once and
reusing it for the whole channel block; window positions falling into the padding are skipped by
bounds checks. A block that runs past the group's channels (OCg not a multiple of OCB) takes a
path that checks each channel.

Geometry: dim 0 = output positions (flattened), dim 1 = (group, channel block), dim 2 = batch.

On the CPU (16-wide vectors), when src is contiguous along the innermost spatial axis, that axis has
stride 1 and at least 16 outputs, ``_row_vector`` takes over instead: 16 outputs along that axis as
one float16 per channel (ResNet-50 conv2_x 3x3 on PoCL, 2 cores: 20 -> 140 GFLOP/s; depthwise 3x3
2.5 -> 11.5). The per-position kernel above stays for every other case and for GPUs.

Both paths apply a post-op chain (see ``_post_ops``) to ``acc + bias`` before the store: per
element on the per-position path, on the float16 of 16 outputs on the row-vector path. Binary
operands broadcast to dst (e.g. ``(1, OC, 1, 1)`` per channel) and are extra kernel arguments
between bias and dst.

``src``, ``weights``, ``bias`` and ``dst`` each have any storage type of ``_dtype_io.DTYPES`` (f32
math, as oneDNN's bf16/f16 convolutions accumulate in f32): both paths convert each element to
float as they load it, keeping their register blocking, and convert to dst's type as they store.
Binary post-op operands are f32. The all-f32 kernels are the plain ones.
"""

from __future__ import annotations

import math

import attrs
import numpy as np

from .._values._convolution_desc import ConvolutionDesc
from .._values._convolution_desc import out_size as out_size
from .._values._matmul_desc import MatmulDesc
from .._values._memory_desc import MemoryDesc
from . import _dtype_io, _post_ops, convolution_cpu, convolution_gemm, matmul, tolerance
from ._post_ops import generate_scaled
from ._quantized_io import centered, quantized_value
from ._registry import register
from ._spec import KernelConfig, KernelSpec, c_float, padded_global


def channel_block(config: KernelConfig, ocg: int, positions_contiguous: bool = True) -> int:
    """Output channels per work-item: up to 16 on the CPU (vector) configuration, 4 on GPUs.
    PoCL runs a work-group of 16 as float16 lanes, so each channel's accumulator is a float16:
    where that takes two registers (AVX2), NARROW_CHANNELS, unless neighbouring positions are
    not neighbours in src (NHWC), where each src gather is dear and serves more channels.
    Measured on PoCL (2-core AMD EPYC, AVX2; ResNet-50 layers, batch 1, ms, 16 -> 6 channels):
    NCHW res4 1x1 26.6 -> 6.1, res5 3x3 22.7 -> 11.9; NHWC res2 3x3 6.6 -> 15.3, res5 3x3
    16.3 -> 33.2."""
    narrow = config.native_vector_width < 16 and positions_contiguous
    cap = (NARROW_CHANNELS if narrow else 16) if config.vector_width >= 16 else 4
    return max(1, min(cap, ocg))


def generate(desc: ConvolutionDesc, config: KernelConfig) -> KernelSpec:
    """The kernel of ``desc`` for ``config``; ``output_scale`` reaches ``_direct`` as a leading
    ``linear`` post-op (``_post_ops.generate_scaled``)."""
    desc.check_supported()
    if config.vector_width >= 16:
        spec = pointwise_as_matmul(desc, config)
        if spec is not None:
            return spec
        if convolution_cpu.depthwise_rows_applies(desc, config):
            return generate_scaled(lambda chain: convolution_cpu.depthwise_rows(desc, chain, config),
                                   desc.post_ops, desc.output_scale)
        if convolution_cpu.applies(desc, config):
            return generate_scaled(lambda chain: convolution_cpu.blocked(desc, chain, config),
                                   desc.post_ops, desc.output_scale)
    if convolution_gemm.applies(desc, config):
        return generate_scaled(lambda chain: convolution_gemm.implicit_gemm(desc, chain, config),
                               desc.post_ops, desc.output_scale)
    return generate_scaled(lambda chain: _direct(desc, chain, config), desc.post_ops, desc.output_scale)


def _rows_view(md: MemoryDesc) -> MemoryDesc | None:
    """``md`` (N, C, spatial…) seen as (N, P, C), P the positions flattened, or None where the
    spatial dims do not flatten into one stride (a broadcast one, stride 0 everywhere, does)."""
    dims, strides = md.dims, md.strides
    sp = [(d, st) for d, st in zip(dims[2:], strides[2:]) if d > 1]
    positions = math.prod(dims[2:])
    if not sp:
        step = 0
    else:
        step = sp[-1][1]
        for (_, outer), (inner_dim, inner) in zip(sp, sp[1:]):
            if outer != inner * inner_dim:
                return None
    return MemoryDesc((dims[0], positions, dims[1]), md.dtype, (strides[0], step, strides[1]))


def pointwise_as_matmul(desc: ConvolutionDesc, config: KernelConfig) -> KernelSpec | None:
    """A 1x1 convolution at stride 1 without padding or groups is a matmul per image: (positions
    x IC) by (IC x OC). On the CPU configuration it takes ``matmul``'s register-blocked kernel
    (the weights copied once per panel, src broadcast per row) in any layout where the positions
    flatten, with bias, post-ops and the output scale as the matmul's; None where it does not
    apply. Measured on PoCL (2-core AMD EPYC, AVX2; ``bench_sweep.py --engine cpu:0 --family
    conv``) against the per-position direct kernel: see BENCHMARKS.md §13."""
    if (desc.groups != 1 or any(k != 1 for k in desc.weights.dims[2:]) or any(s != 1 for s in desc.strides)
            or any(desc.padding_l) or any(desc.padding_r)
            or desc.src_quant is not None or desc.weights_quant is not None or desc.dst_quant is not None):
        return None
    src, dst = _rows_view(desc.src), _rows_view(desc.dst)
    if src is None or dst is None:
        return None
    w = desc.weights
    weights = MemoryDesc((w.dims[1], w.dims[0]), w.dtype, (w.strides[1], w.strides[0]))
    post_ops = []
    for op in desc.post_ops:
        if op[0] == "binary":
            pad = len(desc.dst.dims) - op[2].ndims
            full = attrs.evolve(op[2], dims=(1,) * pad + op[2].dims, strides=(0,) * pad + op[2].strides)
            # Positions are one axis of the matmul: an operand spans all of them or none.
            if full.dims[2:] != desc.dst.dims[2:] and any(d != 1 for d in full.dims[2:]):
                return None
            operand = _rows_view(full)
            if operand is None:
                return None
            op = (op[0], op[1], operand, *op[3:])
        post_ops.append(op)
    matmul_desc = MatmulDesc(src, weights, dst, desc.bias, post_ops=tuple(post_ops), output_scale=desc.output_scale)
    spec = matmul.generate(matmul_desc, config)
    return attrs.evolve(spec, impl="ocl:pointwise_matmul:" + spec.impl.removeprefix("ocl:"))


def _direct(desc: ConvolutionDesc, post_ops: tuple, config: KernelConfig) -> KernelSpec:
    """``post_ops``: the validated chain (the output scale leading), applied to ``acc + bias``
    before the store. Any storage types (``_dtype_io.DTYPES``), the math f32 either way."""
    src_dims, src_strides = desc.src.dims, desc.src.strides
    wei_dims, wei_strides = desc.weights.dims, desc.weights.strides
    dst_dims, dst_strides = desc.dst.dims, desc.dst.strides
    bias_strides = None if desc.bias is None else desc.bias.strides
    strides, padding_l, dilation, groups = desc.strides, desc.padding_l, desc.dilation, desc.groups
    dtypes = {"src": desc.src.dtype, "weights": desc.weights.dtype,
              "bias": "f32" if desc.bias is None else desc.bias.dtype, "dst": desc.dst.dtype}
    src_dtype, wei_dtype, bias_dtype, dst_dtype = dtypes.values()
    nsp = len(src_dims) - 2
    n = src_dims[0]
    oc = wei_dims[0]
    icg = wei_dims[1]
    ksz = tuple(wei_dims[2:])
    isp = tuple(src_dims[2:])
    osp = tuple(dst_dims[2:])
    ocg = oc // groups
    ocb = channel_block(config, ocg, positions_contiguous=src_strides[-1] == 1)
    nblk = math.ceil(ocg / ocb)
    npos = math.prod(osp)
    has_bias = bias_strides is not None
    bias_step = bias_strides[0] if bias_strides is not None else 0  # read only with a bias
    ss, ws, ds = src_strides, wei_strides, dst_strides
    axes = "dhw"[3 - nsp:]  # names of the spatial axes, outermost first
    po_strides = _post_ops.operand_strides(post_ops, len(dst_dims))
    po_params = _post_ops.params(post_ops)
    args = ("src", "weights") + (("bias",) if has_bias else ()) + tuple(po_strides) + ("dst",)
    quant = _Quant(desc)

    # Output position from the linear id, innermost axis first (divisions by constants).
    pos = ["long r = (long)p;"]
    for i in reversed(range(nsp)):
        pos.append(f"const long o{axes[i]} = r % {osp[i]}L; r /= {osp[i]}L;")
    pos_code = "\n    ".join(pos)
    dst_sp = " + ".join(f"o{axes[i]} * {ds[2 + i]}L" for i in range(nsp))

    def window(check_oc: bool) -> str:
        # Nested loops over the kernel window with constant bounds; each level skips positions
        # that fall into the padding. Innermost: one src load, OCB multiply-adds.
        lines = []
        indent = " " * 12
        for i, a in enumerate(axes):
            lines.append(f"{indent}for (long k{a} = 0; k{a} < {ksz[i]}L; ++k{a}) {{")
            indent += "    "
            lines.append(f"{indent}const long i{a} = o{a} * {strides[i]}L - {padding_l[i]}L + k{a} * {dilation[i]}L;")
            lines.append(f"{indent}if (i{a} < 0 || i{a} >= {isp[i]}L) continue;")
        src_off = " + ".join(f"i{a} * {ss[2 + i]}L" for i, a in enumerate(axes))
        wei_off = " + ".join(f"k{a} * {ws[2 + i]}L" for i, a in enumerate(axes))
        lines.append(f"{indent}const float x = {quant.src(_dtype_io.load(src_dtype, 'src_c', src_off))};")
        lines.append(f"{indent}const long wk = {wei_off};")
        for j in range(ocb):
            guard = f"if (oc0 + {j} < {ocg}L) " if check_oc and j else ""
            w = quant.weights(_dtype_io.load(wei_dtype, "wei_c", f"{j * ws[0]}L + wk"))
            lines.append(f"{indent}{guard}acc{j} += x * {w};")
        for _ in axes:
            indent = indent[:-4]
            lines.append(f"{indent}}}")
        return "\n".join(lines)

    def block(check_oc: bool) -> str:
        accs = " ".join(f"float acc{j} = 0.0f;" for j in range(ocb))
        stores = []
        for j in range(ocb):
            guard = f"if (oc0 + {j} < {ocg}L) " if check_oc and j else ""
            bias = f" + {_dtype_io.load(bias_dtype, 'bias', f'(gc + {j}) * {bias_step}L')}" if has_bias else ""
            od = f"off_d + (gc + {j}) * {ds[1]}L"
            chain = _dtype_io.apply_post_ops_scalar(post_ops, "v", od, {
                name: f"off_{name} + (gc + {j}) * {s[1]}L" for name, s in po_strides.items()
            }, dst_dtype)
            store = quant.store(dst_dtype, "dst", od, "v")
            stores.append(f"        {guard}{{ float v = acc{j}{quant.scaled()}{bias}; {chain} {store} }}")
        return f"""
        {accs}
        for (long ic = 0; ic < {icg}L; ++ic) {{
            __global const {_dtype_io.STORAGE[src_dtype]}* src_c = src + off_s + (g * {icg}L + ic) * {ss[1]}L;
            __global const {_dtype_io.STORAGE[wei_dtype]}* wei_c = wei + gc * {ws[0]}L + ic * {ws[1]}L;
{window(check_oc)}
        }}
{chr(10).join(stores)}"""

    edge = ocg % ocb != 0
    if edge:
        body = f"""    if (oc0 + {ocb}L <= {ocg}L) {{{block(False)}
    }} else {{{block(True)}
    }}"""
    else:
        body = f"    {{{block(False)}\n    }}"

    bias_param = f" {_dtype_io.param(bias_dtype, 'bias', const=True)}," if has_bias else ""
    loads = (src_dtype, wei_dtype, dst_dtype) + ((bias_dtype,) if has_bias else ())
    helpers = _dtype_io.functions(loads=loads, stores=(dst_dtype,))
    src_param = _dtype_io.param(src_dtype, "src", const=True)
    wei_param = _dtype_io.param(wei_dtype, "wei", const=True)
    dst_param = _dtype_io.param(dst_dtype, "dst", const=False)
    if config.vector_width >= 16 and ss[-1] == 1 and strides[-1] == 1 and osp[-1] >= ROW_VECTOR:
        return _row_vector(
            nsp=nsp, n=n, icg=icg, ocg=ocg, groups=groups, ksz=ksz, isp=isp, osp=osp, ss=ss, ws=ws, ds=ds,
            bias_strides=bias_strides, strides=strides, padding_l=padding_l, dilation=dilation,
            bias_param=bias_param + po_params, config=config, post_ops=post_ops, po_strides=po_strides,
            args=args, dtypes=dtypes, helpers=helpers, params=(src_param, wei_param, dst_param), quant=quant,
        )
    # Channels fastest where they are contiguous in src and dst (NHWC) on the GPU configuration:
    # neighbouring work-items then read neighbouring channels of one pixel. Positions fastest
    # there made each warp's loads C floats apart: the depthwise rows of BENCHMARKS.md §13 ran at
    # 0.09-0.2x cuDNN in NHWC.
    channels_fast = config.vector_width == 1 and ss[1] == 1 and ds[1] == 1 and groups * nblk >= 8
    if channels_fast:
        local_c = min(config.local_size, 1 << (groups * nblk - 1).bit_length())
        local_p = max(1, min(config.local_size // local_c, npos))
        ids = "p = get_global_id(1), gb = get_global_id(0)"
        global_size = (padded_global(groups * nblk, local_c), padded_global(npos, local_p), n)
        local_size, local_name = (local_c, local_p, 1), f"c{local_c}x{local_p}"
    else:
        local = max(1, min(config.local_size, npos))
        ids = "p = get_global_id(0), gb = get_global_id(1)"
        global_size, local_size, local_name = (padded_global(npos, local), groups * nblk, n), (local, 1, 1), f"{local}"
    po_offsets = "".join(
        f"\n    const long off_{name} = (long)b * {s[0]}L"
        + "".join(f" + o{axes[i]} * {s[2 + i]}L" for i in range(nsp) if s[2 + i])
        + ";"
        for name, s in po_strides.items()
    )
    source = helpers + _post_ops.functions(post_ops)
    source += f"""__kernel void convolution_fwd({src_param}, {wei_param},{bias_param}{po_params}
                              {dst_param}) {{
    const ulong {ids}, b = get_global_id(2);
    if (p >= {npos}UL || gb >= {groups * nblk}UL || b >= {n}UL) return;
    const long g = (long)(gb / {nblk}UL);
    const long oc0 = (long)(gb % {nblk}UL) * {ocb}L;   /* first output channel, within the group */
    const long gc = g * {ocg}L + oc0;                    /* first output channel, overall */
    {pos_code}
    const long off_s = (long)b * {ss[0]}L;
    const long off_d = (long)b * {ds[0]}L + {dst_sp};{po_offsets}
{body}
}}
"""
    return KernelSpec(
        source=source,
        name="convolution_fwd",
        arg_names=args,
        global_size=global_size,
        local_size=local_size,
        impl=f"ocl:direct:oc{ocb}:l{local_name}",
    )


ROW_VECTOR = 16  # output positions along the innermost axis per work-item, one float16 lane each
ROWS_TIMES_CHANNELS = 8  # rows x channels per work-item on the row-vector path: few channels take more rows
# Channels (x rows) of float16 accumulators per work-item where a float16 takes two registers
# (AVX2's 16): 12 registers, as the matmul's 6 x 16 block.
NARROW_CHANNELS = 6


def _row_vector(*, nsp, n, icg, ocg, groups, ksz, isp, osp, ss, ws, ds, bias_strides, strides, padding_l,
                dilation, bias_param, config, post_ops, po_strides, args, dtypes, helpers, params, quant) -> KernelSpec:
    """CPU path: 16 consecutive output positions along the innermost axis as one float16 per channel.

    Needs src contiguous along that axis and stride 1 there, so each window tap is 16 contiguous src
    values (scalar loads that LLVM merges into one unaligned vector load) times one scalar weight
    per output channel (a broadcast FMA operand): OCB float16 accumulators, one vector load per tap.
    Outer-axis padding is uniform over the work-item (the tap is skipped); innermost padding is
    decided per work-item and tap: taps whose 16 lanes are all inside load plainly, the others
    select per lane. The last block is shifted left to end at the row's end (no partial vectors)
    and stores only the lanes the previous block did not.

    Post-ops run on each float16 before its store; sum reads the 16 old dst values (in a shifted
    last block, lanes the previous block may have written already: they are not stored).
    A binary operand is gathered lane by lane, or broadcast from one value where it does not vary
    along the innermost axis (a per-channel operand).
    """
    tw = ROW_VECTOR
    narrow = config.native_vector_width < 16
    ocb = max(1, min(NARROW_CHANNELS if narrow else 16, ocg))
    nblk = math.ceil(ocg / ocb)
    ow, iw, kw_n = osp[-1], isp[-1], ksz[-1]
    pw, dw = padding_l[-1], dilation[-1]
    nwb = math.ceil(ow / tw)
    th = max(1, min((NARROW_CHANNELS if narrow else ROWS_TIMES_CHANNELS) // ocb, osp[-2])) if nsp >= 2 else 1
    nhb = math.ceil(osp[-2] / th) if nsp >= 2 else 1
    outer = osp[:-2] + ((nhb,) if nsp >= 2 else ())
    nwork = math.prod(outer) * nwb
    has_bias = bias_strides is not None
    axes = "dhw"[3 - nsp:]
    oa = axes[:-1]
    pos = ["long r = (long)p;", f"const long wb = r % {nwb}L; r /= {nwb}L;"]
    for i in reversed(range(nsp - 1)):
        if i == nsp - 2:  # rows come in blocks of th; the last block shifted up to end at the last row
            pos.append(f"const long hs0 = (r % {nhb}L) * {th}L; r /= {nhb}L;")
            pos.append(f"const long o{oa[i]} = hs0 < {osp[i] - th}L ? hs0 : {osp[i] - th}L;")
        else:
            pos.append(f"const long o{oa[i]} = r % {osp[i]}L; r /= {osp[i]}L;")
    pos.append(f"const long ws0 = wb * {tw}L;")
    pos.append(f"const long ow0 = ws0 < {ow - tw}L ? ws0 : {ow - tw}L;")
    for k in range(kw_n):
        pos.append(f"const long b{k} = ow0 - {pw}L + {k * dw}L;")
        pos.append(f"const int full{k} = b{k} >= 0 && b{k} + {tw - 1}L < {iw}L;")
    pos_code = "\n    ".join(pos)
    dst_outer = "".join(f" + o{oa[i]} * {ds[2 + i]}L" for i in range(nsp - 1))
    po_offsets = "".join(
        f"\n    const long off_{name} = (long)b * {s[0]}L"
        + "".join(f" + o{oa[i]} * {s[2 + i]}L" for i in range(nsp - 1) if s[2 + i])
        + (f" + ow0 * {s[-1]}L" if s[-1] else "")
        + ";"
        for name, s in po_strides.items()
    )

    src_dtype, wei_dtype, bias_dtype, dst_dtype = (dtypes[k] for k in ("src", "weights", "bias", "dst"))

    def lanes(pointer: str, stride: int, dtype: str = "f32") -> str:
        if stride == 0:
            return f"((float16)({pointer}[0]))"
        return "((float16)(" + ", ".join(_dtype_io.load(dtype, pointer, f"{t * stride}L") for t in range(tw)) + "))"

    def taps(check_oc: bool, rr: int) -> str:
        lines = []
        indent = " " * 12
        for i, a in enumerate(oa):
            lines.append(f"{indent}for (long k{a} = 0; k{a} < {ksz[i]}L; ++k{a}) {{")
            indent += "    "
            o = f"(o{a} + {rr}L)" if i == nsp - 2 else f"o{a}"
            lines.append(f"{indent}const long i{a} = {o} * {strides[i]}L - {padding_l[i]}L + k{a} * {dilation[i]}L;")
            lines.append(f"{indent}if (i{a} < 0 || i{a} >= {isp[i]}L) continue;")
        src_off = "".join(f" + i{a} * {ss[2 + i]}L" for i, a in enumerate(oa))
        wei_off = "".join(f" + k{a} * {ws[2 + i]}L" for i, a in enumerate(oa))
        lines.append(f"{indent}__global const {_dtype_io.STORAGE[src_dtype]}* row = src_c{src_off} + ow0 - {pw}L;")
        lines.append(f"{indent}__global const {_dtype_io.STORAGE[wei_dtype]}* wrow = wei_c{wei_off};")
        for k in range(kw_n):
            plain = ", ".join(quant.src(_dtype_io.load(src_dtype, "row", f"{k * dw + t}")) for t in range(tw))
            sel = ", ".join(
                f"((ulong)(b{k} + {t}L) < {iw}UL ? {quant.src(_dtype_io.load(src_dtype, 'row', f'{k * dw + t}'))} : 0.0f)"
                for t in range(tw)
            )
            lines.append(f"{indent}{{")
            lines.append(f"{indent}    float16 x;")
            lines.append(f"{indent}    if (full{k}) x = (float16)({plain});")
            lines.append(f"{indent}    else x = (float16)({sel});")
            for j in range(ocb):
                w = quant.weights(_dtype_io.load(wei_dtype, "wrow", f"{j * ws[0] + k * ws[-1]}L"))
                if check_oc and j:
                    w = f"(oc0 + {j} < {ocg}L ? {w} : 0.0f)"
                lines.append(f"{indent}    acc{j}_{rr} += x * {w};")
            lines.append(f"{indent}}}")
        for _ in oa:
            indent = indent[:-4]
            lines.append(f"{indent}}}")
        return "\n".join(lines)

    def block(check_oc: bool) -> str:
        accs = " ".join(f"float16 acc{j}_{rr} = (float16)(0.0f);" for j in range(ocb) for rr in range(th))
        stores = []
        for j, rr in ((j, rr) for j in range(ocb) for rr in range(th)):
            conds = ([f"oc0 + {j} < {ocg}L"] if check_oc and j else []) + ([f"o{oa[-1]} + {rr}L >= hs0"] if th > 1 else [])
            guard = f"if ({' && '.join(conds)}) " if conds else ""
            bias = f" + {_dtype_io.load(bias_dtype, 'bias', f'(gc + {j}) * {bias_strides[0]}L')}" if has_bias else ""
            base = f"off_d + (gc + {j}) * {ds[1]}L" + (f" + {rr * ds[-2]}L" if rr else "")
            plain = " ".join(quant.store(dst_dtype, "d", f"{t * ds[-1]}L", f"v.s{t:x}") for t in range(tw))
            part = " ".join(
                f"if (ow0 + {t}L >= ws0) {quant.store(dst_dtype, 'd', f'{t * ds[-1]}L', f'v.s{t:x}')}" for t in range(tw)
            )
            operands = "".join(
                f" __global const float* q_{name} = {name} + off_{name} + (gc + {j}) * {s[1]}L"
                + (f" + {rr * s[-2]}L" if rr and nsp >= 2 else "") + ";"
                for name, s in po_strides.items()
            )
            chain = _post_ops.apply(
                post_ops, "v", "float16", lanes("d", ds[-1], dst_dtype),
                lambda name: lanes(f"q_{name}", po_strides[name][-1]),
            )
            chain = f"\n            {operands.strip()} {chain}" if post_ops else ""
            stores.append(
                f"        {guard}{{ __global {_dtype_io.STORAGE[dst_dtype]}* d = dst + {base}; "
                f"float16 v = acc{j}_{rr}{quant.scaled('float16')}{bias};{chain}\n"
                f"            if (ow0 == ws0) {{ {plain} }}\n"
                f"            else {{ {part} }} }}"
            )
        return f"""
        {accs}
        for (long ic = 0; ic < {icg}L; ++ic) {{
            __global const {_dtype_io.STORAGE[src_dtype]}* src_c = src + off_s + (g * {icg}L + ic) * {ss[1]}L;
            __global const {_dtype_io.STORAGE[wei_dtype]}* wei_c = wei + gc * {ws[0]}L + ic * {ws[1]}L;
{chr(10).join(taps(check_oc, rr) for rr in range(th))}
        }}
{chr(10).join(stores)}"""

    if ocg % ocb:
        body = f"""    if (oc0 + {ocb}L <= {ocg}L) {{{block(False)}
    }} else {{{block(True)}
    }}"""
    else:
        body = f"    {{{block(False)}\n    }}"
    local = max(1, min(config.local_size, nwork))
    src_param, wei_param, dst_param = params
    source = helpers + _post_ops.functions(post_ops, ("float16",))
    source += f"""__kernel void convolution_fwd({src_param}, {wei_param},{bias_param}
                              {dst_param}) {{
    const ulong p = get_global_id(0), gb = get_global_id(1), b = get_global_id(2);
    if (p >= {nwork}UL || gb >= {groups * nblk}UL || b >= {n}UL) return;
    const long g = (long)(gb / {nblk}UL);
    const long oc0 = (long)(gb % {nblk}UL) * {ocb}L;
    const long gc = g * {ocg}L + oc0;
    {pos_code}
    const long off_s = (long)b * {ss[0]}L;
    const long off_d = (long)b * {ds[0]}L{dst_outer} + ow0 * {ds[-1]}L;{po_offsets}
{body}
}}
"""
    return KernelSpec(
        source=source,
        name="convolution_fwd",
        arg_names=args,
        global_size=(padded_global(nwork, local), groups * nblk, n),
        local_size=(local, 1, 1),
        impl=f"ocl:direct:row{tw}:oc{ocb}:h{th}:l{local}",
    )


class _Quant:
    """The int8 convolution's pieces of source (``ConvolutionDesc``'s ``*_quant``; nothing for a
    float convolution): loads less their zero points, the sum times the two scales, a quantized
    store."""

    def __init__(self, desc: ConvolutionDesc) -> None:
        self.desc = desc

    def src(self, expr: str) -> str:
        return centered(self.desc.src_quant, expr)

    def weights(self, expr: str) -> str:
        return centered(self.desc.weights_quant, expr)

    def scaled(self, vector_type: str = "float") -> str:
        if self.desc.src_quant is None and self.desc.weights_quant is None:
            return ""
        return f" * ({vector_type})({c_float(self.desc.quant_scale)})"

    def store(self, dtype: str, pointer: str, offset: str, value: str) -> str:
        quant = self.desc.dst_quant
        return _dtype_io.store(dtype, pointer, offset, value if quant is None else quantized_value(quant, value))


def reference(
    src: np.ndarray,
    weights: np.ndarray,
    bias: np.ndarray | None = None,
    *,
    strides=None,
    padding_l=None,
    padding_r=None,
    dilation=None,
    groups: int = 1,
    output_scale: float = 1.0,
    post_ops: tuple = (),
    old_dst: np.ndarray | None = None,
    operands=None,
    dst_dtype: str = "f32",
    sum_scale: float | None = None,
) -> np.ndarray:
    """The convolution in float64 (returned as float32): one einsum per kernel offset.

    ``src``, ``weights`` and ``bias`` hold user-facing values of any data type (bf16 as float32);
    the result is stored as ``dst_dtype`` (``_dtype_io.store_reference``).

    ``weights`` is (OC, IC/groups, k...); ``dilation`` is a plain factor (1 = none). The result
    times ``output_scale``, then ``post_ops``, follow as ``_post_ops.scaled_reference`` (``old_dst``
    for sum post-ops, ``operands`` for binary ones).
    """
    x = _dtype_io.widen(src)
    w = _dtype_io.widen(weights)
    nsp = x.ndim - 2
    s = tuple(strides or (1,) * nsp)
    pl = tuple(padding_l or (0,) * nsp)
    pr = tuple(padding_r or pl)
    dil = tuple(dilation or (1,) * nsp)
    n, c = x.shape[:2]
    oc, icg = w.shape[:2]
    ksz = w.shape[2:]
    osp = tuple(out_size(x.shape[2 + i], ksz[i], s[i], pl[i], pr[i], dil[i]) for i in range(nsp))
    xp = np.pad(x, [(0, 0), (0, 0)] + [(pl[i], pr[i]) for i in range(nsp)])
    xp = xp.reshape((n, groups, icg) + xp.shape[2:])
    wg = w.reshape((groups, oc // groups, icg) + tuple(ksz))
    y = np.zeros((n, groups, oc // groups) + osp)
    for koff in np.ndindex(*ksz):
        window = (slice(None),) * 3 + tuple(
            slice(koff[i] * dil[i], koff[i] * dil[i] + (osp[i] - 1) * s[i] + 1, s[i]) for i in range(nsp)
        )
        y += np.einsum("ngc...,goc->ngo...", xp[window], wg[(Ellipsis,) + koff])
    y = y.reshape((n, oc) + osp)
    if sum_scale is not None:  # an int8 convolution: the exact sum of integers times the scales, in f32
        y = (y.astype(np.float32) * np.float32(sum_scale)).astype(np.float64)
    if bias is not None:
        y = y + _dtype_io.widen(bias).reshape((1, oc) + (1,) * nsp)
    y = _post_ops.scaled_reference(post_ops, y.astype(np.float32), old_dst, operands, output_scale=output_scale)
    return _dtype_io.store_reference(y, dst_dtype)


def desc_reference(desc: ConvolutionDesc, inputs: dict[str, np.ndarray]) -> np.ndarray:
    """dst of ``desc`` from ``{argument name: array}`` (``inputs["dst"]``, dst's old value, for a
    sum post-op; the binary operands by argument name): ``reference`` with the descriptor's
    geometry, output scale, post-ops and dst data type."""
    def centered_values(x, quant):
        return x if quant is None else np.asarray(x, np.float64) - quant.zp

    quantized = desc.src_quant is not None or desc.weights_quant is not None
    y = reference(
        centered_values(inputs["src"], desc.src_quant), centered_values(inputs["weights"], desc.weights_quant),
        inputs.get("bias"), strides=desc.strides, padding_l=desc.padding_l,
        padding_r=desc.padding_r, dilation=desc.dilation, groups=desc.groups, output_scale=desc.output_scale,
        post_ops=desc.post_ops, old_dst=inputs.get("dst"), operands=inputs,
        dst_dtype="f32" if desc.dst_quant is not None else desc.dst.dtype,
        sum_scale=desc.quant_scale if quantized else None,
    )
    if desc.dst_quant is None:
        return y
    q = desc.dst_quant
    stored = _dtype_io.store_reference(y, q.round_in).astype(np.float32) / np.float32(q.static_scale) + np.float32(q.zp)
    return _dtype_io.store_reference(stored, desc.dst.dtype)


register(
    ConvolutionDesc, generate=generate, reference=desc_reference,
    tolerance=lambda desc: tolerance.convolution(math.prod(desc.weights.dims[1:])),
)

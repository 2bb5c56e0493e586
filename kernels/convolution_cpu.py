"""Convolution forward on CPUs whose SIMD registers hold 8 floats (AVX2): each
work-item a block of TM output positions along the innermost spatial axis by 16 output channels,
TM float16 accumulators (2 x TM registers), walking (tap, input channel): one float16 of weights
(16 output channels, contiguous in HWIO-like weights) and TM broadcast src values per step. A
depthwise convolution (one channel per group) walks the taps only, its src a float16 of the same
16 channels per position.

This is an implicit GEMM's micro-kernel. With src channels contiguous (NHWC) a tap's inner loop
over input channels reads TM rows of consecutive floats, and HWIO-like weights are read in place
(a tap's ICg x 16 floats stay in L1/L2 across the work-items of a channel block). Weights whose
output channels are not contiguous (OIHW, as NCHW graphs give them) are packed first: each
work-item copies its 16 channels' weights into ``__local`` memory as a float16 per (tap, input
channel) and then runs every position block of its output row, so the copy is paid once per row
(``ocl:packed_blocked``). Interior positions (every tap inside the image) run a loop without
bounds selects; the edges select zero. Measured on the 2-core AVX2 VM, batch 1, ms, NCHW with
OIHW weights, the direct kernels -> packed: ResNet-50 conv1 7x7/2 21.5 -> 2.9, res2 3x3 4.9 ->
2.1, res3 3x3/2 16.7 -> 3.2, res5 3x3 (7x7 maps) 15.5 -> 8.6 (a side script, best of 5).

Why: on the 2-core AVX2 VM the per-position direct kernel (``convolution._direct``) ran NHWC 3x3
layers at 0.22-0.47x torch CPU (BENCHMARKS.md §13): each of its lanes gathers src C floats apart.
Only where ``KernelConfig.native_vector_width`` < 16: the AVX-512 shapes of the direct kernels
were tuned on such a host and this one was not measured there.

The last block of a row is shifted back to end at the row's end; it stores only the positions
the block before did not (a sum post-op reads each old dst value once). An output-channel block
past OC loads and stores lane by lane.
"""

from __future__ import annotations

import math

from .._values._convolution_desc import ConvolutionDesc
from . import _dtype_io, _post_ops
from ._spec import KernelConfig, KernelSpec

TM = 6  # positions per work-item: 6 float16 accumulators, 12 of AVX2's 16 registers
LANES = 16

_PRELUDE = (
    "typedef float16 __attribute__((aligned(4))) cv_float16u;\n"  # unaligned float16 access
    "static float16 cv_wide(const float16 x) { return x; }\n"
)


def _lanes(ptr: str, base: str, step: int, guard) -> str:
    """A float16 of 16 values of ``ptr`` from ``base``, ``step`` apart (0: one value for every
    lane); ``guard(lane)``: the C condition under which a lane reads (else 0), None where every
    lane is in range (then a unit step is one float16 load)."""
    if step == 0:
        return f"((float16)({ptr}[{base}]))"
    if guard is None and step == 1:
        return f"(*(__global const cv_float16u*)({ptr} + {base}))"
    return "(float16)(" + ", ".join(
        f"{ptr}[{base} + {lane * step}UL]" if guard is None else f"({guard(lane)}) ? {ptr}[{base} + {lane * step}UL] : 0.0f"
        for lane in range(LANES)) + ")"


def _narrow_f32(desc: ConvolutionDesc, config: KernelConfig) -> bool:
    """The CPU shape on an 8-float SIMD device, every tensor f32, no quantization: what both
    kernels of this module need."""
    if desc.src_quant is not None or desc.weights_quant is not None or desc.dst_quant is not None:
        return False
    tensors = (desc.src, desc.weights, desc.dst) + ((desc.bias,) if desc.bias else ())
    return (config.vector_width >= 16 and config.native_vector_width < 16
            and all(md.dtype == "f32" for md in tensors))


def _depthwise(desc: ConvolutionDesc) -> bool:
    """One input and one output channel per group."""
    return desc.groups > 1 and desc.weights.dims[1] == 1 and desc.groups == desc.weights.dims[0]


def applies(desc: ConvolutionDesc, config: KernelConfig) -> bool:
    """CPU shape on an 8-float SIMD device, f32 everywhere, channels contiguous in src and dst,
    output channels contiguous in the weights, 16+ output channels in one group or depthwise (one
    channel per group), no quantization."""
    if not (_narrow_f32(desc, config) and desc.weights.dims[0] >= LANES):
        return False
    if _depthwise(desc):  # src and weights read 16 channels at once
        return desc.src.strides[1] == 1 and desc.weights.strides[0] == 1
    if desc.groups != 1:
        return False
    packed = desc.weights.strides[0] != 1
    return not packed or _packed_bytes(desc) <= config.local_memory


def _packed_bytes(desc: ConvolutionDesc) -> int:
    """__local bytes of a work-item's packed weights: every (tap, input channel) x 16 channels."""
    return math.prod(desc.weights.dims[1:]) * LANES * 4


def blocked(desc: ConvolutionDesc, post_ops: tuple, config: KernelConfig) -> KernelSpec:
    """The kernel of ``desc`` (``applies`` said yes) with the chain ``post_ops`` (the output scale
    leading, as ``_post_ops.generate_scaled`` hands it)."""
    nsp = len(desc.src.dims) - 2
    axes = "dhw"[3 - nsp:]
    ss, ws, ds = desc.src.strides, desc.weights.strides, desc.dst.strides
    isp, osp, ksz = desc.src.dims[2:], desc.dst.dims[2:], desc.weights.dims[2:]
    n, oc, ic = desc.src.dims[0], desc.weights.dims[0], desc.weights.dims[1]
    strides, pad, dil = desc.strides, desc.padding_l, desc.dilation
    has_bias = desc.bias is not None
    bias_step = desc.bias.strides[0] if desc.bias is not None else 0
    ow_n, iw_n = osp[-1], isp[-1]
    tm = min(TM, ow_n)
    nwb = math.ceil(ow_n / tm)
    outer = osp[:-1]
    nwork = n * math.prod(outer) * nwb
    ncb = math.ceil(oc / LANES)
    po_strides = _post_ops.operand_strides(post_ops, len(desc.dst.dims))
    depthwise = desc.groups > 1
    # Weights whose output channels are not contiguous (OIHW): each work-item first packs its 16
    # channels' weights into __local memory as float16 per (tap, input channel), then runs every
    # position block of its output row, so the packing is paid once per row.
    packed = not depthwise and ws[0] != 1
    if packed:
        nwork = n * math.prod(outer)

    # Work-item -> (image, outer positions, block along the innermost axis). (Not ``b``: the
    # post-ops' binary step declares ``a`` and ``b``, and an operand's offset is read in the
    # initializer of that ``b``.)
    pos = ["ulong r = p;"] + ([] if packed else [f"const ulong wb = r % {nwb}UL; r /= {nwb}UL;"])
    for i in reversed(range(nsp - 1)):
        pos.append(f"const long o{axes[i]} = (long)(r % {osp[i]}UL); r /= {osp[i]}UL;")
    pos.append("const ulong img = r;")
    first_block = f"const long ow0 = (long)wb * {tm}L < {ow_n - tm}L ? (long)wb * {tm}L : {ow_n - tm}L;"
    if not packed:
        pos.append(first_block)

    # Taps of the outer axes: a tap in the padding is skipped for the whole block.
    loops, indent = [], "    "
    src_outer = f"img * {ss[0]}UL"
    wei_outer = []
    for i, a in enumerate(axes[:-1]):
        loops.append(f"{indent}for (long k{a} = 0; k{a} < {ksz[i]}L; ++k{a}) {{")
        indent += "    "
        loops.append(f"{indent}const long i{a} = o{a} * {strides[i]}L - {pad[i]}L + k{a} * {dil[i]}L;")
        loops.append(f"{indent}if (i{a} < 0 || i{a} >= {isp[i]}L) continue;")
        src_outer += f" + (ulong)i{a} * {ss[2 + i]}UL"
        wei_outer.append(f"(ulong)k{a} * {ws[2 + i]}UL")
    sw, pw, dw, kw_n = strides[-1], pad[-1], dil[-1], ksz[-1]
    body = [f"{indent}for (long kw = 0; kw < {kw_n}L; ++kw) {{"]
    ind2 = indent + "    "
    for i in range(tm):
        body.append(f"{ind2}const long iw{i} = (ow0 + {i}L) * {sw}L - {pw}L + kw * {dw}L;")
        body.append(f"{ind2}const int v{i} = iw{i} >= 0 && iw{i} < {iw_n}L;")
        body.append(f"{ind2}__global const float* const s{i} = src + {src_outer} + (ulong)(v{i} ? iw{i} : 0L) * {ss[-1]}UL;")
    if packed:
        tap = "(ulong)kw"
        for i, a in reversed(list(enumerate(axes[:-1]))):
            tap = f"({tap} + (ulong)k{a} * {math.prod(ksz[i + 1:])}UL)"
        body.append(f"{ind2}__local const float16* const wt = wp + {tap} * {ic}UL;")
    else:
        wbase = " + ".join(wei_outer + [f"(ulong)kw * {ws[-1]}UL", "oc0"])
        body.append(f"{ind2}__global const float* const wt = wei + {wbase};")

    def ic_loop(checked: bool, full: bool) -> str:
        if depthwise:  # one input channel per output channel: src is a float16 of the 16 channels
            w = "*(__global const cv_float16u*)wt" if full else "(float16)(" + ", ".join(
                f"(oc0 + {lane}UL < {oc}UL) ? wt[{lane}UL] : 0.0f" for lane in range(LANES)) + ")"

            def x(i: int) -> str:
                if full:
                    return f"*(__global const cv_float16u*)(s{i} + oc0)"
                return "(float16)(" + ", ".join(
                    f"(oc0 + {lane}UL < {oc}UL) ? s{i}[oc0 + {lane}UL] : 0.0f" for lane in range(LANES)) + ")"
            fmas = " ".join(f"acc{i} += {f'(v{i} ? {x(i)} : (float16)(0.0f))' if checked else x(i)} * w;"
                            for i in range(tm))
            return f"{{ const float16 w = {w}; {fmas} }}"
        if packed:
            wload = "const float16 w = wt[c];"
        elif full:
            wload = f"const float16 w = *(__global const cv_float16u*)(wt + c * {ws[1]}UL);"
        else:
            wload = "const float16 w = (float16)(" + ", ".join(
                f"(oc0 + {lane}UL < {oc}UL) ? wt[c * {ws[1]}UL + {lane}UL] : 0.0f" for lane in range(LANES)) + ");"
        reads = [f"s{i}[c * {ss[1]}UL]" for i in range(tm)]
        fmas = " ".join(
            f"acc{i} += (float16)({f'v{i} ? {reads[i]} : 0.0f' if checked else reads[i]}) * w;" for i in range(tm))
        return f"for (ulong c = 0; c < {ic}UL; ++c) {{ {wload} {fmas} }}"

    all_valid = " && ".join(f"v{i}" for i in range(tm))

    def k_loops(full: bool) -> str:
        lines = list(loops) + body
        lines.append(f"{ind2}if ({all_valid}) {{ {ic_loop(False, full)} }} else {{ {ic_loop(True, full)} }}")
        lines.append(f"{indent}}}")
        for depth in range(len(axes) - 1):
            lines.append(" " * (4 + 4 * (len(axes) - 2 - depth)) + "}")
        return "\n".join(lines)

    # Epilogue per position i: acc + bias, post-ops on the float16, the store.
    def lanes(ptr: str, base: str, step: int, full: bool) -> str:
        """float16 of the 16 channels from ``base`` at channel stride ``step``."""
        return _lanes(ptr, base, step, None if full else lambda lane: f"oc0 + {lane}UL < {oc}UL")

    def position(i: int, full: bool) -> str:
        ow = f"(ulong)(ow0 + {i}L)"
        dst_off = (f"img * {ds[0]}UL + oc0 * {ds[1]}UL"
                   + "".join(f" + (ulong)o{a} * {ds[2 + j]}UL" for j, a in enumerate(axes[:-1]))
                   + f" + {ow} * {ds[-1]}UL")

        def operand(name: str) -> str:
            s = po_strides[name]
            off = (f"img * {s[0]}UL + oc0 * {s[1]}UL"
                   + "".join(f" + (ulong)o{a} * {s[2 + j]}UL" for j, a in enumerate(axes[:-1]) if s[2 + j])
                   + (f" + {ow} * {s[-1]}UL" if s[-1] else ""))
            return lanes(name, off, s[1], full)
        value = f"acc{i}" + (f" + {lanes('bias', f'oc0 * {bias_step}UL', bias_step, full)}" if has_bias else "")
        post = _post_ops.apply(post_ops, "r", "float16", lanes("dst", dst_off, ds[1], full), operand)
        if full and ds[1] == 1:
            out = f"*(__global cv_float16u*)(dst + {dst_off}) = r;"
        else:
            out = " ".join(f"{'' if full else f'if (oc0 + {lane}UL < {oc}UL) '}dst[{dst_off} + {lane * ds[1]}UL] = r.s{lane:x};"
                           for lane in range(LANES))
        return f"if (ow0 + {i}L >= (long)wb * {tm}L) {{ float16 r = {value}; {post} {out} }}"

    def block(full: bool) -> str:
        zero = " ".join(f"acc{i} = (float16)(0.0f);" for i in range(tm))
        inner = f"""{zero}
{k_loops(full)}
    {chr(10).join("    " + position(i, full) for i in range(tm)).strip()}"""
        if packed:
            return f"""{{ for (ulong wb = 0; wb < {nwb}UL; ++wb) {{ {first_block}
    {inner}
    }} }}"""
        return f"{{\n    {inner}\n    }}"

    pack = ""
    if packed:
        taps = math.prod(ksz)
        decode = ["ulong tr = t;"]
        offs = []
        for i in reversed(range(nsp)):
            decode.append(f"const ulong t{i} = tr % {ksz[i]}UL; tr /= {ksz[i]}UL;")
            offs.append(f"t{i} * {ws[2 + i]}UL")
        gather = ", ".join(f"(oc0 + {lane}UL < {oc}UL) ? wei[(oc0 + {lane}UL) * {ws[0]}UL + c * {ws[1]}UL + to] : 0.0f"
                           for lane in range(LANES))
        pack = (f"__local float16 wp[{taps * ic}];\n    "
                f"for (ulong t = 0; t < {taps}UL; ++t) {{ {' '.join(decode)} const ulong to = {' + '.join(offs)}; "
                f"for (ulong c = 0; c < {ic}UL; ++c) wp[t * {ic}UL + c] = (float16)({gather}); }}")

    bias_param = f" {_dtype_io.param('f32', 'bias', const=True)}," if has_bias else ""
    source = (_post_ops.functions(post_ops, ("float", "float16")) + _PRELUDE
              + f"""__kernel void convolution_fwd(__global const float* restrict src,
                              __global const float* restrict wei,{bias_param}{_post_ops.params(post_ops)}
                              __global float* restrict dst) {{
    const ulong p = get_global_id(0), cb = get_global_id(1);
    if (p >= {nwork}UL || cb >= {ncb}UL) return;
    {chr(10).join("    " + line for line in pos).strip()}
    const ulong oc0 = cb * {LANES}UL;
    {pack}
    float16 {", ".join(f"acc{i}" for i in range(tm))};
    acc0 = cv_wide((float16)(0.0f));
    if (oc0 + {LANES}UL <= {oc}UL) {block(True)} else {block(False)}
}}
""")
    args = ("src", "weights") + (("bias",) if has_bias else ()) + tuple(po_strides) + ("dst",)
    return KernelSpec(
        source=source,
        name="convolution_fwd",
        arg_names=args,
        global_size=(nwork, ncb),
        local_size=(1, 1),
        impl=f"ocl:{'packed' if packed else 'nhwc'}_blocked:w{tm}xc{LANES}{':dw' if depthwise else ''}:l1x1",
    )


def depthwise_rows_applies(desc: ConvolutionDesc, config: KernelConfig) -> bool:
    """Depthwise 2D convolution over rows contiguous along W (NCHW), f32, on an 8-float SIMD
    device, where the direct kernel's row vectors do not apply (stride along W above 1, or rows
    shorter than 16)."""
    return (_narrow_f32(desc, config) and _depthwise(desc)
            and len(desc.src.dims) == 4 and desc.src.strides[-1] == 1 and desc.dst.strides[-1] == 1
            and (desc.strides[-1] > 1 or desc.dst.dims[-1] < LANES))


def depthwise_rows(desc: ConvolutionDesc, post_ops: tuple, config: KernelConfig) -> KernelSpec:
    """Each work-item one output row of one channel, 16 positions along W as one float16 per
    step; a tap's 16 src values are one float16 load at stride 1, two and their even lanes at
    stride 2, where the whole block is inside the row, and 16 selected loads otherwise."""
    ss, ws, ds = desc.src.strides, desc.weights.strides, desc.dst.strides
    n, c = desc.src.dims[:2]
    ih_n, iw_n = desc.src.dims[2:]
    oh_n, ow_n = desc.dst.dims[2:]
    kh_n, kw_n = desc.weights.dims[2:]
    (sh, sw), (ph, pw), (dh, dw) = desc.strides, desc.padding_l, desc.dilation
    has_bias = desc.bias is not None
    bias_step = desc.bias.strides[0] if desc.bias is not None else 0
    po_strides = _post_ops.operand_strides(post_ops, 4)

    def lanes(ptr: str, base: str, step: int, guard: bool) -> str:
        """float16 of the 16 positions from ``base`` at position stride ``step``."""
        return _lanes(ptr, base, step, (lambda lane: f"ow0 + {lane}L < {ow_n}L") if guard else None)

    def x_full() -> str:
        base = f"row + (ulong)(ow0 * {sw}L - {pw}L + kw * {dw}L)"
        if sw == 1:
            return f"*(__global const cv_float16u*)({base})"
        if sw == 2:
            return (f"(float16)((*(__global const cv_float16u*)({base})).even, "
                    f"(*(__global const cv_float16u*)({base} + 16UL)).even)")
        return "(float16)(" + ", ".join(f"({base})[{lane * sw}UL]" for lane in range(LANES)) + ")"

    x_edge = "(float16)(" + ", ".join(
        f"((ow0 + {lane}L) < {ow_n}L && (ulong)((ow0 + {lane}L) * {sw}L - {pw}L + kw * {dw}L) < {iw_n}UL) ? "
        f"row[(ow0 + {lane}L) * {sw}L - {pw}L + kw * {dw}L] : 0.0f" for lane in range(LANES)) + ")"
    # The block's taps all inside the row: its first and last positions' windows are.
    inside = (f"ow0 + {LANES - 1}L < {ow_n}L && ow0 * {sw}L - {pw}L >= 0L "
              f"&& (ow0 + {LANES - 1}L) * {sw}L - {pw}L + {(kw_n - 1) * dw}L < {iw_n}L"
              + (f" && ow0 * {sw}L - {pw}L + {(kw_n - 1) * dw + 32}L <= {iw_n}L" if sw == 2 else ""))
    dst_at = f"img * {ds[0]}UL + ch * {ds[1]}UL + (ulong)oh * {ds[2]}UL + (ulong)ow0 * {ds[3]}UL"

    def epilogue(guard: bool) -> str:
        def operand(name: str) -> str:
            s = po_strides[name]
            base = f"img * {s[0]}UL + ch * {s[1]}UL + (ulong)oh * {s[2]}UL + (ulong)ow0 * {s[3]}UL"
            return lanes(name, base, s[3], guard)
        value = "acc" + (f" + (float16)(bias[ch * {bias_step}UL])" if has_bias else "")
        post = _post_ops.apply(post_ops, "r", "float16", lanes("dst", dst_at, ds[3], guard), operand)
        if not guard and ds[3] == 1:
            out = f"*(__global cv_float16u*)(dst + {dst_at}) = r;"
        else:
            out = " ".join(f"{f'if (ow0 + {lane}L < {ow_n}L) ' if guard else ''}dst[{dst_at} + {lane * ds[3]}UL] = r.s{lane:x};"
                           for lane in range(LANES))
        return f"{{ float16 r = {value}; {post} {out} }}"

    bias_param = f" {_dtype_io.param('f32', 'bias', const=True)}," if has_bias else ""
    source = (_post_ops.functions(post_ops, ("float", "float16")) + _PRELUDE
              + f"""__kernel void convolution_fwd(__global const float* restrict src,
                              __global const float* restrict wei,{bias_param}{_post_ops.params(post_ops)}
                              __global float* restrict dst) {{
    const ulong p = get_global_id(0);
    if (p >= {n * c * oh_n}UL) return;
    const long oh = (long)(p % {oh_n}UL);
    const ulong ch = (p / {oh_n}UL) % {c}UL, img = p / {oh_n * c}UL;
    for (long ow0 = 0; ow0 < {ow_n}L; ow0 += {LANES}L) {{
        float16 acc = cv_wide((float16)(0.0f));
        const int full = {inside};
        for (long kh = 0; kh < {kh_n}L; ++kh) {{
            const long ih = oh * {sh}L - {ph}L + kh * {dh}L;
            if (ih < 0 || ih >= {ih_n}L) continue;
            __global const float* const row = src + img * {ss[0]}UL + ch * {ss[1]}UL + (ulong)ih * {ss[2]}UL;
            for (long kw = 0; kw < {kw_n}L; ++kw) {{
                const float w = wei[ch * {ws[0]}UL + (ulong)kh * {ws[2]}UL + (ulong)kw * {ws[3]}UL];
                acc += (full ? {x_full()} : {x_edge}) * (float16)(w);
            }}
        }}
        if (ow0 + {LANES}L <= {ow_n}L) {epilogue(False)} else {epilogue(True)}
    }}
}}
""")
    args = ("src", "weights") + (("bias",) if has_bias else ()) + tuple(po_strides) + ("dst",)
    return KernelSpec(
        source=source,
        name="convolution_fwd",
        arg_names=args,
        global_size=(n * c * oh_n,),
        local_size=(1,),
        impl=f"ocl:dw_rows:w{LANES}:s{sw}:l1x1",
    )

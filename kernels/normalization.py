"""Normalization forward (inference): layer, RMS, batch (given statistics) and group normalization.

Generators beside their OpenCL sources, the float64 references and the thresholds.

* layer: ``y = (x - mean) / sqrt(var + eps) * scale + shift`` over one axis (oneDNN's layer
  normalization normalises the last one; any axis is accepted here), mean and biased variance
  computed per row and optionally written out (oneDNN's forward-training outputs).
* rms: ``y = x / sqrt(mean(x^2) + eps) * scale`` over the last axis (oneDNN's ``rms_norm`` flag).
* batch (inference, oneDNN's ``use_global_stats``): per channel (dim 1) with given mean and
  variance: ``y = scale / sqrt(var + eps) * (x - mean) + shift``, oneDNN's reference order.
* group: ``(N, C, spatial...)``, C split into ``groups``; stats over (C/groups x spatial) per
  (n, group), then per-channel scale and shift.

Row kernels (layer, rms, group) run one work-item per row (per (n, group) for group): pass 1
sums x for the mean, pass 2 sums (x - mean)^2 (two passes: no cancellation of E[x^2] - mean^2),
the last pass writes. The sums are compensated (Neumaier, as reduction's): a plain f32 sum of
thousands of elements drifts well past benchdnn's threshold. On the GPU configuration (vector
width 1) layer and RMS rows of 32 or more take one work-group each instead (``ocl:wg_row:...``,
see ``_wg_reduce``): the same passes, each work-item's compensated partial sums combined by a
compensated local-memory tree (43 -> 2203 GB/s on 8x384x1024 on an H200, torch 1217).
``sqrt`` is called once per row. PoCL keeps built-ins as calls, so ternaries stand in for ``fabs``. Batch runs one work-item per
element and calls ``sqrt`` once per element.

In place (``dst`` the same memory as ``src``, same descriptor): the statistics passes only read,
and the writing pass reads each element right before writing that same element, which no later
step reads again; so in place is safe for every kernel here.

Every kernel applies a post-op chain (see ``_post_ops``) to each normalised value right before its
store; a sum post-op reads dst just before that same element is written (in place: src's value).

Kernel arguments, in order, of those present: src, scale, shift, mean, variance, the post-op
operands ``post_op_{i}_src1``, dst.

``src`` and ``dst`` each have any storage type of ``_dtype_io.DTYPES`` (f32 math: loads convert to
float, the store converts to dst's type); scale, shift, mean and variance are f32, as oneDNN's,
and so are post-op operands. The all-f32 kernels are the plain ones.
"""

from __future__ import annotations

import math
from typing import Callable

import numpy as np

from . import _dtype_io, _post_ops, _wg_reduce
from . import softmax as _softmax
from ._spec import VECTOR_TYPES, KernelConfig, KernelSpec, c_float, index_code, padded_global

_F32_EPS = float(np.finfo(np.float32).eps)

# Thresholds, after benchdnn: lnorm's setup_cmp (tests/benchdnn/lnorm/lnorm.cpp) compares f32 dst
# with 5e-7 and bnorm's (tests/benchdnn/bnorm/bnorm.cpp) with 6e-7; gnorm follows bnorm. benchdnn
# fills the source so that mean and variance are exact in f32; the tests here use random floats,
# where the f32 mean, variance and 1/sqrt each round, so every computed statistic is off by about
# an ulp and the output by a few: 8 * eps (~9.5e-7) for the row kernels, measured within 3 eps
# on rows of 37 to 16384 elements with |mean| / std about 2.6. The f32 mean's own rounding (half
# an ulp of |mean|) enters x - mean, so the output error grows as |mean| / std: rows of mean 100
# and std 1.15 measured 40-63 eps. Inherent to an f32 mean (benchdnn sidesteps it with exact
# data); the tests keep |mean| / std small.
# Batch normalization takes its statistics as given and rounds only sqrt, division, two
# multiplications and an addition: benchdnn's 6e-7 (about 5 eps) holds as is.
LNORM = 8 * _F32_EPS
RMSNORM = 8 * _F32_EPS
GNORM = 8 * _F32_EPS
BNORM = 6e-7
STATS = 4 * _F32_EPS  # mean/variance outputs of layer normalization


def _sum_step(term: str, acc: str, comp: str) -> str:
    """Neumaier-compensated ``acc += term`` (ternaries instead of fabs)."""
    return (
        f"{{ const float y = {term}; const float t = {acc} + y;"
        f" const float aa = {acc} < 0.0f ? -{acc} : {acc}; const float ay = y < 0.0f ? -y : y;"
        f" {comp} += aa >= ay ? ({acc} - t) + y : (y - t) + {acc}; {acc} = t; }}"
    )


def _params(args: list[str], dtypes: dict[str, str], outputs: tuple[str, ...]) -> str:
    """Kernel parameters of ``args``: ``dtypes`` gives src's and dst's storage, the rest are f32."""
    return ", ".join(_dtype_io.param(dtypes.get(a, "f32"), a, const=a not in outputs) for a in args)


def _helpers(src_dtype: str, dst_dtype: str) -> str:
    return _dtype_io.functions(loads=(src_dtype, dst_dtype), stores=(dst_dtype,))


def generate_layer(
    *,
    dims: tuple[int, ...],
    src_strides: tuple[int, ...],
    dst_strides: tuple[int, ...],
    axis: int,
    epsilon: float,
    scale_stride: int | None,
    shift_stride: int | None,
    mean_strides: tuple[int, ...] | None,
    variance_strides: tuple[int, ...] | None,
    rms: bool = False,
    config: KernelConfig,
    post_ops: tuple = (),
    src_dtype: str = "f32",
    dst_dtype: str = "f32",
) -> KernelSpec:
    """Layer (or, with ``rms``, RMS) normalization over ``axis``; statistics outputs where given.

    ``mean_strides``/``variance_strides`` are of the stats tensor (dims without ``axis``).
    ``post_ops``: a validated chain applied to each output before its store.
    ``src_dtype``/``dst_dtype``: storage types, the math f32.
    """
    _dtype_io.check_dtype("src", src_dtype)
    _dtype_io.check_dtype("dst", dst_dtype)
    n = dims[axis]
    other_dims = dims[:axis] + dims[axis + 1:]
    rows = math.prod(other_dims)
    local = config.local_size
    tensors = {"src": src_strides[:axis] + src_strides[axis + 1:], "dst": dst_strides[:axis] + dst_strides[axis + 1:]}
    if mean_strides is not None:
        tensors["mean"] = mean_strides
    if variance_strides is not None:
        tensors["variance"] = variance_strides
    po_strides = _post_ops.operand_strides(post_ops, len(dims))
    tensors.update({name: st[:axis] + st[axis + 1:] for name, st in po_strides.items()})
    offsets = index_code(other_dims, tensors, "row")
    ss, ds = src_strides[axis], dst_strides[axis]
    if _wg_reduce.use_work_group(config, n, rows, ss, other_dims, tensors["src"]):
        return _generate_layer_work_group(
            n=n, rows=rows, offsets=offsets, ss=ss, ds=ds, epsilon=epsilon, scale_stride=scale_stride,
            shift_stride=shift_stride, mean=mean_strides is not None, variance=variance_strides is not None,
            rms=rms, config=config, post_ops=post_ops, po_axis={name: st[axis] for name, st in po_strides.items()},
            src_dtype=src_dtype, dst_dtype=dst_dtype,
        )
    vec = 1
    if config.vector_width >= 16:
        vec = _softmax._row_vector_width(n, (tensors["src"], tensors["dst"]), (ss, ds), other_dims,
                                         config.vector_width)
    if vec > 1:
        return _generate_layer_vector(
            n=n, vec=vec, rows=rows, other_dims=other_dims, tensors=tensors, epsilon=epsilon,
            scale_stride=scale_stride, shift_stride=shift_stride, mean=mean_strides is not None,
            variance=variance_strides is not None, rms=rms, config=config, post_ops=post_ops,
            po_axis={name: st[axis] for name, st in po_strides.items()}, src_dtype=src_dtype, dst_dtype=dst_dtype,
        )
    x_at = _dtype_io.load(src_dtype, "src", f"off_src + k * {ss}UL")
    eps = c_float(epsilon)
    lines = []
    if rms:
        lines.append("float sq = 0.0f, sq_c = 0.0f;")
        lines.append(f"for (ulong k = 0; k < {n}UL; ++k) {{ const float x = {x_at}; {_sum_step('x * x', 'sq', 'sq_c')} }}")
        lines.append(f"const float ms = (sq + sq_c) / {c_float(n)};")
        lines.append(f"const float inv = 1.0f / sqrt(ms + {eps});")
        value = f"{x_at} * inv"
    else:
        lines.append("float s = 0.0f, s_c = 0.0f;")
        lines.append(f"for (ulong k = 0; k < {n}UL; ++k) {{ const float x = {x_at}; {_sum_step('x', 's', 's_c')} }}")
        lines.append(f"const float m = (s + s_c) / {c_float(n)};")
        lines.append("float q = 0.0f, q_c = 0.0f;")
        lines.append(
            f"for (ulong k = 0; k < {n}UL; ++k) {{ const float d = {x_at} - m; {_sum_step('d * d', 'q', 'q_c')} }}"
        )
        lines.append(f"const float v = (q + q_c) / {c_float(n)};")
        if mean_strides is not None:
            lines.append("mean[off_mean] = m;")
        if variance_strides is not None:
            lines.append("variance[off_variance] = v;")
        lines.append(f"const float inv = 1.0f / sqrt(v + {eps});")
        value = f"({x_at} - m) * inv"
    scale_ref = f"scale[k * {scale_stride}UL]" if scale_stride is not None else None
    shift_ref = f"shift[k * {shift_stride}UL]" if shift_stride is not None else None
    expr = value
    if scale_ref:
        expr = f"({expr}) * {scale_ref}"
    if shift_ref:
        expr = f"{expr} + {shift_ref}"
    chain = _dtype_io.apply_post_ops_scalar(
        post_ops, "y", f"off_dst + k * {ds}UL",
        {name: f"off_{name} + k * {st[axis]}UL" for name, st in po_strides.items()},
        dst_dtype,
    )
    store = _dtype_io.store(dst_dtype, "dst", f"off_dst + k * {ds}UL", "y")
    lines.append(f"for (ulong k = 0; k < {n}UL; ++k) {{ float y = {expr}; {chain} {store} }}")

    args = _layer_args(scale_stride is not None, shift_stride is not None, mean_strides is not None,
                       variance_strides is not None, po_strides)
    name = "rmsnorm_fwd" if rms else "lnorm_fwd"
    params = _params(args, {"src": src_dtype, "dst": dst_dtype}, ("dst", "mean", "variance"))
    body = "\n    ".join(lines)
    # No restrict: in place, src and dst are one buffer.
    source = _helpers(src_dtype, dst_dtype) + _post_ops.functions(post_ops) + f"""__kernel void {name}({params}) {{
    const ulong row = get_global_id(0);
    if (row >= {rows}UL) return;
    {offsets}
    {body}
}}
"""
    return KernelSpec(
        source=source,
        name=name,
        arg_names=tuple(args),
        global_size=(padded_global(rows, local),),
        local_size=(local,),
        impl=f"ocl:row:v1l{local}",
    )


# Rows per work-item on the vector path: short rows are grouped so that each work-item walks
# about this many elements, as long as every one of the two cores still gets many work-items.
_VECTOR_ROW_ELEMENTS = 512
_VECTOR_MIN_ITEMS = 64


def _generate_layer_vector(
    *,
    n: int,
    vec: int,
    rows: int,
    other_dims: tuple[int, ...],
    tensors: dict[str, tuple[int, ...]],
    epsilon: float,
    scale_stride: int | None,
    shift_stride: int | None,
    mean: bool,
    variance: bool,
    rms: bool,
    config: KernelConfig,
    post_ops: tuple,
    po_axis: dict[str, int],
    src_dtype: str,
    dst_dtype: str,
) -> KernelSpec:
    """Layer (RMS) normalization on the CPU configuration, rows walked ``vec`` elements at a time
    (the row contiguous in src and dst, its length a multiple of ``vec``, each row aligned: see
    ``softmax._row_vector_width``). f32 rows go through vector pointer casts (PoCL keeps vloadN
    as a call), other storage types load and store element by element into the same vector math.
    The passes are the row kernel's, each sum a Kahan sum per lane (``softmax._step``) folded by
    compensated halving (``softmax._sum_fold_code``). Short rows: several per work-item. In place
    is safe as in the row kernel: the writing pass reads each chunk right before writing it."""
    T = VECTOR_TYPES[vec]
    chunks = n // vec
    local = config.local_size
    per_item = max(1, min(_VECTOR_ROW_ELEMENTS // n, rows // (_VECTOR_MIN_ITEMS * local)))
    items = -(-rows // per_item)
    offsets = index_code(other_dims, tensors, "row")
    xs_k = "xs[k]" if src_dtype == "f32" else _dtype_io.load_vector(src_dtype, "xs", "k", T, vec)
    xd_k = "xd[k]" if dst_dtype == "f32" else _dtype_io.load_vector(dst_dtype, "xd", "k", T, vec)
    xs_decl = (
        f"__global const {T}* xs = (__global const {T}*)(src + off_src);" if src_dtype == "f32"
        else f"__global const {_dtype_io.STORAGE[src_dtype]}* xs = src + off_src;"
    )
    xd_decl = (
        f"__global {T}* xd = (__global {T}*)(dst + off_dst);" if dst_dtype == "f32"
        else f"__global {_dtype_io.STORAGE[dst_dtype]}* xd = dst + off_dst;"
    )

    def gather(name: str, stride: int, offset: str = "") -> str:
        # A parameter or operand chunk: a vector pointer where it is contiguous from an aligned
        # start (scale and shift: their own buffers), else gathered lane by lane.
        if stride == 0:
            return f"(({T})({name}[{offset or '0'}]))"
        if stride == 1 and not offset:
            return f"((__global const {T}*){name})[k]"
        base = f"{offset} + " if offset else ""
        lanes = ", ".join(f"{name}[{base}k * {vec * stride}UL + {t * stride}UL]" for t in range(vec))
        return f"(({T})({lanes}))"

    fold = _softmax._sum_fold_code(vec)
    zero = f"({T})(0.0f)"

    def compensated_sum(load: str, term: str, out: str) -> str:
        return (
            f"{{ {T} sv = {zero}, cv = {zero};\n"
            f"        for (ulong k = 0; k < {chunks}UL; ++k) {{ {load} {_softmax._step('sv', 'cv', term, T)} }}\n"
            "        cv = -cv;  /* Kahan keeps minus the lost low parts; the fold adds error terms */\n"
            f"        float s;\n        {fold}\n        {out} = s / {c_float(n)}; }}"
        )

    eps = c_float(epsilon)
    lines = [xs_decl, xd_decl]
    if rms:
        lines += [
            "float ms;",
            compensated_sum(f"const {T} x = {xs_k};", "x * x", "ms"),
            f"const float inv = 1.0f / sqrt(ms + {eps});",
        ]
        value = f"{xs_k} * ({T})(inv)"
    else:
        lines += [
            "float m, v;",
            compensated_sum(f"const {T} x = {xs_k};", "x", "m"),
            compensated_sum(f"const {T} d = {xs_k} - ({T})(m);", "d * d", "v"),
        ]
        if mean:
            lines.append("mean[off_mean] = m;")
        if variance:
            lines.append("variance[off_variance] = v;")
        lines.append(f"const float inv = 1.0f / sqrt(v + {eps});")
        value = f"({xs_k} - ({T})(m)) * ({T})(inv)"
    if scale_stride is not None:
        value = f"({value}) * {gather('scale', scale_stride)}"
    if shift_stride is not None:
        value = f"{value} + {gather('shift', shift_stride)}"
    chain = _post_ops.apply(post_ops, "y", T, xd_k, lambda name: gather(name, po_axis[name], f"off_{name}"))
    store = f"xd[k] = y;" if dst_dtype == "f32" else _dtype_io.store_vector(dst_dtype, "xd", "k", T, vec, "y")
    lines.append(f"for (ulong k = 0; k < {chunks}UL; ++k) {{ {T} y = {value}; {chain} {store} }}")

    args = _layer_args(scale_stride is not None, shift_stride is not None, mean, variance, po_axis)
    name = "rmsnorm_fwd" if rms else "lnorm_fwd"
    params = _params(args, {"src": src_dtype, "dst": dst_dtype}, ("dst", "mean", "variance"))
    body = "\n        ".join(lines)
    if per_item == 1:
        head = f"const ulong row = get_global_id(0);\n    if (row >= {rows}UL) return;\n    {{"
    else:
        head = (
            f"for (ulong rr = 0; rr < {per_item}UL; ++rr) {{\n"
            f"        const ulong row = get_global_id(0) * {per_item}UL + rr;\n"
            f"        if (row >= {rows}UL) return;"
        )
    # No restrict: in place, src and dst are one buffer.
    source = _helpers(src_dtype, dst_dtype) + _post_ops.functions(post_ops, (T,)) + f"""__kernel void {name}({params}) {{
    {head}
        {offsets}
        {body}
    }}
}}
"""
    return KernelSpec(
        source=source,
        name=name,
        arg_names=tuple(args),
        global_size=(padded_global(items, local),),
        local_size=(local,),
        impl=f"ocl:row:v{vec}l{local}" + (f"r{per_item}" if per_item > 1 else ""),
    )


def _layer_args(scale: bool, shift: bool, mean: bool, variance: bool, operands) -> list[str]:
    """Kernel arguments of layer/RMS normalization, in order."""
    args = ["src"]
    args += ["scale"] * scale + ["shift"] * shift + ["mean"] * mean + ["variance"] * variance
    return args + list(operands) + ["dst"]


def _generate_layer_work_group(
    *,
    n: int,
    rows: int,
    offsets: str,
    ss: int,
    ds: int,
    epsilon: float,
    scale_stride: int | None,
    shift_stride: int | None,
    mean: bool,
    variance: bool,
    rms: bool,
    config: KernelConfig,
    post_ops: tuple,
    po_axis: dict[str, int],
    src_dtype: str,
    dst_dtype: str,
) -> KernelSpec:
    """Layer (RMS) normalization with one work-group per row (see ``_wg_reduce``): compensated
    work-group sums of x, then of (x - mean)^2 (of x^2 for RMS), then every work-item writes its
    elements. Two passes for the variance as the row kernel; rows of up to ``CACHE_MAX`` elements
    per work-item stay in registers, so src is read once. In place is safe: a work-item reads and
    writes only its own elements, each read before its write."""
    local = _wg_reduce.local_size(n, config)
    per = _wg_reduce.per_item(n, local)
    cached = per <= _wg_reduce.CACHE_MAX
    x_k = _dtype_io.load(src_dtype, "src", f"off_src + k * {ss}UL")
    x = "xv[j]" if cached else "x"
    load = f"xv[j] = {x_k};" if cached else f"const float x = {x_k};"
    reload = "" if cached else load  # passes after the first: the value is in registers, or reloaded
    eps = c_float(epsilon)
    lines = [f"float xv[{per}];"] if cached else []
    if rms:
        lines += [
            "float sq = 0.0f, sq_c = 0.0f;",
            _wg_reduce.loop(n, local, cached, f"{load} {_sum_step(f'{x} * {x}', 'sq', 'sq_c')}"),
            _wg_reduce.sum_code("sq", "sq_c", "sq_total", local),
            f"const float ms = sq_total / {c_float(n)};",
            f"const float inv = 1.0f / sqrt(ms + {eps});",
        ]
        value = f"{x} * inv"
    else:
        lines += [
            "float s = 0.0f, s_c = 0.0f;",
            _wg_reduce.loop(n, local, cached, f"{load} {_sum_step(x, 's', 's_c')}"),
            _wg_reduce.sum_code("s", "s_c", "s_total", local),
            f"const float m = s_total / {c_float(n)};",
            "float q = 0.0f, q_c = 0.0f;",
            _wg_reduce.loop(n, local, cached, f"{reload} const float d = {x} - m; {_sum_step('d * d', 'q', 'q_c')}"),
            _wg_reduce.sum_code("q", "q_c", "q_total", local),
            f"const float v = q_total / {c_float(n)};",
        ]
        if mean:
            lines.append("if (lid == 0) mean[off_mean] = m;")
        if variance:
            lines.append("if (lid == 0) variance[off_variance] = v;")
        lines.append(f"const float inv = 1.0f / sqrt(v + {eps});")
        value = f"({x} - m) * inv"
    if scale_stride is not None:
        value = f"({value}) * scale[k * {scale_stride}UL]"
    if shift_stride is not None:
        value = f"{value} + shift[k * {shift_stride}UL]"
    dst_k = f"off_dst + k * {ds}UL"
    chain = _dtype_io.apply_post_ops_scalar(
        post_ops, "y", dst_k, {name: f"off_{name} + k * {st}UL" for name, st in po_axis.items()}, dst_dtype,
    )
    store = _dtype_io.store(dst_dtype, "dst", dst_k, "y")
    lines.append(_wg_reduce.loop(n, local, cached, f"{reload} float y = {value}; {chain} {store}"))

    args = _layer_args(scale_stride is not None, shift_stride is not None, mean, variance, po_axis)
    name = "rmsnorm_fwd" if rms else "lnorm_fwd"
    params = _params(args, {"src": src_dtype, "dst": dst_dtype}, ("dst", "mean", "variance"))
    body = "\n    ".join(lines)
    source = _helpers(src_dtype, dst_dtype) + _post_ops.functions(post_ops) + f"""__kernel {_wg_reduce.attribute(local)}void {name}({params}) {{
    {_wg_reduce.declarations(local)}
    const ulong row = get_group_id(0);
    if (row >= {rows}UL) return;  /* the whole work-group: no barrier is left waiting */
    {offsets}
    {body}
}}
"""
    return KernelSpec(
        source=source,
        name=name,
        arg_names=tuple(args),
        global_size=(max(1, rows) * local,),
        local_size=(local,),
        impl=f"ocl:wg_row:l{local}" + (f"r{per}" if cached else ""),
    )


def generate_batch(
    *,
    dims: tuple[int, ...],
    src_strides: tuple[int, ...],
    dst_strides: tuple[int, ...],
    epsilon: float,
    mean_stride: int,
    variance_stride: int,
    scale_stride: int | None,
    shift_stride: int | None,
    config: KernelConfig,
    post_ops: tuple = (),
    src_dtype: str = "f32",
    dst_dtype: str = "f32",
) -> KernelSpec:
    """Batch normalization inference over channel dim 1, one work-item per element; ``post_ops``
    (a validated chain) applied to each output before its store. ``src_dtype``/``dst_dtype``:
    storage types, the math f32."""
    _dtype_io.check_dtype("src", src_dtype)
    _dtype_io.check_dtype("dst", dst_dtype)
    elems = math.prod(dims)
    local = config.local_size
    po_strides = _post_ops.operand_strides(post_ops, len(dims))
    lines = ["ulong r = i;", "ulong off_src = 0;", "ulong off_dst = 0;", "ulong c = 0;"]
    lines += [f"ulong off_{name} = 0;" for name in po_strides]
    for axis in reversed(range(len(dims))):
        d = dims[axis]
        if d == 1:
            continue
        lines.append(f"{{ const ulong q = r % {d}UL; r /= {d}UL;")
        lines.append(
            f"  off_src += q * {src_strides[axis]}UL; off_dst += q * {dst_strides[axis]}UL;"
            + "".join(f" off_{name} += q * {st[axis]}UL;" for name, st in po_strides.items() if st[axis])
        )
        if axis == 1:
            lines.append("  c = q;")
        lines.append("}")
    sm = f"1.0f / sqrt(variance[c * {variance_stride}UL] + {c_float(epsilon)})"
    if scale_stride is not None:
        sm = f"scale[c * {scale_stride}UL] / sqrt(variance[c * {variance_stride}UL] + {c_float(epsilon)})"
    expr = f"sm * ({_dtype_io.load(src_dtype, 'src', 'off_src')} - mean[c * {mean_stride}UL])"
    if shift_stride is not None:
        expr = f"{expr} + shift[c * {shift_stride}UL]"
    lines.append(f"const float sm = {sm};")
    lines.append(f"float y = {expr};")
    chain = _dtype_io.apply_post_ops_scalar(
        post_ops, "y", "off_dst", {name: f"off_{name}" for name in po_strides}, dst_dtype
    )
    if chain:
        lines.append(chain)
    lines.append(_dtype_io.store(dst_dtype, "dst", "off_dst", "y"))
    args = ["src"]
    if scale_stride is not None:
        args.append("scale")
    if shift_stride is not None:
        args.append("shift")
    args += ["mean", "variance", *po_strides, "dst"]
    params = _params(args, {"src": src_dtype, "dst": dst_dtype}, ("dst",))
    body = "\n    ".join(lines)
    source = _helpers(src_dtype, dst_dtype) + _post_ops.functions(post_ops) + f"""__kernel void bnorm_fwd({params}) {{
    const ulong i = get_global_id(0);
    if (i >= {elems}UL) return;
    {body}
}}
"""
    return KernelSpec(
        source=source,
        name="bnorm_fwd",
        arg_names=tuple(args),
        global_size=(padded_global(elems, local),),
        local_size=(local,),
        impl=f"ocl:per_element:l{local}",
    )


def generate_group(
    *,
    dims: tuple[int, ...],
    src_strides: tuple[int, ...],
    dst_strides: tuple[int, ...],
    groups: int,
    epsilon: float,
    scale_stride: int | None,
    shift_stride: int | None,
    config: KernelConfig,
    post_ops: tuple = (),
    src_dtype: str = "f32",
    dst_dtype: str = "f32",
) -> KernelSpec:
    """Group normalization, one work-item per (n, group): stats over the group, then write;
    ``post_ops`` (a validated chain) applied to each output before its store.
    ``src_dtype``/``dst_dtype``: storage types, the math f32."""
    _dtype_io.check_dtype("src", src_dtype)
    _dtype_io.check_dtype("dst", dst_dtype)
    N, C = dims[0], dims[1]
    cg = C // groups
    spatial = list(range(2, len(dims)))
    count = cg * math.prod(dims[2:])
    items = N * groups
    local = config.local_size
    po_strides = _post_ops.operand_strides(post_ops, len(dims))
    # Offset variables per tensor: "s" src, "d" dst, "o{j}" the j-th post-op operand; each walks
    # from its base b{key} (the group's first channel) as p{key}, then p{key}_{depth}.
    operand_keys = {name: f"o{j}" for j, name in enumerate(po_strides)}

    def loops(body: Callable[[dict[str, str]], str], tensors: dict[str, tuple[int, ...]]) -> str:
        # Channel loop outside, spatial loops inside, smallest src stride innermost. ``body``
        # gets each tensor's offset variable at the innermost level.
        order = sorted(spatial, key=lambda a: -src_strides[a])
        opens = [
            f"for (ulong cc = 0; cc < {cg}UL; ++cc) {{ const ulong c = c0 + cc;"
            + "".join(f" const ulong p{t} = b{t} + cc * {st[1]}UL;" for t, st in tensors.items())
        ]
        offset = {t: f"p{t}" for t in tensors}
        for depth, a in enumerate(order):
            opens.append(
                f"for (ulong j{depth} = 0; j{depth} < {dims[a]}UL; ++j{depth}) {{"
                + "".join(
                    f" const ulong p{t}_{depth} = {offset[t]} + j{depth} * {st[a]}UL;" for t, st in tensors.items()
                )
            )
            offset = {t: f"p{t}_{depth}" for t in tensors}
        return "\n    ".join(opens + [body(offset), "}" * len(opens)])

    def value(ps: str) -> str:
        v = f"({_dtype_io.load(src_dtype, 'src', ps)} - m) * inv"
        if scale_stride is not None:
            v = f"({v}) * scale[c * {scale_stride}UL]"
        if shift_stride is not None:
            v = f"{v} + shift[c * {shift_stride}UL]"
        return v

    def store(offset: dict[str, str]) -> str:
        chain = _dtype_io.apply_post_ops_scalar(
            post_ops, "y", offset["d"], {name: offset[key] for name, key in operand_keys.items()}, dst_dtype
        )
        return f"{{ float y = {value(offset['s'])}; {chain} {_dtype_io.store(dst_dtype, 'dst', offset['d'], 'y')} }}"

    src_only = {"s": src_strides}
    pass1 = loops(
        lambda o: f"{{ const float x = {_dtype_io.load(src_dtype, 'src', o['s'])}; {_sum_step('x', 's', 's_c')} }}",
        src_only,
    )
    pass2 = loops(
        lambda o: f"{{ const float d = {_dtype_io.load(src_dtype, 'src', o['s'])} - m; {_sum_step('d * d', 'q', 'q_c')} }}",
        src_only,
    )
    pass3 = loops(store, {"s": src_strides, "d": dst_strides,
                          **{operand_keys[name]: st for name, st in po_strides.items()}})
    operand_bases = "".join(
        f"\n    const ulong b{operand_keys[name]} = n * {st[0]}UL + c0 * {st[1]}UL;" for name, st in po_strides.items()
    )
    args = ["src"]
    if scale_stride is not None:
        args.append("scale")
    if shift_stride is not None:
        args.append("shift")
    args += list(po_strides)
    args.append("dst")
    params = _params(args, {"src": src_dtype, "dst": dst_dtype}, ("dst",))
    source = _helpers(src_dtype, dst_dtype) + _post_ops.functions(post_ops) + f"""__kernel void gnorm_fwd({params}) {{
    const ulong i = get_global_id(0);
    if (i >= {items}UL) return;
    const ulong g = i % {groups}UL;
    const ulong n = i / {groups}UL;
    const ulong c0 = g * {cg}UL;
    const ulong bs = n * {src_strides[0]}UL + c0 * {src_strides[1]}UL;
    const ulong bd = n * {dst_strides[0]}UL + c0 * {dst_strides[1]}UL;{operand_bases}
    float s = 0.0f, s_c = 0.0f;
    {pass1}
    const float m = (s + s_c) / {c_float(count)};
    float q = 0.0f, q_c = 0.0f;
    {pass2}
    const float v = (q + q_c) / {c_float(count)};
    const float inv = 1.0f / sqrt(v + {c_float(epsilon)});
    {pass3}
}}
"""
    return KernelSpec(
        source=source,
        name="gnorm_fwd",
        arg_names=tuple(args),
        global_size=(padded_global(items, local),),
        local_size=(local,),
        impl=f"ocl:per_group:l{local}",
    )


# References, float64, returned as float32. Each takes the post-op keywords of ``_post_ops``'s
# ``scaled_reference`` (``output_scale``, ``post_ops``, ``old_dst``, ``operands``) for its dst, and
# ``dst_dtype``: dst's values are stored as that type (``_dtype_io.store_reference``). ``src`` may
# hold user-facing values of any data type (bf16 as float32).

def _affine_ref(y, scale, shift, shape):
    if scale is not None:
        y = y * np.asarray(scale, np.float64).reshape(shape)
    if shift is not None:
        y = y + np.asarray(shift, np.float64).reshape(shape)
    return y


def layer_reference(src, *, axis=-1, epsilon=1e-5, scale=None, shift=None,
                    output_scale=1.0, post_ops=(), old_dst=None, operands=None, dst_dtype="f32"):
    """(dst, mean, variance) of layer normalization over ``axis``."""
    x = _dtype_io.widen(src)
    axis = axis % x.ndim
    m = x.mean(axis=axis, keepdims=True)
    v = ((x - m) ** 2).mean(axis=axis, keepdims=True)
    y = (x - m) / np.sqrt(v + float(np.float32(epsilon)))
    shape = [1] * x.ndim
    shape[axis] = x.shape[axis]
    y = _affine_ref(y, scale, shift, shape)
    y = _post_ops.scaled_reference(post_ops, y.astype(np.float32), old_dst, operands, output_scale=output_scale)
    return (_dtype_io.store_reference(y, dst_dtype), np.squeeze(m, axis).astype(np.float32),
            np.squeeze(v, axis).astype(np.float32))


def rms_reference(src, *, epsilon=1e-5, scale=None, output_scale=1.0, post_ops=(), old_dst=None, operands=None,
                  dst_dtype="f32"):
    x = _dtype_io.widen(src)
    ms = (x * x).mean(axis=-1, keepdims=True)
    y = x / np.sqrt(ms + float(np.float32(epsilon)))
    y = _affine_ref(y, scale, None, [1] * (x.ndim - 1) + [x.shape[-1]]).astype(np.float32)
    y = _post_ops.scaled_reference(post_ops, y, old_dst, operands, output_scale=output_scale)
    return _dtype_io.store_reference(y, dst_dtype)


def batch_reference(src, mean, variance, *, epsilon=1e-5, scale=None, shift=None,
                    output_scale=1.0, post_ops=(), old_dst=None, operands=None, dst_dtype="f32"):
    x = _dtype_io.widen(src)
    shape = [1] * x.ndim
    shape[1] = x.shape[1]
    m = np.asarray(mean, np.float64).reshape(shape)
    v = np.asarray(variance, np.float64).reshape(shape)
    y = (x - m) / np.sqrt(v + float(np.float32(epsilon)))
    y = _affine_ref(y, scale, shift, shape).astype(np.float32)
    y = _post_ops.scaled_reference(post_ops, y, old_dst, operands, output_scale=output_scale)
    return _dtype_io.store_reference(y, dst_dtype)


def group_reference(src, groups, *, epsilon=1e-5, scale=None, shift=None,
                    output_scale=1.0, post_ops=(), old_dst=None, operands=None, dst_dtype="f32"):
    x = _dtype_io.widen(src)
    n, c = x.shape[:2]
    g = x.reshape((n, groups, -1))
    m = g.mean(axis=2, keepdims=True)
    v = ((g - m) ** 2).mean(axis=2, keepdims=True)
    y = ((g - m) / np.sqrt(v + float(np.float32(epsilon)))).reshape(x.shape)
    shape = [1] * x.ndim
    shape[1] = c
    y = _affine_ref(y, scale, shift, shape).astype(np.float32)
    y = _post_ops.scaled_reference(post_ops, y, old_dst, operands, output_scale=output_scale)
    return _dtype_io.store_reference(y, dst_dtype)

"""Normalization forward (inference): layer, RMS, batch (given statistics) and group normalization.

Generators beside their OpenCL sources, the float64 references and the thresholds.

* layer: ``y = (x - mean) / sqrt(var + eps) * scale + shift`` over one axis (oneDNN's layer
  normalization normalises the last one; any axis is accepted here), mean and biased variance
  computed per row and optionally written out (oneDNN's forward-training outputs).
* rms: ``y = x / sqrt(mean(x^2) + eps) * scale`` over the last axis (oneDNN's ``rms_norm`` flag).
* batch (inference, oneDNN's ``use_global_stats``): per channel (dim 1) with given mean and
  variance: ``y = scale / sqrt(var + eps) * (x - mean) + shift``, oneDNN's reference order.
* group: ``(N, C, spatial...)``, C split into ``groups``; stats over (C/groups x spatial) per
  (n, group), then per-channel scale and shift; mean and variance optionally written out.
* rms optionally writes each row's ``1 / sqrt(mean(x^2) + eps)`` (``rrms``).

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

Kernel arguments, in order, of those present: src, scale, shift, mean, variance (or rrms), the
post-op operands ``post_op_{i}_src1``, dst.

``src`` and ``dst`` each have any storage type of ``_dtype_io.DTYPES`` (f32 math: loads convert to
float, the store converts to dst's type); scale, shift, mean and variance are f32, as oneDNN's,
and so are post-op operands. The all-f32 kernels are the plain ones.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from .._values._normalization_desc import BatchNormInferenceDesc, GroupNormDesc, LayerNormDesc, RMSNormDesc
from . import _dtype_io, _post_ops, _row_vector, _wg_reduce
from ._post_ops import generate_scaled
from ._registry import register
from ._row_vector import kahan_step
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


def _spec(
    desc, post_ops: tuple, name: str, inside: str, *, work_items: int, local: int, impl: str,
    types: tuple[str, ...] = ("float",), attribute: str = "",
) -> KernelSpec:
    """The spec of kernel ``name`` of ``desc`` whose body is ``inside`` (lines, each ending in a
    newline): the storage types' helpers, the chain's functions (for ``types``), then the kernel.

    Its arguments are ``desc.arg_descs``' but for the operands, named after ``post_ops`` (the
    chain the kernel gets: a leading output scale shifts the operands' numbers, and
    ``generate_scaled`` renames them back); src and dst take their storage types, every other
    argument is f32; outputs are not const. No restrict: in place, src and dst are one buffer."""
    present = [arg for arg in desc.ARGS if arg.name != "dst" and getattr(desc, arg.name) is not None]
    args = (*(arg.name for arg in present), *_post_ops.operands(post_ops), "dst")
    outputs = {arg.name for arg in desc.ARGS if arg.output}
    dtypes = {"src": desc.src.dtype, "dst": desc.dst.dtype}
    params = ", ".join(_dtype_io.param(dtypes.get(a, "f32"), a, const=a not in outputs) for a in args)
    source = (
        _dtype_io.functions(loads=(desc.src.dtype, desc.dst.dtype), stores=(desc.dst.dtype,))
        + _post_ops.functions(post_ops, types)
        + f"__kernel {attribute}void {name}({params}) {{\n{inside}}}\n"
    )
    return KernelSpec(
        source=source, name=name, arg_names=args, global_size=(work_items,), local_size=(local,), impl=impl,
    )


def generate_layer(desc: LayerNormDesc, config: KernelConfig) -> KernelSpec:
    """Layer normalization over ``desc.axis``, writing the statistics outputs present; the
    post-op chain (the output scale leading, ``generate_scaled``) applied to each output before
    its store. src and dst of any storage types, the math f32."""
    desc.check_supported()
    return generate_scaled(lambda chain: _Rows(desc, chain, config).kernel(), desc.post_ops, desc.output_scale)


def generate_rms(desc: RMSNormDesc, config: KernelConfig) -> KernelSpec:
    """RMS normalization over the last axis, as ``generate_layer``."""
    desc.check_supported()
    return generate_scaled(lambda chain: _Rows(desc, chain, config).kernel(), desc.post_ops, desc.output_scale)


# Rows per work-item on the vector path: short rows are grouped so that each work-item walks
# about this many elements, as long as every one of the two cores still gets many work-items.
_VECTOR_ROW_ELEMENTS = 512
_VECTOR_MIN_ITEMS = 64


class _Rows:
    """Layer or RMS normalization of ``desc`` with the chain ``post_ops``: the row geometry and the
    passes its three kernels share. ``kernel`` picks one: a work-group per row on the GPU
    configuration (``_wg_reduce``), rows walked a vector at a time on the CPU's where they are
    aligned (``_row_vector``), else one work-item per row, element by element.

    Each pass is the same in all three; only how a row's sum is taken (``average``), how an
    element is loaded, and how the kernel is laid out differ."""

    def __init__(self, desc: LayerNormDesc | RMSNormDesc, post_ops: tuple, config: KernelConfig):
        self.desc, self.post_ops, self.config = desc, post_ops, config
        self.rms = isinstance(desc, RMSNormDesc)
        dims = desc.src.dims
        axis = desc.axis if isinstance(desc, LayerNormDesc) else len(dims) - 1  # RMS: the last
        self.n = dims[axis]
        self.other_dims = dims[:axis] + dims[axis + 1:]
        self.rows = math.prod(self.other_dims)
        # Strides of each tensor indexed by row (the axis dropped); the statistics have no axis.
        tensors = {"src": desc.src.strides[:axis] + desc.src.strides[axis + 1:],
                   "dst": desc.dst.strides[:axis] + desc.dst.strides[axis + 1:]}
        self.stats = tuple(name for name in (("rrms",) if self.rms else ("mean", "variance"))
                           if getattr(desc, name, None) is not None)
        tensors.update({name: getattr(desc, name).strides for name in self.stats})
        po_strides = _post_ops.operand_strides(post_ops, len(dims))
        tensors.update({name: st[:axis] + st[axis + 1:] for name, st in po_strides.items()})
        self.tensors = tensors
        self.po_axis = {name: st[axis] for name, st in po_strides.items()}
        self.offsets = index_code(self.other_dims, tensors, "row")
        self.ss, self.ds = desc.src.strides[axis], desc.dst.strides[axis]
        self.params = {name: getattr(desc, name).strides[0] for name in ("scale", "shift")
                       if getattr(desc, name, None) is not None}
        self.name = "rmsnorm_fwd" if self.rms else "lnorm_fwd"

    def kernel(self) -> KernelSpec:
        config = self.config
        if _wg_reduce.use_work_group(config, self.n, self.rows, self.ss, self.other_dims, self.tensors["src"]):
            return self._work_group()
        vec = 1
        if config.vector_width >= 16:
            vec = _row_vector.vector_width(self.n, (self.tensors["src"], self.tensors["dst"]), (self.ss, self.ds),
                                           self.other_dims, config.vector_width)
        return self._vector(vec) if vec > 1 else self._row()

    def statistics(self, average: Callable[[str, str, str, str], list[str]], load: str, x: str, centred: str,
                   guard: str = "") -> list[str]:
        """Lines leaving ``inv``, 1 / the row's RMS or standard deviation, and (layer) ``m``, its
        mean, with the statistics outputs written (each write prefixed by ``guard``).

        ``average(load, term, acc, out)``: lines declaring float ``out``, the mean of ``term``
        over the row, each element loaded by ``load`` (accumulators named from ``acc``); ``x``
        the loaded element, ``centred`` the statement declaring ``d = x - m``. Layer takes two
        passes for the variance: no cancellation of E[x^2] - mean^2."""
        eps = c_float(self.desc.epsilon)
        if self.rms:
            lines = average(load, f"{x} * {x}", "sq", "ms") + [f"const float inv = 1.0f / sqrt(ms + {eps});"]
            return lines + [f"{guard}rrms[off_rrms] = inv;" for _ in self.stats]
        lines = average(load, x, "s", "m") + average(centred, "d * d", "q", "v")
        lines += [f"{guard}{name}[off_{name}] = {var};" for name, var in (("mean", "m"), ("variance", "v"))
                  if name in self.stats]
        return lines + [f"const float inv = 1.0f / sqrt(v + {eps});"]

    def value(self, x: str, m: str, inv: str, param: Callable[[str, int], str]) -> str:
        """The normalised element ``x`` (``m`` the mean, ``inv`` as ``statistics``), times scale
        plus shift where present, ``param(name, stride)`` the parameter's element."""
        value = f"{x} * {inv}" if self.rms else f"({x} - {m}) * {inv}"
        if "scale" in self.params:
            value = f"({value}) * {param('scale', self.params['scale'])}"
        if "shift" in self.params:
            value = f"{value} + {param('shift', self.params['shift'])}"
        return value

    def write(self, value: str) -> str:
        """Statements storing ``value`` as element ``k`` of the row's dst, the chain applied."""
        dst_k = f"off_dst + k * {self.ds}UL"
        dst_dtype = self.desc.dst.dtype
        chain = _dtype_io.apply_post_ops_scalar(
            self.post_ops, "y", dst_k, {name: f"off_{name} + k * {st}UL" for name, st in self.po_axis.items()},
            dst_dtype,
        )
        return f"float y = {value}; {chain} {_dtype_io.store(dst_dtype, 'dst', dst_k, 'y')}"

    def _row(self) -> KernelSpec:
        """One work-item per row, element by element."""
        n, local = self.n, self.config.local_size
        x_at = _dtype_io.load(self.desc.src.dtype, "src", f"off_src + k * {self.ss}UL")

        def average(load: str, term: str, acc: str, out: str) -> list[str]:
            return [
                f"float {acc} = 0.0f, {acc}_c = 0.0f;",
                f"for (ulong k = 0; k < {n}UL; ++k) {{ {load} {_sum_step(term, acc, f'{acc}_c')} }}",
                f"const float {out} = ({acc} + {acc}_c) / {c_float(n)};",
            ]

        lines = self.statistics(average, f"const float x = {x_at};", "x", f"const float d = {x_at} - m;")
        value = self.value(x_at, "m", "inv", lambda name, stride: f"{name}[k * {stride}UL]")
        lines.append(f"for (ulong k = 0; k < {n}UL; ++k) {{ {self.write(value)} }}")
        body = "\n    ".join(lines)
        inside = (f"    const ulong row = get_global_id(0);\n    if (row >= {self.rows}UL) return;\n"
                  f"    {self.offsets}\n    {body}\n")
        return _spec(self.desc, self.post_ops, self.name, inside, work_items=padded_global(self.rows, local),
                     local=local, impl=f"ocl:row:v1l{local}")

    def _vector(self, vec: int) -> KernelSpec:
        """The CPU configuration's rows, walked ``vec`` elements at a time (see ``_row_vector``).
        Each sum is a Kahan sum per lane folded by compensated halving. Short rows: several per
        work-item. In place is safe as in the row kernel: the writing pass reads each chunk right
        before writing it."""
        n, rows, local = self.n, self.rows, self.config.local_size
        T = VECTOR_TYPES[vec]
        chunks = n // vec
        per_item = max(1, min(_VECTOR_ROW_ELEMENTS // n, rows // (_VECTOR_MIN_ITEMS * local)))
        items = -(-rows // per_item)
        xs_decl, xd_decl, xs_k, xd_k = _row_vector.row_pointers(self.desc.src.dtype, self.desc.dst.dtype, vec)
        fold = _row_vector.sum_fold_code(vec)
        zero = f"({T})(0.0f)"

        def average(load: str, term: str, acc: str, out: str) -> list[str]:
            # The lanes' sums are sv and cv whatever ``acc``; ``out`` is declared before.
            return [(
                f"{{ {T} sv = {zero}, cv = {zero};\n"
                f"        for (ulong k = 0; k < {chunks}UL; ++k) {{ {load} {kahan_step('sv', 'cv', term, T)} }}\n"
                "        cv = -cv;  /* Kahan keeps minus the lost low parts; the fold adds error terms */\n"
                f"        float s;\n        {fold}\n        {out} = s / {c_float(n)}; }}"
            )]

        lines = [xs_decl, xd_decl, "float ms;" if self.rms else "float m, v;"]
        lines += self.statistics(average, f"const {T} x = {xs_k};", "x", f"const {T} d = {xs_k} - ({T})(m);")
        value = self.value(xs_k, f"({T})(m)", f"({T})(inv)",
                           lambda name, stride: _row_vector.gather(name, stride, vec))
        chain = _post_ops.apply(
            self.post_ops, "y", T, xd_k, lambda name: _row_vector.gather(name, self.po_axis[name], vec, f"off_{name}")
        )
        store = _row_vector.store_chunk(self.desc.dst.dtype, vec, "y")
        lines.append(f"for (ulong k = 0; k < {chunks}UL; ++k) {{ {T} y = {value}; {chain} {store} }}")
        body = "\n        ".join(lines)
        if per_item == 1:
            head = f"const ulong row = get_global_id(0);\n    if (row >= {rows}UL) return;\n    {{"
        else:
            head = (
                f"for (ulong rr = 0; rr < {per_item}UL; ++rr) {{\n"
                f"        const ulong row = get_global_id(0) * {per_item}UL + rr;\n"
                f"        if (row >= {rows}UL) return;"
            )
        inside = f"    {head}\n        {self.offsets}\n        {body}\n    }}\n"
        return _spec(self.desc, self.post_ops, self.name, inside, work_items=padded_global(items, local),
                     local=local, impl=f"ocl:row:v{vec}l{local}" + (f"r{per_item}" if per_item > 1 else ""),
                     types=(T,))

    def _work_group(self) -> KernelSpec:
        """One work-group per row (see ``_wg_reduce``): each sum a work-group sum of compensated
        partial sums, then every work-item writes its elements. Rows of up to ``CACHE_MAX``
        elements per work-item stay in registers, so src is read once. In place is safe: a
        work-item reads and writes only its own elements, each read before its write."""
        n = self.n
        local = _wg_reduce.local_size(n, self.config)
        per = _wg_reduce.per_item(n, local)
        cached = per <= _wg_reduce.CACHE_MAX
        x_k = _dtype_io.load(self.desc.src.dtype, "src", f"off_src + k * {self.ss}UL")
        x = "xv[j]" if cached else "x"
        load = f"xv[j] = {x_k};" if cached else f"const float x = {x_k};"
        reload = "" if cached else load  # passes after the first: the value is in registers, or reloaded

        def average(load: str, term: str, acc: str, out: str) -> list[str]:
            return [
                f"float {acc} = 0.0f, {acc}_c = 0.0f;",
                _wg_reduce.loop(n, local, cached, f"{load} {_sum_step(term, acc, f'{acc}_c')}"),
                _wg_reduce.sum_code(acc, f"{acc}_c", f"{acc}_total", local),
                f"const float {out} = {acc}_total / {c_float(n)};",
            ]

        lines = [f"float xv[{per}];"] if cached else []
        lines += self.statistics(average, load, x, f"{reload} const float d = {x} - m;", guard="if (lid == 0) ")
        value = self.value(x, "m", "inv", lambda name, stride: f"{name}[k * {stride}UL]")
        lines.append(_wg_reduce.loop(n, local, cached, f"{reload} {self.write(value)}"))
        body = "\n    ".join(lines)
        inside = (
            f"    {_wg_reduce.declarations(local)}\n"
            "    const ulong row = get_group_id(0);\n"
            f"    if (row >= {self.rows}UL) return;  /* the whole work-group: no barrier is left waiting */\n"
            f"    {self.offsets}\n    {body}\n"
        )
        return _spec(self.desc, self.post_ops, self.name, inside, work_items=max(1, self.rows) * local, local=local,
                     impl=f"ocl:wg_row:l{local}" + (f"r{per}" if cached else ""), attribute=_wg_reduce.attribute(local))


def generate_batch(desc: BatchNormInferenceDesc, config: KernelConfig) -> KernelSpec:
    """Batch normalization inference over channel dim 1, one work-item per element; the post-op
    chain (the output scale leading) applied to each output before its store. src and dst of any
    storage types, the math f32."""
    desc.check_supported()
    return generate_scaled(lambda chain: _batch(desc, chain, config), desc.post_ops, desc.output_scale)


def _batch(desc: BatchNormInferenceDesc, post_ops: tuple, config: KernelConfig) -> KernelSpec:
    dims, src_strides, dst_strides = desc.src.dims, desc.src.strides, desc.dst.strides
    src_dtype, dst_dtype = desc.src.dtype, desc.dst.dtype
    eps = c_float(desc.epsilon)
    mean_stride, variance_stride = desc.mean.strides[0], desc.variance.strides[0]
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
    sm = f"1.0f / sqrt(variance[c * {variance_stride}UL] + {eps})"
    if desc.scale is not None:
        sm = f"scale[c * {desc.scale.strides[0]}UL] / sqrt(variance[c * {variance_stride}UL] + {eps})"
    expr = f"sm * ({_dtype_io.load(src_dtype, 'src', 'off_src')} - mean[c * {mean_stride}UL])"
    if desc.shift is not None:
        expr = f"{expr} + shift[c * {desc.shift.strides[0]}UL]"
    lines.append(f"const float sm = {sm};")
    lines.append(f"float y = {expr};")
    chain = _dtype_io.apply_post_ops_scalar(
        post_ops, "y", "off_dst", {name: f"off_{name}" for name in po_strides}, dst_dtype
    )
    if chain:
        lines.append(chain)
    lines.append(_dtype_io.store(dst_dtype, "dst", "off_dst", "y"))
    body = "\n    ".join(lines)
    inside = f"    const ulong i = get_global_id(0);\n    if (i >= {elems}UL) return;\n    {body}\n"
    return _spec(desc, post_ops, "bnorm_fwd", inside, work_items=padded_global(elems, local), local=local,
                 impl=f"ocl:per_element:l{local}")


def generate_group(desc: GroupNormDesc, config: KernelConfig) -> KernelSpec:
    """Group normalization, one work-item per (n, group): stats over the group, then write; the
    post-op chain (the output scale leading) applied to each output before its store. src and dst
    of any storage types, the math f32."""
    desc.check_supported()
    return generate_scaled(lambda chain: _group(desc, chain, config), desc.post_ops, desc.output_scale)


def _group(desc: GroupNormDesc, post_ops: tuple, config: KernelConfig) -> KernelSpec:
    dims, src_strides, dst_strides = desc.src.dims, desc.src.strides, desc.dst.strides
    src_dtype, dst_dtype, groups = desc.src.dtype, desc.dst.dtype, desc.groups
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
        if desc.scale is not None:
            v = f"({v}) * scale[c * {desc.scale.strides[0]}UL]"
        if desc.shift is not None:
            v = f"{v} + shift[c * {desc.shift.strides[0]}UL]"
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
    stats = "".join(
        f"\n    {name}[n * {md.strides[0]}UL + g * {md.strides[1]}UL] = {var};"
        for name, var in (("mean", "m"), ("variance", "v")) if (md := getattr(desc, name)) is not None
    )
    operand_bases = "".join(
        f"\n    const ulong b{operand_keys[name]} = n * {st[0]}UL + c0 * {st[1]}UL;" for name, st in po_strides.items()
    )
    inside = f"""    const ulong i = get_global_id(0);
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
    const float inv = 1.0f / sqrt(v + {c_float(desc.epsilon)});{stats}
    {pass3}
"""
    return _spec(desc, post_ops, "gnorm_fwd", inside, work_items=padded_global(items, local), local=local,
                 impl=f"ocl:per_group:l{local}")


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


def rms_statistics_reference(src, *, epsilon=1e-5) -> np.ndarray:
    """rrms of RMS normalization: each row's ``1 / sqrt(mean(x^2) + epsilon)``, float32."""
    x = _dtype_io.widen(src)
    return (1.0 / np.sqrt((x * x).mean(axis=-1) + float(np.float32(epsilon)))).astype(np.float32)


def group_statistics_reference(src, groups) -> tuple[np.ndarray, np.ndarray]:
    """(mean, variance) of group normalization, dims ``(N, groups)``, float32."""
    x = _dtype_io.widen(src)
    g = x.reshape((x.shape[0], groups, -1))
    m = g.mean(axis=2)
    v = ((g - m[..., None]) ** 2).mean(axis=2)
    return m.astype(np.float32), v.astype(np.float32)


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


# The registry's references: dst of a descriptor from ``{argument name: array}`` (``inputs["dst"]``,
# dst's old value, for a sum post-op; the binary operands by argument name).

def _attributes(desc, inputs: dict[str, np.ndarray]) -> dict:
    """The references' keywords for dst: output scale, post-ops, their operands, dst's type."""
    return {"output_scale": desc.output_scale, "post_ops": desc.post_ops, "old_dst": inputs.get("dst"),
            "operands": inputs, "dst_dtype": desc.dst.dtype}


def layer_desc_reference(desc: LayerNormDesc, inputs: dict[str, np.ndarray]) -> np.ndarray:
    return layer_reference(inputs["src"], axis=desc.axis, epsilon=desc.epsilon, scale=inputs.get("scale"),
                           shift=inputs.get("shift"), **_attributes(desc, inputs))[0]


def rms_desc_reference(desc: RMSNormDesc, inputs: dict[str, np.ndarray]) -> np.ndarray:
    return rms_reference(inputs["src"], epsilon=desc.epsilon, scale=inputs.get("scale"), **_attributes(desc, inputs))


def batch_desc_reference(desc: BatchNormInferenceDesc, inputs: dict[str, np.ndarray]) -> np.ndarray:
    return batch_reference(inputs["src"], inputs["mean"], inputs["variance"], epsilon=desc.epsilon,
                           scale=inputs.get("scale"), shift=inputs.get("shift"), **_attributes(desc, inputs))


def group_desc_reference(desc: GroupNormDesc, inputs: dict[str, np.ndarray]) -> np.ndarray:
    return group_reference(inputs["src"], desc.groups, epsilon=desc.epsilon, scale=inputs.get("scale"),
                           shift=inputs.get("shift"), **_attributes(desc, inputs))


# The thresholds above, which kernels/tolerance.py's ``normalization`` returns too; that module
# imports this one, so importing it here would make a cycle.
register(LayerNormDesc, generate=generate_layer, reference=layer_desc_reference, tolerance=lambda desc: LNORM)
register(RMSNormDesc, generate=generate_rms, reference=rms_desc_reference, tolerance=lambda desc: RMSNORM)
register(BatchNormInferenceDesc, generate=generate_batch, reference=batch_desc_reference, tolerance=lambda desc: BNORM)
register(GroupNormDesc, generate=generate_group, reference=group_desc_reference, tolerance=lambda desc: GNORM)

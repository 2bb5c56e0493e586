"""Normalization for training: batch normalization forward training, batch and layer normalization
backward. The generators of ``BatchNormTrainingDesc``, ``BatchNormBackwardDesc`` and
``LayerNormBackwardDesc``, their float64 references and thresholds.

Each is one kernel of independent jobs, a job being one reduction and what follows from it:

* batch training: a job per channel: mean, then the biased variance (two passes: no
  cancellation of E[x^2] - mean^2), the statistics and running statistics written, then dst.
* batch backward: a job per channel: sum(diff_dst) and sum(diff_dst * (x - mean)) in one pass,
  diff_scale and diff_shift written, then diff_src.
* layer backward: a job per row (sum(g) and sum(g * xhat), then diff_src), and where diff_scale
  or diff_shift is asked for, a job per normalised element summing over the rows (the statistics
  are given, so the columns need nothing from the rows' jobs: one kernel, no second pass).

A job runs on ``lanes`` work-items: on the GPU configuration (vector width 1), jobs of 32 or more
elements take a work-group each (``_wg_reduce``: work-item ``lid`` takes elements ``lid``,
``lid + L``..., a compensated local-memory tree joins the partial sums); elsewhere (the CPU's
configuration, short jobs) one work-item walks a job alone, jobs spread over the work-items. Every
sum is compensated (TwoSum), as the forward kernels': plain f32 sums of thousands of elements drift
past benchdnn's thresholds.

Storage: src, dst, diff_dst and diff_src any of ``_dtype_io.DTYPES`` (f32 math); the parameters,
statistics and gradients of scale and shift f32. Kernel arguments: ``desc.arg_descs`` in order.
"""

from __future__ import annotations

import math

import numpy as np

from .._values._normalization_bwd_desc import BatchNormBackwardDesc, BatchNormTrainingDesc, LayerNormBackwardDesc
from . import _dtype_io, _wg_reduce
from ._registry import register
from ._spec import KernelConfig, KernelSpec, c_float, index_code, padded_global

_F32_EPS = float(np.finfo(np.float32).eps)

# Thresholds on ``|err| <= t * max(1, |ref|)``. Forward training rounds as the forward row kernels
# do (compensated statistics, one sqrt and division): their 8 eps. Backward: diff_src is a
# difference of three terms of the size of ``scale * inv * diff_dst``, each off by a few ulps
# (the sums, inv, the products); measured within 6 eps on channels of 10^4 elements with
# |diff_dst| <= 4 and inv up to 4. 16 eps leaves room for the ulps of larger terms.
TRAINING = 8 * _F32_EPS
BACKWARD = 16 * _F32_EPS


def _lanes(count: int, config: KernelConfig) -> int:
    """Work-items per job of ``count`` elements (see the module docstring)."""
    if config.vector_width != 1 or count < _wg_reduce.MIN_AXIS:
        return 1
    return max(1, _wg_reduce.local_size(count, config))


class _Jobs:
    """The kernel frame: ``jobs`` jobs on ``lanes`` work-items each, the job index ``job``, the
    lane ``lid``, and sums over a job's elements."""

    def __init__(self, jobs: int, lanes: int, config: KernelConfig):
        self.jobs, self.lanes, self.config = jobs, lanes, config

    def head(self) -> str:
        if self.lanes == 1:
            return (f"    const ulong job = get_global_id(0);\n    if (job >= {self.jobs}UL) return;\n"
                    "    const uint lid = 0;\n")
        return (f"    {_wg_reduce.declarations(self.lanes)}\n    const ulong job = get_group_id(0);\n"
                f"    if (job >= {self.jobs}UL) return;  /* the whole work-group: no barrier waits */\n")

    def loop(self, count: int, body: str) -> str:
        """``body`` for each of this lane's elements ``j`` of a job of ``count``."""
        return f"for (ulong j = lid; j < {count}UL; j += {self.lanes}UL) {{ {body} }}"

    def total(self, acc: str, result: str) -> str:
        """Declare float ``result``: the job's total of ``acc`` (with its error term ``acc_c``)."""
        if self.lanes == 1:
            return f"const float {result} = {acc} + {acc}_c;"
        return _wg_reduce.sum_code(acc, f"{acc}_c", result, self.lanes)

    def spec(self, desc, name: str, body: str, arg_dtypes: dict[str, str]) -> KernelSpec:
        args = tuple(desc.arg_descs)
        outputs = desc.output_names
        params = ", ".join(_dtype_io.param(arg_dtypes.get(a, "f32"), a, const=a not in outputs) for a in args)
        dtypes = set(arg_dtypes.values())
        attribute = _wg_reduce.attribute(self.lanes) if self.lanes > 1 else ""
        source = (_dtype_io.functions(loads=dtypes, stores=dtypes)
                  + f"__kernel {attribute}void {name}({params}) {{\n{self.head()}    {body}\n}}\n")
        if self.lanes == 1:
            local = self.config.local_size
            global_size, impl = padded_global(self.jobs, local), f"ocl:job:l{local}"
        else:
            local = self.lanes
            global_size, impl = max(1, self.jobs) * local, f"ocl:wg_job:l{local}"
        return KernelSpec(source=source, name=name, arg_names=args, global_size=(global_size,),
                          local_size=(local,), impl=impl)


def _zero(*accs: str) -> str:
    return " ".join(f"float {a} = 0.0f, {a}_c = 0.0f;" for a in accs)


def _add(acc: str, term: str) -> str:
    return _wg_reduce.two_sum_step(acc, f"{acc}_c", term)


def _without(strides: tuple[int, ...], axis: int) -> tuple[int, ...]:
    return strides[:axis] + strides[axis + 1:]


def _channel(desc, tensors: tuple[str, ...]) -> tuple[int, int, tuple[int, ...], dict]:
    """Channel count, elements per channel, the other dims and each tensor's strides over them."""
    dims = desc.src.dims
    other = _without(dims, 1)
    strides = {name: _without(getattr(desc, name).strides, 1) for name in tensors}
    return dims[1], math.prod(other), other, strides


def _param(desc, name: str, index: str, default: str) -> str:
    md = getattr(desc, name)
    return default if md is None else f"{name}[{index} * {md.strides[0]}UL]"


def _write(desc, name: str, index: str, value: str) -> str:
    md = getattr(desc, name)
    return "" if md is None else f"{name}[{index} * {md.strides[0]}UL] = {value};"


def generate_batch_training(desc: BatchNormTrainingDesc, config: KernelConfig) -> KernelSpec:
    desc.check_supported()
    channels, count, other, strides = _channel(desc, ("src", "dst"))
    frame = _Jobs(channels, _lanes(count, config), config)
    dt = {"src": desc.src.dtype, "dst": desc.dst.dtype}
    src_s1, dst_s1 = desc.src.strides[1], desc.dst.strides[1]
    x = _dtype_io.load(dt["src"], "src", f"off_src + job * {src_s1}UL")
    each = f"{index_code(other, strides, 'j')}\n    const float x = {x};"
    eps, n = c_float(desc.epsilon), c_float(count)
    keep, take = c_float(desc.momentum), c_float(1.0 - desc.momentum)
    updates = " ".join(filter(None, (
        _write(desc, "mean", "job", "m"), _write(desc, "variance", "job", "v"),
        _write(desc, "running_mean_dst", "job", f"{keep} * {_param(desc, 'running_mean', 'job', '')} + {take} * m"),
        _write(desc, "running_variance_dst", "job",
               f"{keep} * {_param(desc, 'running_variance', 'job', '')} + {take} * v"),
    )))
    y = f"(x - m) * inv * {_param(desc, 'scale', 'job', '1.0f')} + {_param(desc, 'shift', 'job', '0.0f')}"
    store = _dtype_io.store(dt["dst"], "dst", f"off_dst + job * {dst_s1}UL", "y")
    body = "\n    ".join([
        _zero("s"), frame.loop(count, f"{each} {_add('s', 'x')}"), frame.total("s", "s_total"),
        f"const float m = s_total / {n};",
        _zero("q"), frame.loop(count, f"{each} const float d = x - m; {_add('q', 'd * d')}"),
        frame.total("q", "q_total"), f"const float v = q_total / {n};",
        f"if (lid == 0) {{ {updates} }}" if updates else "",
        f"const float inv = 1.0f / sqrt(v + {eps});",
        frame.loop(count, f"{each} const float y = {y}; {store}"),
    ])
    return frame.spec(desc, "bnorm_train", body, dt)


def generate_batch_backward(desc: BatchNormBackwardDesc, config: KernelConfig) -> KernelSpec:
    desc.check_supported()
    channels, count, other, strides = _channel(desc, ("src", "diff_dst", "diff_src"))
    frame = _Jobs(channels, _lanes(count, config), config)
    dt = {"src": desc.src.dtype, "diff_dst": desc.diff_dst.dtype, "diff_src": desc.diff_src.dtype}
    x = _dtype_io.load(dt["src"], "src", f"off_src + job * {desc.src.strides[1]}UL")
    dd = _dtype_io.load(dt["diff_dst"], "diff_dst", f"off_diff_dst + job * {desc.diff_dst.strides[1]}UL")
    each = f"{index_code(other, strides, 'j')}\n    const float d = {x} - m; const float dd = {dd};"
    n = c_float(count)
    writes = " ".join(filter(None, (_write(desc, "diff_scale", "job", "dg"), _write(desc, "diff_shift", "job", "db"))))
    store = _dtype_io.store(dt["diff_src"], "diff_src", f"off_diff_src + job * {desc.diff_src.strides[1]}UL", "g")
    body = "\n    ".join([
        f"const float m = {_param(desc, 'mean', 'job', '')};",
        f"const float inv = 1.0f / sqrt({_param(desc, 'variance', 'job', '')} + {c_float(desc.epsilon)});",
        _zero("sb", "sg"), frame.loop(count, f"{each} {_add('sb', 'dd')} {_add('sg', 'dd * d')}"),
        frame.total("sb", "db"), frame.total("sg", "sg_total"), "const float dg = sg_total * inv;",
        f"if (lid == 0) {{ {writes} }}" if writes else "",
        f"const float a = db / {n}; const float b = dg * inv / {n};",
        f"const float k = {_param(desc, 'scale', 'job', '1.0f')} * inv;",
        frame.loop(count, f"{each} const float g = k * (dd - a - d * b); {store}"),
    ])
    return frame.spec(desc, "bnorm_bwd", body, dt)


def generate_layer_backward(desc: LayerNormBackwardDesc, config: KernelConfig) -> KernelSpec:
    desc.check_supported()
    dims = desc.src.dims
    n, row_dims = dims[-1], dims[:-1]
    rows = math.prod(row_dims)
    columns = n if desc.diff_scale is not None or desc.diff_shift is not None else 0
    frame = _Jobs(rows + columns, _lanes(max(n, rows if columns else 0), config), config)
    dt = {"src": desc.src.dtype, "diff_dst": desc.diff_dst.dtype, "diff_src": desc.diff_src.dtype}
    last = {name: getattr(desc, name).strides[-1] for name in dt}
    row_strides = {name: getattr(desc, name).strides[:-1] for name in dt}
    row_strides.update({name: getattr(desc, name).strides for name in ("mean", "variance")})
    eps = c_float(desc.epsilon)

    def element(name: str, k: str) -> str:
        return f"off_{name} + {k} * {last[name]}UL"

    x_k = _dtype_io.load(dt["src"], "src", element("src", "k"))
    dd_k = _dtype_io.load(dt["diff_dst"], "diff_dst", element("diff_dst", "k"))
    g = f"dd * {_param(desc, 'scale', 'k', '')}" if desc.scale is not None else "dd"
    each = f"const ulong k = j; const float xh = ({x_k} - m) * inv; const float dd = {dd_k}; const float g = {g};"
    store = _dtype_io.store(dt["diff_src"], "diff_src", element("diff_src", "k"), "ds")
    row = "\n    ".join([
        index_code(row_dims, row_strides, "job"),
        "const float m = mean[off_mean];", f"const float inv = 1.0f / sqrt(variance[off_variance] + {eps});",
        _zero("s1", "s2"), frame.loop(n, f"{each} {_add('s1', 'g')} {_add('s2', 'g * xh')}"),
        frame.total("s1", "t1"), frame.total("s2", "t2"),
        f"const float a = t1 / {c_float(n)}; const float b = t2 / {c_float(n)};",
        frame.loop(n, f"{each} const float ds = inv * (g - a - xh * b); {store}"),
    ])
    body = row
    if columns:
        column_strides = {name: row_strides[name] for name in ("src", "diff_dst", "mean", "variance")}
        x_c = _dtype_io.load(dt["src"], "src", element("src", "c"))
        dd_c = _dtype_io.load(dt["diff_dst"], "diff_dst", element("diff_dst", "c"))
        each_row = (f"{index_code(row_dims, column_strides, 'j')}\n    const float dd = {dd_c};"
                    f" const float xh = ({x_c} - mean[off_mean]) / sqrt(variance[off_variance] + {eps});")
        writes = " ".join(filter(None, (_write(desc, "diff_scale", "c", "dg"), _write(desc, "diff_shift", "c", "db"))))
        column = "\n    ".join([
            f"const ulong c = job - {rows}UL;",
            _zero("sg", "sb"), frame.loop(rows, f"{each_row} {_add('sg', 'dd * xh')} {_add('sb', 'dd')}"),
            frame.total("sg", "dg"), frame.total("sb", "db"), f"if (lid == 0) {{ {writes} }}",
        ])
        # Every work-item of a work-group takes the same branch, as its barriers need.
        body = f"if (job < {rows}UL) {{\n    {row}\n    }} else {{\n    {column}\n    }}"
    return frame.spec(desc, "lnorm_bwd", body, dt)


# -- references (float64, from user-facing values) ----------------------------------------------


def _f64(x) -> np.ndarray:
    return _dtype_io.widen(x)


def _per_channel(v, ndim: int) -> np.ndarray:
    return _f64(v).reshape((1, -1) + (1,) * (ndim - 2))


def batch_training_reference(x, *, epsilon: float, momentum: float = 0.5, scale=None, shift=None,
                             running_mean=None, running_variance=None) -> dict[str, np.ndarray]:
    """``{dst, mean, variance[, running_mean_dst, running_variance_dst]}`` of (N, C, ...) ``x``."""
    x = _f64(x)
    axes = (0, *range(2, x.ndim))
    mean = x.mean(axis=axes)
    variance = ((x - _per_channel(mean, x.ndim)) ** 2).mean(axis=axes)
    y = (x - _per_channel(mean, x.ndim)) / np.sqrt(_per_channel(variance, x.ndim) + epsilon)
    if scale is not None:
        y = y * _per_channel(scale, x.ndim)
    if shift is not None:
        y = y + _per_channel(shift, x.ndim)
    out = {"dst": y, "mean": mean, "variance": variance}
    if running_mean is not None:
        out["running_mean_dst"] = momentum * _f64(running_mean) + (1.0 - momentum) * mean
    if running_variance is not None:
        out["running_variance_dst"] = momentum * _f64(running_variance) + (1.0 - momentum) * variance
    return out


def batch_backward_reference(x, diff_dst, mean, variance, *, epsilon: float, scale=None) -> dict[str, np.ndarray]:
    """``{diff_src, diff_scale, diff_shift}`` of (N, C, ...) ``x`` (oneDNN's backward with stats)."""
    x, dd = _f64(x), _f64(diff_dst)
    axes = (0, *range(2, x.ndim))
    count = x.size // x.shape[1]
    inv = 1.0 / np.sqrt(_f64(variance) + epsilon)
    d = x - _per_channel(mean, x.ndim)
    diff_shift = dd.sum(axis=axes)
    diff_scale = (dd * d).sum(axis=axes) * inv
    k = inv if scale is None else _f64(scale) * inv
    diff_src = _per_channel(k, x.ndim) * (dd - _per_channel(diff_shift / count, x.ndim)
                                          - d * _per_channel(inv * diff_scale / count, x.ndim))
    return {"diff_src": diff_src, "diff_scale": diff_scale, "diff_shift": diff_shift}


def layer_backward_reference(x, diff_dst, mean, variance, *, epsilon: float, scale=None) -> dict[str, np.ndarray]:
    """``{diff_src, diff_scale, diff_shift}`` of layer normalization over ``x``'s last dim."""
    x, dd = _f64(x), _f64(diff_dst)
    inv = (1.0 / np.sqrt(_f64(variance) + epsilon))[..., None]
    xh = (x - _f64(mean)[..., None]) * inv
    g = dd if scale is None else dd * _f64(scale)
    n = x.shape[-1]
    diff_src = inv * (g - g.sum(axis=-1, keepdims=True) / n - xh * (g * xh).sum(axis=-1, keepdims=True) / n)
    lead = tuple(range(x.ndim - 1))
    return {"diff_src": diff_src, "diff_scale": (dd * xh).sum(axis=lead), "diff_shift": dd.sum(axis=lead)}


def batch_training_desc_reference(desc: BatchNormTrainingDesc, inputs: dict[str, np.ndarray]) -> np.ndarray:
    out = batch_training_reference(
        inputs["src"], epsilon=desc.epsilon, momentum=desc.momentum, scale=inputs.get("scale"),
        shift=inputs.get("shift"), running_mean=inputs.get("running_mean"),
        running_variance=inputs.get("running_variance"))
    return _dtype_io.store_reference(out["dst"], desc.dst.dtype)


def batch_backward_desc_reference(desc: BatchNormBackwardDesc, inputs: dict[str, np.ndarray]) -> np.ndarray:
    out = batch_backward_reference(inputs["src"], inputs["diff_dst"], inputs["mean"], inputs["variance"],
                                   epsilon=desc.epsilon, scale=inputs.get("scale"))
    return _dtype_io.store_reference(out["diff_src"], desc.diff_src.dtype)


def layer_backward_desc_reference(desc: LayerNormBackwardDesc, inputs: dict[str, np.ndarray]) -> np.ndarray:
    out = layer_backward_reference(inputs["src"], inputs["diff_dst"], inputs["mean"], inputs["variance"],
                                   epsilon=desc.epsilon, scale=inputs.get("scale"))
    return _dtype_io.store_reference(out["diff_src"], desc.diff_src.dtype)


register(BatchNormTrainingDesc, generate=generate_batch_training, reference=batch_training_desc_reference,
         tolerance=lambda desc: TRAINING)
register(BatchNormBackwardDesc, generate=generate_batch_backward, reference=batch_backward_desc_reference,
         tolerance=lambda desc: BACKWARD)
register(LayerNormBackwardDesc, generate=generate_layer_backward, reference=layer_backward_desc_reference,
         tolerance=lambda desc: BACKWARD)

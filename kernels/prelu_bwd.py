"""PReLU backward: ``diff_src`` and the reduced ``diff_weights``, the generator of
``PreluBackwardDesc`` and its float64 reference.

oneDNN's ref_prelu backward: ``diff_src = src > 0 ? diff_dst : weights * diff_dst``,
``diff_weights`` the sum of ``src > 0 ? 0 : diff_dst * src`` over the dims where the weights
broadcast. One work-item per weights element: it walks the src elements that share its slope,
writing their ``diff_src`` (each src element has exactly one slope, so no two work-items write
one element) and summing (Kahan) their ``diff_weights`` terms, a gather with no atomics. The
walk is as long as the broadcast: one element for a full-shape slope, the whole tensor for a
scalar one (no parallelism then; the graph ops' slopes are per channel or full). Dims and
strides are baked in; any storage types, f32 math.
"""

from __future__ import annotations

import math

import numpy as np

from .._values._prelu_bwd_desc import PreluBackwardDesc
from . import _dtype_io
from . import tolerance as thresholds
from ._post_ops import aligned_strides
from ._registry import register
from ._row_vector import kahan_step
from ._spec import KernelConfig, KernelSpec, index_code, padded_global


def _split(strides: tuple[int, ...], reduced: tuple[bool, ...]):
    """``strides`` as (those of the kept dims, those of the reduced dims)."""
    kept = tuple(s for s, r in zip(strides, reduced) if not r)
    return kept, tuple(s for s, r in zip(strides, reduced) if r)


def generate(desc: PreluBackwardDesc, config: KernelConfig) -> KernelSpec:
    """One weights element per work-item, looping over the src elements it broadcasts to."""
    desc.check_supported()
    dims = desc.src.dims
    nd = len(dims)
    w_strides = aligned_strides(desc.weights.dims, desc.weights.strides, nd)
    dw_strides = aligned_strides(desc.diff_weights.dims, desc.diff_weights.strides, nd)
    w_dims = (1,) * (nd - len(desc.weights.dims)) + desc.weights.dims
    reduced = tuple(w == 1 and d > 1 for w, d in zip(w_dims, dims))
    kept_dims = tuple(d for d, r in zip(dims, reduced) if not r)
    red_dims = tuple(d for d, r in zip(dims, reduced) if r)
    outer, inner = {}, {}
    for name, strides in (("src", desc.src.strides), ("dd", desc.diff_dst.strides), ("ds", desc.diff_src.strides)):
        outer[name], inner[f"i{name}"] = _split(strides, reduced)
    outer["w"] = _split(w_strides, reduced)[0]
    outer["dw"] = _split(dw_strides, reduced)[0]
    count, walk = math.prod(kept_dims), math.prod(red_dims)
    dt = {"src": desc.src.dtype, "w": desc.weights.dtype, "dd": desc.diff_dst.dtype,
          "ds": desc.diff_src.dtype, "dw": desc.diff_weights.dtype}
    x = _dtype_io.load(dt["src"], "src", "off_src + off_isrc")
    dd = _dtype_io.load(dt["dd"], "diff_dst", "off_dd + off_idd")
    local = config.local_size
    source = (
        _dtype_io.functions(loads=(dt["src"], dt["w"], dt["dd"]), stores=(dt["ds"], dt["dw"]))
        + f"__kernel void prelu_bwd({_dtype_io.param(dt['src'], 'src', const=True)},"
        f" {_dtype_io.param(dt['w'], 'weights', const=True)},"
        f" {_dtype_io.param(dt['dd'], 'diff_dst', const=True)},"
        f" {_dtype_io.param(dt['ds'], 'diff_src', const=False)},"
        f" {_dtype_io.param(dt['dw'], 'diff_weights', const=False)}) {{\n"
        "    const ulong gid = get_global_id(0);\n"
        f"    if (gid >= {count}UL) return;\n"
        f"    {index_code(kept_dims, outer, 'gid')}\n"
        f"    const float w = {_dtype_io.load(dt['w'], 'weights', 'off_w')};\n"
        "    float s = 0.0f, s_c = 0.0f;\n"
        f"    for (ulong k = 0; k < {walk}UL; ++k) {{\n"
        f"    {index_code(red_dims, inner, 'k')}\n"
        f"    const float x = {x};\n"
        f"    const float dd = {dd};\n"
        f"    {_dtype_io.store(dt['ds'], 'diff_src', 'off_ds + off_ids', 'x > 0.0f ? dd : w * dd')}\n"
        f"    {kahan_step('s', 's_c', 'x > 0.0f ? 0.0f : dd * x')}\n"
        "    }\n"
        f"    {_dtype_io.store(dt['dw'], 'diff_weights', 'off_dw', 's - s_c')}\n"
        "}\n"
    )
    return KernelSpec(
        source=source,
        name="prelu_bwd",
        arg_names=("src", "weights", "diff_dst", "diff_src", "diff_weights"),
        global_size=(padded_global(count, local),),
        local_size=(local,),
        impl=f"ocl:prelu_bwd:l{local}",
    )


def reference(src: np.ndarray, weights: np.ndarray, diff_dst: np.ndarray, *, diff_src_dtype: str = "f32",
              diff_weights_dtype: str = "f32") -> tuple[np.ndarray, np.ndarray]:
    """``(diff_src, diff_weights)`` of user-facing values in float64, ``weights`` broadcasting
    to ``src`` by numpy's rules, each stored as its data type."""
    x, dd = _dtype_io.widen(src), _dtype_io.widen(diff_dst)
    w = _dtype_io.widen(weights)
    padded = (1,) * (x.ndim - w.ndim) + w.shape
    with np.errstate(all="ignore"):
        diff_src = np.where(x > 0, dd, np.broadcast_to(w.reshape(padded), x.shape) * dd)
        terms = np.where(x > 0, 0.0, dd * x)
    axes = tuple(i for i, (p, d) in enumerate(zip(padded, x.shape)) if p == 1 and d > 1)
    diff_w = np.sum(terms, axis=axes, keepdims=True).reshape(w.shape)
    return (_dtype_io.store_reference(diff_src.astype(np.float32), diff_src_dtype),
            _dtype_io.store_reference(diff_w.astype(np.float32), diff_weights_dtype))


def desc_reference(desc: PreluBackwardDesc, inputs: dict[str, np.ndarray]) -> np.ndarray:
    """diff_src of ``desc`` (``desc_references`` gives both outputs)."""
    return desc_references(desc, inputs)[0]


def desc_references(desc: PreluBackwardDesc, inputs: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    return reference(inputs["src"], inputs["weights"], inputs["diff_dst"], diff_src_dtype=desc.diff_src.dtype,
                     diff_weights_dtype=desc.diff_weights.dtype)


def threshold(desc: PreluBackwardDesc) -> float:
    """diff_src: one product, rounded once. diff_weights: a compensated sum of such products,
    within a few roundings whatever its length."""
    return 4 * thresholds.BINARY


register(PreluBackwardDesc, generate=generate, reference=desc_reference, tolerance=threshold)

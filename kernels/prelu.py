"""PReLU forward: ``dst = src >= 0 ? src : weights * src``, the generator of ``PreluDesc`` and
its float64 reference.

One work-item per element; the weights' strides are 0 on the dims where they broadcast, so one
index decomposition serves every broadcast (channel-wise, shared, whole tensor). Dims and
strides are baked into the source. ``src >= 0`` keeps -0.0 and NaN as they are (NaN compares
false and becomes ``weights * NaN``, NaN again), as oneDNN's reference.
"""

from __future__ import annotations

import math

import numpy as np

from .._values._prelu_desc import PreluDesc
from . import _dtype_io
from . import tolerance as thresholds
from ._post_ops import aligned_strides
from ._registry import register
from ._spec import KernelConfig, KernelSpec, index_code, padded_global


def generate(desc: PreluDesc, config: KernelConfig) -> KernelSpec:
    """One element per work-item over dst's dims; src, weights and dst each any storage type."""
    desc.check_supported()
    dims = desc.dst.dims
    total = math.prod(dims)
    ndims = len(dims)
    offsets = index_code(dims, {
        "src": desc.src.strides,
        "wei": aligned_strides(desc.weights.dims, desc.weights.strides, ndims),
        "dst": desc.dst.strides,
    }, "gid")
    dtypes = (desc.src.dtype, desc.weights.dtype, desc.dst.dtype)
    x = _dtype_io.load(desc.src.dtype, "src", "off_src")
    w = _dtype_io.load(desc.weights.dtype, "weights", "off_wei")
    local = config.local_size
    source = (
        _dtype_io.functions(loads=dtypes[:2], stores=dtypes[2:])
        + f"__kernel void prelu_fwd({_dtype_io.param(dtypes[0], 'src', const=True)},"
        f" {_dtype_io.param(dtypes[1], 'weights', const=True)},"
        f" {_dtype_io.param(dtypes[2], 'dst', const=False)}) {{\n"
        "    const ulong gid = get_global_id(0);\n"
        f"    if (gid >= {total}UL) return;\n"
        f"    {offsets}\n"
        f"    const float x = {x};\n"
        f"    const float y = x >= 0.0f ? x : {w} * x;\n"
        f"    {_dtype_io.store(dtypes[2], 'dst', 'off_dst', 'y')}\n"
        "}\n"
    )
    return KernelSpec(
        source=source,
        name="prelu_fwd",
        arg_names=("src", "weights", "dst"),
        global_size=(padded_global(total, local),),
        local_size=(local,),
        impl=f"ocl:prelu:l{local}",
    )


def reference(src: np.ndarray, weights: np.ndarray, dst_dtype: str = "f32") -> np.ndarray:
    """PReLU of user-facing ``src`` with ``weights`` broadcast to it (numpy rules), in float64,
    stored as ``dst_dtype``."""
    x = _dtype_io.widen(src)
    w = np.broadcast_to(_dtype_io.widen(weights), x.shape)
    with np.errstate(all="ignore"):
        y = np.where(x >= 0, x, w * x)
    return _dtype_io.store_reference(y.astype(np.float32), dst_dtype)


def desc_reference(desc: PreluDesc, inputs: dict[str, np.ndarray]) -> np.ndarray:
    return reference(inputs["src"], inputs["weights"], desc.dst.dtype)


# One f32 product rounded once: the binary threshold.
register(PreluDesc, generate=generate, reference=desc_reference, tolerance=lambda desc: thresholds.BINARY)

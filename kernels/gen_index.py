"""GenIndex (oneDNN Graph): ``dst[i0, ..., in] = i_axis``, the coordinate along ``axis``.

Attention graphs build implicit causal masks from two of these and a GreaterEqual. One work-item
per element; dims and strides are baked into the source, so the kernel takes the buffer only.
"""

from __future__ import annotations

import math

import numpy as np

from .._values._gen_index_desc import GenIndexDesc
from ._registry import register
from ._spec import KernelConfig, KernelSpec, padded_global

# The OpenCL type of each dst data type the descriptor accepts (its GEN_INDEX_DTYPES).
DTYPES: dict[str, str] = {"s32": "int", "f32": "float"}


def generate(desc: GenIndexDesc, config: KernelConfig) -> KernelSpec:
    desc.check_supported()
    dims, dst_strides, axis, dtype = desc.dst.dims, desc.dst.strides, desc.axis, desc.dst.dtype
    total = math.prod(dims)
    lines = []
    for d in reversed(range(len(dims))):
        if dims[d] == 1:
            continue
        lines.append(f"{{ const ulong c = r % {dims[d]}UL; r /= {dims[d]}UL; off += c * {dst_strides[d]}UL;"
                     + (" index = c;" if d == axis else "") + " }")
    body = "\n    ".join(lines)
    ctype = DTYPES[dtype]
    source = f"""
__kernel void gen_index(__global {ctype}* dst) {{
    const ulong gid = get_global_id(0);
    if (gid >= {total}UL) return;
    ulong r = gid, off = 0, index = 0;
    {body}
    dst[off] = ({ctype})index;
}}
"""
    local = min(config.local_size * max(1, config.vector_width // 16), 256)
    return KernelSpec(
        source=source,
        name="gen_index",
        arg_names=("dst",),
        global_size=(padded_global(total, local),),
        local_size=(local,),
        impl=f"ocl:gen_index:l{local}",
    )


def reference(dims: tuple[int, ...], axis: int, dtype: str = "s32") -> np.ndarray:
    shape = [1] * len(dims)
    shape[axis] = dims[axis]
    index = np.arange(dims[axis]).reshape(shape)
    return np.broadcast_to(index, dims).astype(np.int32 if dtype == "s32" else np.float32)


def desc_reference(desc: GenIndexDesc, inputs: dict[str, np.ndarray]) -> np.ndarray:
    """dst of ``desc``: it has no inputs."""
    return reference(desc.dst.dims, desc.axis, desc.dst.dtype)


# Each element is its coordinate, exactly.
register(GenIndexDesc, generate=generate, reference=desc_reference, tolerance=lambda desc: 0.0)

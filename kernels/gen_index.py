"""GenIndex (oneDNN Graph): ``dst[i0, ..., in] = i_axis``, the coordinate along ``axis``.

Attention graphs build implicit causal masks from two of these and a GreaterEqual. One work-item
per element; dims and strides are baked into the source, so the kernel takes the buffer only.
"""

from __future__ import annotations

import math

import numpy as np

from ._spec import KernelConfig, KernelSpec, padded_global

DTYPES = {"s32": "int", "f32": "float"}


def generate(*, dims: tuple[int, ...], dst_strides: tuple[int, ...], axis: int, dtype: str,
             config: KernelConfig) -> KernelSpec:
    if dtype not in DTYPES:
        raise ValueError(f"GenIndex dst dtype {dtype!r} is not one of {', '.join(DTYPES)}")
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

"""Shared by the GPU matmul kernel tests of this folder (``from _gpu_matmul import ...``, as the
primitives tests import ``_sweeps``): the GPU kernel configuration, an engine fixture that uses
it, and one execution of a descriptor with its dst read back."""

from __future__ import annotations

import attrs
import numpy as np
import pyopencl as cl
import pytest

from triodnn.actors import build_program
from triodnn.kernels import KernelConfig, _dtype_io

GPU = KernelConfig(vector_width=1, local_size=256, local_memory=48 * 1024)  # what NVIDIA reports


def ints(rng, shape, dtype: str = "f32", bound: int = 4) -> np.ndarray:
    """Small integers (nonnegative for u8) as ``dtype``'s user-facing numpy type: exact in every
    type the matmul kernels read, so f32 sums of them are exact too."""
    x = rng.integers(0 if dtype == "u8" else -bound, bound + 1, shape)
    return x.astype(_dtype_io.USER_NUMPY[dtype])


# Imported by the test modules under this name; tests ask for it as ``gpu_shaped``.
@pytest.fixture(name="gpu_shaped")
async def gpu_shaped_fixture(engine):
    """The default engine with the GPU kernel configuration (this test's own engine), within the
    local memory the device offers (Oclgrind: the OpenCL minimum, 32 KiB)."""
    engine._config = attrs.evolve(GPU, local_memory=min(GPU.local_memory, engine._config.local_memory))
    return engine


async def execute(engine, desc, arrays: dict, dst_init=None):
    """Run ``desc``: inputs from ``arrays``, dst filled with ``dst_init`` when given, every other
    argument allocated. Returns (primitive, dst)."""
    primitive = await engine.create_primitive(desc)
    memories = {}
    for name, md in desc.arg_descs.items():
        if name in arrays:
            memories[name] = await engine.from_numpy(arrays[name], md)
        elif name == "dst" and dst_init is not None:
            memories[name] = await engine.from_numpy(dst_init, md)
        else:
            memories[name] = engine.memory(md)
    await (await engine.stream()).execute(primitive, memories)
    return primitive, await memories["dst"].to_numpy()


def run_spec(engine, spec, arrays: dict, out_shape, out_dtype=np.float32) -> np.ndarray:
    """Run a KernelSpec directly on the engine's context: ``arrays`` dense buffers by argument
    name as stored (f32, or a bf16 tensor's uint16 bits), dst read back as ``out_dtype``. The
    tile tests run each tile so, since the primitive cache gives one kernel per descriptor."""
    ctx = engine.cl_context
    queue = cl.CommandQueue(ctx)
    mf = cl.mem_flags
    buffers = [cl.Buffer(ctx, mf.READ_ONLY | mf.COPY_HOST_PTR, hostbuf=np.ascontiguousarray(arrays[name]))
               for name in spec.arg_names[:-1]]
    out = np.empty(out_shape, out_dtype)
    dst = cl.Buffer(ctx, mf.WRITE_ONLY, out.nbytes)
    program = build_program(ctx, ctx.devices[0], spec.source, ptx_target=spec.ptx_target)
    getattr(program, spec.name)(queue, spec.global_size, spec.local_size, *buffers, dst)
    cl.enqueue_copy(queue, out, dst)
    queue.finish()
    return out

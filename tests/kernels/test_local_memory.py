"""Kernels fit the device's __local memory (a finding of the Oclgrind runs, RELIABILITY.md).

OpenCL guarantees 32 KiB of __local memory per work-group; PoCL offers 1 MiB, NVIDIA 48 KiB,
Oclgrind exactly 32 KiB. The CPU matmul's weights panel and partial sums took up to 130 KiB and
the CPU SDPA's Q^T and O up to 64 KiB: fine on PoCL, a launch failure on a 32 KiB device. Now
``KernelConfig.local_memory`` carries the device's figure, generators size their tiles to it, and
the engine refuses, with a typed error and before any build, a kernel that declares more.
"""

from __future__ import annotations

import attrs
import numpy as np
import pytest

import triodnn
from triodnn import MatmulDesc, MemoryDesc, SdpaDesc
from triodnn.kernels import KernelConfig, KernelSpec, matmul, matmul_gpu, program_source, sdpa, tolerance
from triodnn.kernels._spec import MIN_LOCAL_MEMORY, local_memory_bytes

CPU_32K = KernelConfig(vector_width=16, local_size=16, local_memory=MIN_LOCAL_MEMORY)
CPU_POCL = KernelConfig(vector_width=16, local_size=16, local_memory=1 << 20)
GPU_32K = KernelConfig(vector_width=1, local_size=256, local_memory=MIN_LOCAL_MEMORY)
GPU_48K = KernelConfig(vector_width=1, local_size=256, local_memory=48 * 1024)

MATMUL_SHAPES = [(8, 64, 1000), (64, 64, 64), (300, 300, 300), (1024, 1024, 1024), (6, 200, 4096), (2000, 17, 513)]
# (64, 64, 40, 80): the split kernel's K/V tile alone takes exactly 32 KiB; its merge arrays
# (2 x 256 floats) come on top.
SDPA_SHAPES = [(16, 64, 64, 64), (128, 128, 64, 64), (64, 64, 128, 128), (64, 32, 256, 256), (40, 40, 512, 512),
               (64, 64, 40, 80)]


def test_local_memory_bytes_reads_declarations():
    source = ("__local float16 bp[64];\n__local float* const p = (__local float*)bp;\n"
              "__local float4 t[3]; __local float r[5], q[7];")
    assert local_memory_bytes(source) == 64 * 64 + 3 * 16 + 5 * 4 + 7 * 4


def matmul_source(m, n, k, config, **kwargs) -> str:
    desc = MatmulDesc(MemoryDesc((m, k)), MemoryDesc((k, n)), **kwargs)
    return matmul.generate(desc, config).source


@pytest.mark.parametrize("m, n, k", MATMUL_SHAPES)
@pytest.mark.parametrize("config", [CPU_32K, GPU_32K], ids=["cpu_shaped", "gpu_shaped"])
def test_matmul_fits_32k(m, n, k, config):
    assert local_memory_bytes(matmul_source(m, n, k, config)) <= MIN_LOCAL_MEMORY


def test_cpu_matmul_keeps_its_measured_tile_where_memory_allows():
    """On PoCL's 1 MiB the K chunk stays 256 (a panel of 256 x 64 floats, 64 KiB), as without a
    limit; on 32 KiB it shrinks."""
    source = matmul_source(1024, 1024, 1024, CPU_POCL)
    assert "__local float16 bp[1024];" in source
    assert source == matmul_source(1024, 1024, 1024, attrs.evolve(CPU_POCL, local_memory=1 << 30))
    assert local_memory_bytes(source) > MIN_LOCAL_MEMORY
    assert local_memory_bytes(matmul_source(1024, 1024, 1024, CPU_32K)) <= MIN_LOCAL_MEMORY


def test_gpu_matmul_skips_tiles_past_the_device():
    """The K-split small tile takes 36 KiB: chosen on 48 KiB, never on 32 KiB."""
    assert matmul_gpu.choose_tile(64, 1024, 1, GPU_48K, k=1024) is matmul_gpu.TILES["32x32x16:r4x4:s4"]
    chosen = matmul_gpu.choose_tile(64, 1024, 1, GPU_32K, k=1024)
    assert chosen.local_bytes() <= MIN_LOCAL_MEMORY
    assert not matmul_gpu.applies(1024, 1024, KernelConfig(vector_width=1, local_size=256, local_memory=8192))


def sdpa_spec(sq, skv, d, dv, config) -> KernelSpec:
    desc = SdpaDesc(MemoryDesc((2, sq, d)), MemoryDesc((2, skv, d)), MemoryDesc((2, skv, dv)))
    return sdpa.generate(desc, config)


@pytest.mark.parametrize("sq, skv, d, dv", SDPA_SHAPES)
@pytest.mark.parametrize("config", [CPU_32K, GPU_32K, GPU_48K], ids=["cpu_shaped", "gpu_shaped", "gpu_48k"])
def test_sdpa_fits(sq, skv, d, dv, config):
    assert local_memory_bytes(sdpa_spec(sq, skv, d, dv, config).source) <= config.local_memory


def test_cpu_sdpa_narrows_then_hands_over():
    """Two row vectors where they fit, one where only one does, the work-group kernel past that."""
    assert sdpa_spec(64, 64, 64, 64, CPU_32K).impl.startswith("ocl:sdpa:rowlanes:q32")
    assert sdpa_spec(64, 64, 256, 256, CPU_32K).impl.startswith("ocl:sdpa:rowlanes:q16")
    assert sdpa_spec(64, 64, 256, 256, CPU_POCL).impl.startswith("ocl:sdpa:rowlanes:q32")
    assert sdpa_spec(64, 64, 512, 512, CPU_32K).impl.startswith("ocl:sdpa:wg:")


def test_gpu_sdpa_kernels_fit_the_local_memory():
    """NVIDIA's 48 KiB holds the flash kernel's blocks for d=64 (36 KiB); the OpenCL minimum
    does not, and the split kernel takes it with 32-row K/V tiles."""
    assert sdpa_spec(128, 128, 64, 64, GPU_48K).impl == "ocl:sdpa:flash:q64:k32:l256"
    assert sdpa_spec(128, 128, 64, 64, GPU_32K).impl == "ocl:sdpa:wgsplit:q16x16:k32:l256"


async def test_engine_config_carries_the_device_figure(engine):
    config = engine._config
    assert config.local_memory == int(engine.cl_device.local_mem_size) == engine.info.local_mem_size


@pytest.mark.parametrize("sq, d", [(64, 256), (40, 512)])
async def test_narrowed_sdpa_runs_correctly(engine, rng, sq, d):
    """The narrowed and handed-over shapes, run on the engine with a 32 KiB budget."""
    q, k, v = (rng.standard_normal((2, sq, d)).astype(np.float32) for _ in range(3))
    desc = SdpaDesc(MemoryDesc(q.shape), MemoryDesc(k.shape), MemoryDesc(v.shape))
    config = attrs.evolve(engine._config, local_memory=MIN_LOCAL_MEMORY)
    spec = sdpa.generate(desc, config)
    assert local_memory_bytes(spec.source) <= MIN_LOCAL_MEMORY
    got = await run_spec(engine, spec, config, {"query": q, "key": k, "value": v}, (2, sq, d))
    tolerance.check(got, sdpa.reference(q, k, v), 1e-5 * d / 64)  # test_sdpa's 1e-5 is for D = 64


@pytest.mark.parametrize("m, n, k", [(300, 300, 300), (64, 200, 1000)])
async def test_narrowed_cpu_matmul_runs_correctly(engine, rng, m, n, k):
    a = rng.standard_normal((m, k)).astype(np.float32)
    w = rng.standard_normal((k, n)).astype(np.float32)
    config = attrs.evolve(engine._config, local_memory=MIN_LOCAL_MEMORY)
    spec = matmul.generate(MatmulDesc(MemoryDesc(a.shape), MemoryDesc(w.shape)), config)
    got = await run_spec(engine, spec, config, {"src": a, "weights": w}, (m, n))
    tolerance.check(got, matmul.reference(a, w), 1e-6 * k)


async def run_spec(engine, spec: KernelSpec, config: KernelConfig, inputs: dict, dst_shape) -> np.ndarray:
    """Run a generated kernel directly with pyopencl (the engine's own config is PoCL's)."""
    import pyopencl as cl

    context, device = engine.cl_context, engine.cl_device
    queue = cl.CommandQueue(context, device)
    flags = cl.mem_flags
    buffers = {name: cl.Buffer(context, flags.READ_ONLY | flags.COPY_HOST_PTR, hostbuf=np.ascontiguousarray(a))
               for name, a in inputs.items()}
    out = np.empty(dst_shape, np.float32)
    buffers["dst"] = cl.Buffer(context, flags.WRITE_ONLY, out.nbytes)
    program = cl.Program(context, program_source(spec, config)).build()
    kernel = getattr(program, spec.name)
    kernel.set_args(*(buffers[name] for name in spec.arg_names))
    global_size = tuple(-(-g // l) * l for g, l in zip(spec.global_size, spec.local_size))
    cl.enqueue_nd_range_kernel(queue, kernel, global_size, spec.local_size)
    cl.enqueue_copy(queue, out, buffers["dst"])
    queue.finish()
    return out


@attrs.frozen
class GreedyDesc:
    """A relu-shaped kernel that declares more __local memory than the device has."""

    n: int

    kind = "test_greedy"

    @property
    def label(self) -> str:
        return f"test_greedy:{self.n}"

    @property
    def arg_descs(self) -> dict[str, MemoryDesc]:
        return {"src": MemoryDesc((self.n,)), "dst": MemoryDesc((self.n,))}

    def generate(self, config) -> KernelSpec:
        floats = config.local_memory // 4 + 1
        return KernelSpec(
            source=f"__kernel void greedy(__global const float* src, __global float* dst) "
                   f"{{ __local float big[{floats}]; big[0] = src[0]; dst[0] = big[0]; }}\n",
            name="greedy",
            arg_names=("src", "dst"),
            global_size=(1,),
            local_size=(1,),
            impl="test:greedy",
        )


# A test kind, declared in the op registry like any other (its generate is the method).
triodnn.kernels.register(GreedyDesc, generate=GreedyDesc.generate)


async def test_kernel_past_the_device_is_refused_and_leaves_nothing(engine):
    before = triodnn.primitive_cache_statistics()
    builds = engine.statistics().programs_built
    with pytest.raises(triodnn.BuildError, match="creating the primitive failed") as info:
        await engine.create_primitive(GreedyDesc(801))
    cause = str(info.value.__cause__)
    assert "'greedy' (test_greedy:801) declares" in cause
    assert f"offers {engine.info.local_mem_size}" in cause
    after = triodnn.primitive_cache_statistics()
    assert after.size == before.size and after.in_flight_builds == 0
    assert after.failed_builds == before.failed_builds + 1
    assert engine.statistics().programs_built == builds and engine.statistics().builds_in_flight == 0

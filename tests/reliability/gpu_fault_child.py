"""A real device fault, in a process of its own: a kernel writes 4 TiB past its buffer on an
NVIDIA GPU, which breaks its OpenCL context for good. Prints a JSON line of what triodnn
reported before the runtime closes and one after;
``test_device_faults.py::test_a_real_kernel_fault_loses_that_engine_only`` runs it.

Kept out of the test process: a driver may take the whole process's device state with it.
"""

from __future__ import annotations

import json
import sys

import numpy as np
import pyopencl as cl
import trio

import triodnn
from triodnn import MemoryDesc

WILD = """
__kernel void wild(__global float *p) {
    __global float *q = p + (1L << 40);
    q[get_global_id(0)] = 1.0f;
}
"""


async def relu(engine, x):
    stream = await engine.stream()
    primitive = await engine.create_primitive(triodnn.EltwiseDesc("relu", MemoryDesc(x.shape, "f32")))
    src = await engine.from_numpy(x)
    dst = engine.memory(MemoryDesc(x.shape, "f32"))
    await stream.execute(primitive, {"src": src, "dst": dst})
    return await dst.to_numpy(), stream, primitive, src, dst


async def main(spec: str) -> dict:
    report: dict = {}
    x = np.linspace(-1, 1, 256, dtype=np.float32)
    async with triodnn.open_runtime() as rt:
        kind, index = spec.split(":")
        engine = await rt.engine(kind, int(index))
        other = await rt.engine(kind, int(index))
        out, stream, primitive, src, dst = await relu(engine, x)
        report["before"] = bool(np.array_equal(out, np.maximum(x, 0)))
        program = cl.Program(engine.cl_context, WILD).build()
        queue = cl.CommandQueue(engine.cl_context, engine.cl_device)
        buffer = cl.Buffer(engine.cl_context, cl.mem_flags.READ_WRITE, 1024)
        program.wild(queue, (256,), None, buffer)
        try:
            queue.finish()
            report["wild"] = "finished"
        except cl.Error as exc:
            report["wild"] = f"{type(exc).__name__}: {exc}"
        try:
            await stream.execute(primitive, {"src": src, "dst": dst})
            report["after"] = "completed"
        except triodnn.TriodnnError as exc:
            report["after"] = type(exc).__name__
        report["lost"] = engine.lost is not None
        try:
            engine.memory(MemoryDesc((4,), "f32"))
            report["memory"] = "allocated"
        except triodnn.TriodnnError as exc:
            report["memory"] = type(exc).__name__
        try:
            out, *_ = await relu(other, x)
            report["other"] = "right" if np.array_equal(out, np.maximum(x, 0)) else "wrong"
        except triodnn.TriodnnError as exc:
            report["other"] = f"{type(exc).__name__}: {str(exc)[:160]}"
        try:
            await other.check_device()
            report["other_probe"] = "passed"
        except triodnn.TriodnnError as exc:
            report["other_probe"] = type(exc).__name__
        print(json.dumps(report), flush=True)  # what was seen, should the shutdown fail
    report["closed"] = True
    return report


if __name__ == "__main__":
    print(json.dumps(trio.run(main, sys.argv[1] if len(sys.argv) > 1 else "gpu:0")))

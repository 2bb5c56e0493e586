"""Quickstart: two primitives, one dependency, awaited from trio. Run: python examples/quickstart.py"""

import numpy as np
import trio

import triodnn


async def main() -> None:
    async with triodnn.open_runtime() as rt:
        engine = await rt.engine()  # PoCL's CPU device unless $TRIODNN_ENGINE says otherwise
        stream = await engine.stream(triodnn.StreamFlags.out_of_order)

        desc = triodnn.MemoryDesc((4, 8), "f32")
        gelu = await engine.create_primitive(triodnn.EltwiseDesc("gelu_erf", desc))
        add = await engine.create_primitive(triodnn.BinaryDesc("add", desc, triodnn.MemoryDesc((1, 8))))

        x = np.linspace(-3, 3, 32, dtype=np.float32).reshape(4, 8)
        src = await engine.from_numpy(x)
        bias = await engine.from_numpy(np.arange(8, dtype=np.float32).reshape(1, 8))
        tmp, dst = engine.memory(desc), engine.memory(desc)

        gelu_done = stream.execute(gelu, {"src": src, "dst": tmp})
        add_done = stream.execute(add, {"src0": tmp, "src1": bias, "dst": dst}, deps=[gelu_done])
        await add_done

        result = await dst.to_numpy()
        expected = triodnn.kernels.eltwise.reference("gelu_erf", x) + np.arange(8, dtype=np.float32)
        print(result)
        print("max abs error vs numpy:", float(np.max(np.abs(result - expected))))


if __name__ == "__main__":
    trio.run(main)

"""Draws docs/gantt.png, the picture in docs/performance.md: one DAG on an in-order and an out-of-order stream,
from the device spans of a triodnn trace (the computation of notebooks/scheduling.ipynb).

    MPLBACKEND=Agg python docs/make_gantt.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np

import triodnn
from triodnn import StreamFlags, SumDesc

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from _common import SpinDesc  # noqa: E402


def main() -> None:
    with triodnn.start_blocking() as portal:
        engine = portal.engine()
        spin_desc = SpinDesc(1_000_000)
        spin = engine.create_primitive(spin_desc)
        total = engine.create_primitive(SumDesc([spin_desc.desc] * 8))
        x = engine.from_numpy(np.array([3.0], np.float32))
        temps = [[engine.memory(spin_desc.desc) for _ in range(3)] for _ in range(8)]
        out = engine.memory(spin_desc.desc)

        def submit(stream):
            last = [None] * 8
            for level in range(3):
                for b in range(8):
                    src = x if level == 0 else temps[b][level - 1]
                    last[b] = stream.execute(spin, {"src": src, "dst": temps[b][level]},
                                             deps=[] if last[b] is None else [last[b]])
            return stream.execute(total, {**{f"src{b}": temps[b][2] for b in range(8)}, "dst": out}, deps=last)

        fig, axes = plt.subplots(2, 1, figsize=(9, 3.6))
        for ax, (name, flags) in zip(axes, (("in-order stream", StreamFlags.in_order),
                                            ("out-of-order stream", StreamFlags.out_of_order))):
            with triodnn.trace.record():  # a stream opened while a trace records profiles
                stream = engine.stream(flags)
                submit(stream).wait()  # warm: the kernels' first launches
            with triodnn.trace.record() as trace:
                submit(stream).wait()
            trace.plot(ax=ax, arrows=False, title=f"{name}: 8 branches x 3 kernels + sum (PoCL, 2 cores)")
        fig.savefig(ROOT / "docs" / "gantt.png", dpi=90)


if __name__ == "__main__":
    main()

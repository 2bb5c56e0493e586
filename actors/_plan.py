"""Execution plans: a sequence of kernels recorded once and replayed as one stream command.

A compiled partition (``triodnn.graph``) submits the same kernels on the same kind of buffers at
every run. Sent one ``KernelLaunch`` at a time, each kernel paid for its own submission record,
event, dependency list and ``set_args``; measured on an H100, ``CompiledPartition.execute`` of a
3-kernel MLP cost 188 µs of caller time per run where raw pyopencl enqueues the three in ~30 µs.
A plan records what does not change between runs once (a kernel object per step, so that its
arguments stay set while the buffers do not change; launch geometry; which steps each step waits
for on an out-of-order stream; which may overlap), and a run sends one ``KernelSequence`` record
with its buffers: the stream actor enqueues the whole sequence at once.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs
import pyopencl as cl

from ._compiler import BuiltKernel


@attrs.frozen(eq=False)
class PlanStep:
    """One kernel of a plan: its own kernel object (a clone of the built one), geometry, label."""

    kernel: cl.Kernel
    global_size: tuple[int, ...]
    local_size: tuple[int, ...]
    label: str
    overlaps: bool  # may run on a lane of its own on an out-of-order stream (``may_overlap``)


class LaunchPlan:
    """Steps to replay in order. ``bound[i]`` is the key (addresses, see ``KernelSequence.keys``)
    of the arguments step ``i``'s kernel holds now: the stream actor sets arguments only when a
    run's key is another object."""

    __slots__ = ("steps", "bound", "overlaps")

    def __init__(self, launches: Sequence[BuiltKernel], labels: Sequence[str], overlaps: Sequence[bool]) -> None:
        # A kernel object of its own per step: the built kernel is shared by every use of the
        # primitive (other partitions, single executions), whose arguments differ.
        self.steps = tuple(
            PlanStep(cl.Kernel(launch.program, launch.spec.name), tuple(launch.spec.global_size),
                     tuple(launch.spec.local_size), label, bool(overlap))
            for launch, label, overlap in zip(launches, labels, overlaps, strict=True)
        )
        self.bound: list[tuple | None] = [None] * len(self.steps)
        self.overlaps = any(step.overlaps for step in self.steps)  # a lane of its own, in line

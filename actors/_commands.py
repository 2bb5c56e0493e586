"""What a stream hands its stream actor: one frozen record per kind of command.

Every record carries the ``Submission`` the actor fills in and the ``deps`` the command waits for
(Submissions and pyopencl events, already checked and unwrapped by the stream), then its payload.
The stream builds them, ``StreamActor._enqueue`` is the one place that decodes them, and
instruments (the trace, verbose) read them by name; ``op`` names the kind for them.

Fields are few on purpose: the submit path is hot, and an attrs frozen record sets each field
through ``object.__setattr__``. Measured (``python -m timeit``, Python 3.11, attrs 26.1, this
2-core machine): 2 fields 260 ns, 4 fields 380-410 ns, 7 fields 680 ns; a plain tuple of 5 is
30 ns. So a kernel launch carries its primitive (kernel and launch geometry in one reference)
rather than the kernel, global and local size apart.
"""

from __future__ import annotations

from typing import ClassVar, Protocol

import attrs
import numpy as np
import pyopencl as cl

from ._compiler import BuiltKernel
from ._plan import LaunchPlan
from ._submission import Submission


class Launchable(Protocol):
    """What a kernel launch needs of the triodnn ``Primitive`` it carries (a layer above)."""

    @property
    def launch(self) -> BuiltKernel: ...

    @property
    def overlaps(self) -> bool:
        """Whether the kernel may take a lane of its own on an out-of-order stream."""
        ...


@attrs.frozen(eq=False, init=False)
class KernelLaunch:
    """Run ``primitive``'s kernel on ``buffers`` (its arguments, in order)."""

    op: ClassVar[str] = "kernel"
    submission: Submission
    deps: tuple
    # A triodnn Primitive: the actor launches its ``launch`` handle (the ``BuiltKernel`` the
    # compiler made) with its spec's global and local size; instruments describe it (kind, impl,
    # descriptors).
    primitive: Launchable
    buffers: tuple = attrs.field(repr=False)

    def __init__(self, submission: Submission, deps: tuple, primitive: Launchable, buffers: tuple) -> None:
        # The record of nearly every command: its slots are set through their own descriptors,
        # 270 ns, where attrs' frozen __init__ (object.__setattr__ per field) takes 390 ns.
        _set_submission(self, submission)
        _set_deps(self, deps)
        _set_primitive(self, primitive)
        _set_buffers(self, buffers)


_set_submission = KernelLaunch.__dict__["submission"].__set__
_set_deps = KernelLaunch.__dict__["deps"].__set__
_set_primitive = KernelLaunch.__dict__["primitive"].__set__
_set_buffers = KernelLaunch.__dict__["buffers"].__set__


@attrs.frozen(eq=False)
class KernelSequence:
    """Run ``plan``'s kernels in order, step ``i`` on ``buffers[i]``: one command for all of them.

    ``after[i]`` names the earlier steps step ``i`` waits for (on an out-of-order stream; an
    in-order one runs them in order anyway); steps waiting for none wait for ``deps``. An empty
    ``after`` runs every step after the one before (in line: one lane). The
    submission completes with the last step, or with every step no other step waits for.

    ``uploads`` and ``downloads`` make it a whole request (a graph runner's recorded request):
    ``(buffer, host array)`` pairs copied in before the kernels (after ``deps``; steps waiting for
    no other step wait for them) and out after them; the submission then completes with the
    last copy out.
    """

    op: ClassVar[str] = "sequence"
    submission: Submission
    deps: tuple
    plan: LaunchPlan = attrs.field(repr=False)
    buffers: tuple = attrs.field(repr=False)
    # Per step, the buffers' addresses as one tuple: the same object as the run before when
    # the buffers are (the plan's kernels then keep their arguments).
    keys: tuple = attrs.field(repr=False)
    after: tuple = attrs.field(repr=False)
    uploads: tuple = attrs.field(default=(), repr=False)
    downloads: tuple = attrs.field(default=(), repr=False)


@attrs.frozen(eq=False)
class WriteBuffer:
    """Copy host array ``host`` into ``buffer`` (host to device)."""

    op: ClassVar[str] = "write"
    submission: Submission
    deps: tuple
    buffer: cl.Buffer = attrs.field(repr=False)
    host: np.ndarray = attrs.field(repr=False)


@attrs.frozen(eq=False)
class ReadBuffer:
    """Copy ``buffer`` into host array ``host`` (device to host)."""

    op: ClassVar[str] = "read"
    submission: Submission
    deps: tuple
    buffer: cl.Buffer = attrs.field(repr=False)
    host: np.ndarray = attrs.field(repr=False)


@attrs.frozen(eq=False)
class Marker:
    """Completes when ``deps`` have, or with no deps when everything before it in the stream has."""

    op: ClassVar[str] = "marker"
    submission: Submission
    deps: tuple


@attrs.frozen(eq=False)
class Barrier:
    """A marker that every later command of the stream waits for too."""

    op: ClassVar[str] = "barrier"
    submission: Submission
    deps: tuple


Command = KernelLaunch | KernelSequence | WriteBuffer | ReadBuffer | Marker | Barrier

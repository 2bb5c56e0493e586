"""Instructions of a newer PTX target than NVIDIA's OpenCL compiler writes.

NVIDIA's OpenCL compiler turns OpenCL C into PTX for ``.target sm_90`` on an H100 or H200, and
ptxas refuses Hopper's warp-group instructions there (``wgmma`` needs ``sm_90a``, the target whose
code runs on that architecture only). Inline PTX is copied into the PTX as written, so a kernel
writes such instructions behind ``MARK``, a PTX comment: the front end substitutes their operands
and register names like any inline assembly, and ``retarget`` opens the comments and raises the
target before the PTX is built again. Measured on an H200 (``wgmma.mma_async`` m64nNk16, bf16):
the results equal numpy's bit for bit, and a loop of m64n256k16 runs at 835 TFLOP/s where one of
``mma.sync`` m16n8k16 reaches 554.
"""

from __future__ import annotations

import re

MARK = "//@ptx "
# wgmma arrived in PTX ISA 8.0; NVIDIA's OpenCL on CUDA 13 writes 9.0 already.
MIN_VERSION = {"sm_90a": (8, 0)}


def marked(*lines: str) -> str:
    """The body of an ``asm`` string (C-escaped newlines between lines) whose every line is hidden
    behind ``MARK`` until ``retarget``."""
    return "\\n".join(MARK + line for line in lines)


def retarget(ptx: str, target: str) -> str:
    """``ptx`` with every ``MARK`` comment opened, ``.target`` set to ``target`` and ``.version``
    raised to what the target's instructions need."""
    lowest = MIN_VERSION.get(target, (0, 0))

    def version(match: re.Match) -> str:
        major, minor = int(match.group(1)), int(match.group(2))
        return ".version {}.{}".format(*max((major, minor), lowest))

    out = re.sub(r"^\.version (\d+)\.(\d+)", version, ptx, count=1, flags=re.M)
    out = re.sub(r"^\.target [^\n]*", f".target {target}", out, count=1, flags=re.M)
    return out.replace(MARK, "")

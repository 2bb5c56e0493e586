"""One work-group per row: when to take it, and the OpenCL C of its local-memory reductions.

Shared by softmax and layer/RMS normalization on the GPU configuration (``vector_width == 1``).
One work-item per row leaves a GPU nearly idle (a few thousand threads, each walking its row
serially); with a work-group per row, work-item ``lid`` takes the row's elements ``lid``,
``lid + L``, ``lid + 2L``... (neighbouring work-items read neighbouring elements: coalesced when
the axis is contiguous), keeps partial results in registers, and a tree in ``__local`` memory
(``L`` floats, twice: at most 2 KiB for L = 256) combines them, with a barrier per level.

Sums are compensated end to end: each work-item accumulates with an error term (TwoSum: the
rounding error of every addition is exact and kept), and each tree level combines two (sum,
error) pairs the same way, so a row of one large and many tiny terms keeps the tiny ones.

The work-group is sized to the row (``local_size``: up to 16 elements per work-item, from 32
work-items to the configuration's local size). Rows of ``ceil(n / L) <= CACHE_MAX`` elements per
work-item are kept in registers (a private array indexed by unrolled loops) between the passes,
so the row is read from global memory once; longer rows are re-read in each pass.
"""

from __future__ import annotations

import math

from ._spec import KernelConfig

MIN_AXIS = 32  # shorter rows keep one work-item per row: most of a work-group would idle
# Work-group size: the smallest power of two from MIN_LOCAL that gives each work-item at most
# PER_ITEM elements, capped by the configuration's local size. Measured on an H200 (softmax rows of
# 384, 1024, 4096; layer norm rows of 1024): 8 to 16 register-held elements per work-item ran at
# 92-100% of the copy bandwidth, and 256-wide groups on short rows at half that (384: 1174 GB/s at
# 256, 3350 at 32; the tree's barriers and idle work-items dominate).
MIN_LOCAL = 32
PER_ITEM = 16
CACHE_MAX = 32  # elements per work-item kept in registers (an 8192 row at L = 256: 1536 -> 2477 GB/s)
# When the reduced axis is strided and rows lie side by side in memory (another dim has stride 1),
# one work-item per row reads coalesced across work-items, while a work-group per row reads one
# element per 32-byte sector. Measured on an H200, softmax over 150 channels of NCHW: per row
# 1372 GB/s against 322 at 262144 rows, 825 against 320 at 65536, even (276, 267) at 8192.
ADJACENT_ROWS = 8192


def _pow2_floor(x: int) -> int:
    return 1 << (max(1, x).bit_length() - 1)


def local_size(n: int, config: KernelConfig) -> int:
    """Work-group size for rows of ``n`` (a power of two, as the tree needs): see ``PER_ITEM``."""
    limit = _pow2_floor(config.local_size)
    want = max(MIN_LOCAL, 1 << (math.ceil(n / PER_ITEM) - 1).bit_length())
    return min(limit, want)


def use_work_group(
    config: KernelConfig,
    n: int,
    rows: int,
    axis_stride: int,
    other_dims: tuple[int, ...],
    other_strides: tuple[int, ...],
) -> bool:
    """Whether rows of ``n`` elements (``rows`` of them, src strides given) take a work-group each."""
    if config.vector_width != 1 or n < MIN_AXIS or local_size(n, config) < 2:
        return False
    adjacent = any(s == 1 for s, d in zip(other_strides, other_dims) if d > 1)
    return not (axis_stride != 1 and adjacent and rows >= ADJACENT_ROWS)


def per_item(n: int, local: int) -> int:
    """Elements of a row each work-item takes (the last ones may fall past the row's end)."""
    return math.ceil(n / local)


def declarations(local: int) -> str:
    """The two local arrays (kernel scope, as OpenCL requires) and the work-item's index."""
    return (
        f"__local float red_a[{local}];\n"
        f"    __local float red_b[{local}];\n"
        "    const uint lid = get_local_id(0);"
    )


def attribute(local: int) -> str:
    return f"__attribute__((reqd_work_group_size({local}, 1, 1))) "


def two_sum_step(acc: str, comp: str, term: str, type_name: str = "float") -> str:
    """``acc += term`` keeping the exact rounding error in ``comp`` (Knuth's TwoSum, branch-free;
    ``type_name`` the type of all three, a vector type too)."""
    return (
        f"{{ const {type_name} y_ = {term}; const {type_name} t_ = {acc} + y_; const {type_name} b_ = t_ - {acc};"
        f" {comp} += ({acc} - (t_ - b_)) + (y_ - b_); {acc} = t_; }}"
    )


def max_code(var: str, local: int) -> str:
    """Statements replacing each work-item's ``var`` by the work-group's maximum (NaNs dropped,
    as the row paths' ``x > m ? x : m``)."""
    lines = [f"red_a[lid] = {var};", "barrier(CLK_LOCAL_MEM_FENCE);"]
    step = local // 2
    while step >= 1:
        lines.append(
            f"if (lid < {step}u) {{ const float a = red_a[lid]; const float b = red_a[lid + {step}u];"
            " red_a[lid] = b > a ? b : a; }"
        )
        lines.append("barrier(CLK_LOCAL_MEM_FENCE);")
        step //= 2
    lines.append(f"{var} = red_a[0];")
    lines.append("barrier(CLK_LOCAL_MEM_FENCE);")  # red_a is free again for the next reduction
    return "\n    ".join(lines)


def sum_code(acc: str, comp: str, result: str, local: int) -> str:
    """Statements declaring float ``result``: the work-group's total of every work-item's
    ``acc + comp``, pairs combined with TwoSum at each tree level."""
    lines = [f"red_a[lid] = {acc};", f"red_b[lid] = {comp};", "barrier(CLK_LOCAL_MEM_FENCE);"]
    step = local // 2
    while step >= 1:
        lines.append(
            f"if (lid < {step}u) {{ const float a = red_a[lid]; const float b = red_a[lid + {step}u];"
            " const float t = a + b; const float bp = t - a;"
            f" red_b[lid] = (red_b[lid] + red_b[lid + {step}u]) + ((a - (t - bp)) + (b - bp));"
            " red_a[lid] = t; }"
        )
        lines.append("barrier(CLK_LOCAL_MEM_FENCE);")
        step //= 2
    lines.append(f"const float {result} = red_a[0] + red_b[0];")
    lines.append("barrier(CLK_LOCAL_MEM_FENCE);")
    return "\n    ".join(lines)


def loop(n: int, local: int, cached: bool, body: str) -> str:
    """A loop over this work-item's elements of the row: ``k`` the element's index along the axis
    (ulong); with ``cached``, ``j`` its slot in the private array too (unrolled)."""
    if not cached:
        return f"for (ulong k = lid; k < {n}UL; k += {local}UL) {{ {body} }}"
    per = per_item(n, local)
    guard = "" if n % local == 0 else f"if (k < {n}UL) "
    return (
        "#pragma unroll\n"
        f"    for (uint j = 0; j < {per}u; ++j) {{ const ulong k = lid + (ulong)j * {local}UL;"
        f" {guard}{{ {body} }} }}"
    )

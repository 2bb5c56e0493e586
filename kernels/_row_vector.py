"""The CPU row path shared by softmax and layer/RMS normalization: rows walked a float vector at a
time (``ocl:row:v{N}...``), with their sums Kahan-compensated per lane and folded by halving.

A row is contiguous in src and dst, its length a multiple of N, and every row starts on an
N-element boundary (``vector_width``). f32 rows go through vector pointer casts (PoCL keeps
``vloadN`` as a call, so the wide vector amortises each built-in call); other storage types are
addressed through pointers of their own type and loaded and stored element by element into the
same vector math (``row_pointers``).
"""

from __future__ import annotations

from . import _dtype_io
from ._spec import VECTOR_TYPES


def vector_width(
    axis_len: int,
    other_strides: tuple[tuple[int, ...], ...],
    axis_strides: tuple[int, ...],
    other_dims: tuple[int, ...],
    widest: int,
) -> int:
    """Widest vector that tiles every row exactly and starts it aligned, 1 when none does.

    A pointer cast to floatN needs N-element alignment (LLVM emits aligned loads); buffers are
    aligned far beyond 64 bytes, so a row is aligned when each stride that moves between rows is
    a multiple of N. Rows that do not divide by N take the scalar path rather than a tail loop:
    the next row would then start unaligned.
    """
    if any(s != 1 for s in axis_strides):
        return 1
    width = widest
    while width > 1:
        if axis_len % width == 0 and all(
            s % width == 0 for strides in other_strides for s, d in zip(strides, other_dims) if d > 1
        ):
            return width
        width //= 2
    return 1


def fold_code(var: str, width: int, combine: str) -> str:
    """Statements folding vector ``{var}v`` of ``width`` lanes into scalar ``var`` by halving."""
    lines = []
    src = f"{var}v"
    while width > 1:
        half = width // 2
        name = f"{var}_{half}"
        lo, hi = f"{src}.lo", f"{src}.hi"
        expr = combine.format(a=lo, b=hi)
        type_name = VECTOR_TYPES[half]
        lines.append(f"const {type_name} {name} = {expr};")
        src = name
        width = half
    lines.append(f"{var} = {src};")
    return "\n        ".join(lines)


def kahan_step(acc: str, comp: str, term: str, type_name: str = "float") -> str:
    """Kahan-compensated ``acc += term`` (``comp`` holds minus the lost low part; the total is
    ``acc - comp``), on floats or float vectors. The CPU paths' choice: on PoCL (16 cores) it cost
    3-15% over a plain sum, TwoSum 10-25%; the GPU's work-group path, memory-bound, takes TwoSum."""
    return (f"{{ const {type_name} y_ = ({term}) - {comp}; const {type_name} t_ = {acc} + y_;"
            f" {comp} = (t_ - {acc}) - y_; {acc} = t_; }}")


def sum_fold_code(width: int) -> str:
    """Statements folding compensated vector sums ``sv`` (each lane's total ``sv + cv``) of
    ``width`` lanes into scalar ``s`` by halving, each level a TwoSum of the halves (its error
    added to the halves' error terms)."""
    lines = []
    s, c = "sv", "cv"
    while width > 1:
        half = width // 2
        T = VECTOR_TYPES[half]
        s_h, c_h = f"s_{half}", f"c_{half}"
        lines.append(
            f"const {T} a_{half} = {s}.lo; const {T} b_{half} = {s}.hi; const {T} {s_h} = a_{half} + b_{half};"
            f" const {T} p_{half} = {s_h} - a_{half};"
            f" const {T} {c_h} = ({c}.lo + {c}.hi) + ((a_{half} - ({s_h} - p_{half})) + (b_{half} - p_{half}));"
        )
        s, c = s_h, c_h
        width = half
    lines.append(f"s = {s} + {c};")
    return "\n        ".join(lines)


def row_pointers(src_dtype: str, dst_dtype: str, vec: int) -> tuple[str, str, str, str]:
    """``(xs declaration, xd declaration, chunk k of src, chunk k of dst)``: the row of src and of
    dst from ``off_src``/``off_dst``, a ``floatN`` pointer for f32 and one of the storage type
    otherwise (arithmetic on a half pointer needs no cl_khr_fp16), and chunk ``k`` of each as a
    ``floatN`` expression (loaded element by element for non-f32)."""
    T = VECTOR_TYPES[vec]
    xs_k = "xs[k]" if src_dtype == "f32" else _dtype_io.load_vector(src_dtype, "xs", "k", T, vec)
    xd_k = "xd[k]" if dst_dtype == "f32" else _dtype_io.load_vector(dst_dtype, "xd", "k", T, vec)
    xs_decl = (
        f"__global const {T}* xs = (__global const {T}*)(src + off_src);" if src_dtype == "f32"
        else f"__global const {_dtype_io.STORAGE[src_dtype]}* xs = src + off_src;"
    )
    xd_decl = (
        f"__global {T}* xd = (__global {T}*)(dst + off_dst);" if dst_dtype == "f32"
        else f"__global {_dtype_io.STORAGE[dst_dtype]}* xd = dst + off_dst;"
    )
    return xs_decl, xd_decl, xs_k, xd_k


def store_chunk(dst_dtype: str, vec: int, value: str) -> str:
    """The statement storing ``floatN`` ``value`` as chunk ``k`` of the dst row ``xd``."""
    if dst_dtype == "f32":
        return f"xd[k] = {value};"
    return _dtype_io.store_vector(dst_dtype, "xd", "k", VECTOR_TYPES[vec], vec, value)


def gather(name: str, stride: int, vec: int, offset: str = "") -> str:
    """Chunk ``k`` of buffer ``name`` along the row (element stride ``stride``, from ``offset``) as a
    ``floatN``: one value broadcast where the stride is 0, a vector pointer where the buffer is
    contiguous from an aligned start (no offset: its own buffer, e.g. scale), else gathered lane by
    lane (a post-op operand's rows need not start on a vector boundary)."""
    T = VECTOR_TYPES[vec]
    if stride == 0:
        return f"(({T})({name}[{offset or '0'}]))"
    if stride == 1 and not offset:
        return f"((__global const {T}*){name})[k]"
    base = f"{offset} + " if offset else ""
    lanes = ", ".join(f"{name}[{base}k * {vec * stride}UL + {t * stride}UL]" for t in range(vec))
    return f"(({T})({lanes}))"

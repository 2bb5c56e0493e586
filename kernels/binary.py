"""Binary forward: ``dst = op(src0, src1)`` with numpy broadcasting, generator beside its source.

Shapes are aligned from the right, as numpy does; a dimension of 1 broadcasts. Three code paths:
all tensors dense with one layout (flat, vectorised), ``src1`` (or ``src2``) a single value
broadcast over a dense ``src0`` (flat, vectorised), and the general case (one element per
work-item, offsets by index arithmetic with stride 0 on broadcast dimensions).

Comparisons (``ge gt le lt eq ne``) write 1.0 or 0.0, as oneDNN's binary comparisons do in f32; a
NaN operand compares false except for ``ne``. ``select`` is oneDNN's ``binary_select``:
``dst = src2 ? src0 : src1`` with a third input ``src2``, broadcast like the others, true where
nonzero (NaN included, -0 not).

Each argument has its own storage type of ``_dtype_io.DTYPES``: the math is f32, and the result
is stored with dst's conversion. So a comparison into a ``boolean`` (or any) dst writes 1 or 0,
and select's condition may be boolean, u8, s32 or f32 (true where its value is nonzero). Non-f32
storage loads and stores element by element but keeps the vectorised math of the flat paths.
"""

from __future__ import annotations

import math
import string

import numpy as np

from . import _dtype_io
from ._spec import VECTOR_TYPES, KernelConfig, KernelSpec, index_code, is_dense, padded_global

# In terms of ``a``, ``b`` (and ``cond``, select's condition) of type ``$T``. min/max as ternaries:
# fmin/fmax stay calls on PoCL. NaN handling differs from numpy's. Comparisons select between
# typed constants: a vector comparison yields -1/0 integers, and a ternary on vectors wants both
# results of the vector type.
_EXPRESSIONS: dict[str, str] = {
    "add": "a + b",
    "sub": "a - b",
    "mul": "a * b",
    "div": "a / b",
    "min": "b < a ? b : a",
    "max": "b > a ? b : a",
    "ge": "a >= b ? ($T)(1.0f) : ($T)(0.0f)",
    "gt": "a > b ? ($T)(1.0f) : ($T)(0.0f)",
    "le": "a <= b ? ($T)(1.0f) : ($T)(0.0f)",
    "lt": "a < b ? ($T)(1.0f) : ($T)(0.0f)",
    "eq": "a == b ? ($T)(1.0f) : ($T)(0.0f)",
    "ne": "a != b ? ($T)(1.0f) : ($T)(0.0f)",
    "select": "cond != ($T)(0.0f) ? a : b",
}

ALGORITHMS: tuple[str, ...] = tuple(_EXPRESSIONS)

COMPARISONS: frozenset[str] = frozenset({"ge", "gt", "le", "lt", "eq", "ne"})

# Algorithms taking the third input src2.
TERNARY: frozenset[str] = frozenset({"select"})

# Algorithms whose result is 0, 1 or an operand bit for bit: compared exactly.
EXACT: frozenset[str] = COMPARISONS | TERNARY


def broadcast_dims(*shapes: tuple[int, ...]) -> tuple[int, ...]:
    """The numpy broadcast of ``shapes``; ValueError when they do not broadcast."""
    try:
        return tuple(int(d) for d in np.broadcast_shapes(*shapes))
    except ValueError:
        raise ValueError(f"shapes {', '.join(map(str, shapes))} do not broadcast") from None


def _aligned_strides(dims: tuple[int, ...], strides: tuple[int, ...], ndims: int) -> tuple[int, ...]:
    """Strides of a tensor right-aligned to ``ndims`` dimensions, 0 where it broadcasts."""
    pad = ndims - len(dims)
    return (0,) * pad + tuple(0 if d == 1 else s for d, s in zip(dims, strides))


def _expression(alg: str, type_name: str) -> str:
    return string.Template(_EXPRESSIONS[alg]).substitute(T=type_name)


def generate(
    alg: str,
    *,
    src0_dims: tuple[int, ...],
    src0_strides: tuple[int, ...],
    src1_dims: tuple[int, ...],
    src1_strides: tuple[int, ...],
    dst_strides: tuple[int, ...],
    src2_dims: tuple[int, ...] | None = None,
    src2_strides: tuple[int, ...] | None = None,
    config: KernelConfig,
    post_ops: tuple = (),
    src0_dtype: str = "f32",
    src1_dtype: str = "f32",
    src2_dtype: str = "f32",
    dst_dtype: str = "f32",
) -> KernelSpec:
    """OpenCL source for ``dst = alg(src0, src1[, src2])``; dst has the broadcast shape of the
    sources. ``src2`` (dims and strides) is required by ``select`` and refused by the others.
    ``src0_dtype`` .. ``dst_dtype``: storage types (``_dtype_io.DTYPES``), the math f32 either
    way. ``post_ops``: a validated chain (see ``_post_ops``; binary operands f32) applied
    before the store; a binary post-op operand needing broadcasting sends the kernel down the
    broadcast path (impl ``ocl:broadcast:...:po_bcast``)."""
    from . import _post_ops  # here: _post_ops imports this module

    if alg not in _EXPRESSIONS:
        raise ValueError(f"unknown binary algorithm {alg!r}; known: {', '.join(ALGORITHMS)}")
    ternary = alg in TERNARY
    if ternary != (src2_dims is not None) or (src2_dims is None) != (src2_strides is None):
        raise ValueError(f"{alg} {'needs' if ternary else 'takes no'} src2 dims and strides")
    shapes = {"src0": src0_dims, "src1": src1_dims}
    strides_in = {"src0": src0_strides, "src1": src1_strides}
    if ternary:
        shapes["src2"], strides_in["src2"] = src2_dims, src2_strides
    given = {"src0": src0_dtype, "src1": src1_dtype, "src2": src2_dtype, "dst": dst_dtype}
    dtypes = {name: given[name] for name in (*shapes, "dst")}
    for name, dtype in dtypes.items():
        _dtype_io.check_dtype(name, dtype)
    dims = broadcast_dims(*shapes.values())
    if len(dst_strides) != len(dims):
        raise ValueError(f"dst_strides {dst_strides} do not match broadcast dims {dims}")
    n = math.prod(dims)
    local = config.local_size
    aligned = {name: _aligned_strides(shapes[name], strides_in[name], len(dims)) for name in shapes}
    # The value names the expressions use, and the kernel parameters, in argument order.
    values = {"src0": "a", "src1": "b", "src2": "cond"}
    inputs = list(shapes)
    others = inputs[1:]
    dense_dst = is_dense(dims, dst_strides)
    same_layout = dense_dst and aligned["src0"] == dst_strides and tuple(src0_dims) == dims
    # An operand other than src0 runs flat when it has dst's layout, or is one value (scalar).
    scalar = {
        name for name in others if math.prod(shapes[name]) == 1 and aligned[name] != dst_strides
    }
    flat = same_layout and all(aligned[name] == dst_strides or name in scalar for name in others)
    access = _post_ops.operand_access(post_ops, dims, dst_strides) if flat else None
    po_bcast = flat and access is None
    flat = flat and access is not None
    po_names = _post_ops.arg_names(post_ops)
    types = ("float",)
    if flat:
        vec = config.vector_width
        vec_type = VECTOR_TYPES[vec]
        full, tail = divmod(n, vec)
        work_items = full + (1 if tail else 0)
        loads_vec = [
            f"const {vec_type} {values[name]} = "
            + (f"(({vec_type})({_dtype_io.load(dtypes[name], name, '0')}));" if name in scalar
               else _dtype_io.load_vector(dtypes[name], name, "i", vec_type, vec) + ";")
            for name in inputs
        ]
        loads_tail = [
            f"const float {values[name]} = {_dtype_io.load(dtypes[name], name, '0' if name in scalar else 'j')};"
            for name in inputs
        ]
        types = ("float", vec_type) if vec > 1 else ("float",)
        apply_vec, apply_tail = _dtype_io.apply_post_ops_flat(
            post_ops, "v", vec_type, vec, access, dtypes["dst"]
        )
        body = f"""
    const ulong i = get_global_id(0);
    if (i < {full}UL) {{
        {" ".join(loads_vec)}
        {vec_type} v = {_expression(alg, vec_type)};
        {apply_vec}
        {_dtype_io.store_vector(dtypes["dst"], "dst", "i", vec_type, vec, "v")}
    }} else if (i == {full}UL) {{
        for (ulong j = i * {vec}UL; j < {n}UL; ++j) {{
            {" ".join(loads_tail)}
            float v = {_expression(alg, "float")};
            {apply_tail}
            {_dtype_io.store(dtypes["dst"], "dst", "j", "v")}
        }}
    }}"""
        # "scalar_b" when src1 is one value, "scalar_c" when src2 is, "scalar_bc" when both are.
        suffix = "".join({"src1": "b", "src2": "c"}[name] for name in others if name in scalar)
        impl = f"ocl:{'scalar_' + suffix if suffix else 'flat'}:{config.name}"
    else:
        work_items = n
        offsets = index_code(
            dims, {**aligned, "dst": dst_strides, **_post_ops.operand_strides(post_ops, len(dims))}, "i"
        )
        loads = "\n    ".join(
            f"const float {values[name]} = {_dtype_io.load(dtypes[name], name, f'off_{name}')};"
            for name in inputs
        )
        apply = _dtype_io.apply_post_ops_scalar(
            post_ops, "v", "off_dst", {name: f"off_{name}" for name in po_names}, dtypes["dst"]
        )
        body = f"""
    const ulong i = get_global_id(0);
    if (i >= {n}UL) return;
    {offsets}
    {loads}
    float v = {_expression(alg, "float")};
    {apply}
    {_dtype_io.store(dtypes["dst"], "dst", "off_dst", "v")}"""
        impl = f"ocl:broadcast:l{local}" + (":po_bcast" if po_bcast else "")
    params = ", ".join(_dtype_io.param(dtypes[name], name, const=True) for name in inputs)
    source = (
        _dtype_io.functions(loads=dtypes.values(), stores=(dtypes["dst"],))
        + _post_ops.functions(post_ops, types)
        + f"__kernel void binary_fwd({params},{_post_ops.params(post_ops)}"
        + f" {_dtype_io.param(dtypes['dst'], 'dst', const=False)}) {{"
        + body + "\n}\n"
    )
    return KernelSpec(
        source=source,
        name="binary_fwd",
        arg_names=(*inputs, *po_names, "dst"),
        global_size=(padded_global(work_items, local),),
        local_size=(local,),
        impl=impl,
    )


def reference(
    alg: str,
    src0: np.ndarray,
    src1: np.ndarray,
    src2: np.ndarray | None = None,
    *,
    dst_dtype: str = "f32",
) -> np.ndarray:
    """``alg`` of the broadcast sources (user-facing values of any data type) in float64, rounded
    to float32 and stored as ``dst_dtype`` (user-facing values: bf16 as float32, boolean as bool).
    ``src2``: select's condition."""
    a = _dtype_io.widen(src0)
    b = _dtype_io.widen(src1)
    if (alg in TERNARY) != (src2 is not None):
        raise ValueError(f"{alg} {'needs' if alg in TERNARY else 'takes no'} src2")
    with np.errstate(all="ignore"):
        if alg == "add":
            y = a + b
        elif alg == "sub":
            y = a - b
        elif alg == "mul":
            y = a * b
        elif alg == "div":
            y = a / b
        elif alg == "min":
            y = np.minimum(a, b)
        elif alg == "max":
            y = np.maximum(a, b)
        elif alg in COMPARISONS:
            compare = {"ge": np.greater_equal, "gt": np.greater, "le": np.less_equal,
                       "lt": np.less, "eq": np.equal, "ne": np.not_equal}[alg]
            y = compare(a, b).astype(np.float64)
        elif alg == "select":
            y = np.where(_dtype_io.widen(src2) != 0, a, b)
        else:
            raise ValueError(f"unknown binary algorithm {alg!r}; known: {', '.join(ALGORITHMS)}")
    return _dtype_io.store_reference(y.astype(np.float32), dst_dtype)

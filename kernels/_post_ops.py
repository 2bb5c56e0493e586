"""Post-op chains (oneDNN's attribute post-ops): code applying them inside a generator, and references.

A chain is a tuple of plain tuples, applied in order to a primitive's result before its store:

- ``("eltwise", alg, alpha, beta)``: ``value = alg(value)``, any eltwise algorithm;
- ``("sum", scale)``: ``value = value + scale * dst``, with dst's value read before the store;
- ``("binary", alg, src1)``: ``value = alg(value, operand)``; ``src1`` is a memory descriptor (an
  object with ``dims`` and ``strides``) broadcasting to dst numpy-style (aligned right). The operand
  is an extra kernel argument named ``post_op_{i}_src1``, ``i`` its index in the chain.

Generators emit ``functions(chain, types)`` once, before their kernel, and ``apply(...)`` (or
``apply_scalar(...)``) where the value is computed. Descriptors validate chains
(``triodnn._values._post_ops``, which also names the operands); the functions here assume a
valid one. ``generate_scaled`` turns a descriptor's ``output_scale`` into a leading ``linear``
eltwise post-op, so generators know nothing of it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import attrs
import numpy as np

from .._values._post_ops import BINARY_POST_OP_ALGORITHMS
from .._values._post_ops import KINDS as KINDS
from .._values._post_ops import arg_names as arg_names
from .._values._post_ops import operand_name as operand_name
from .._values._post_ops import operands as operands
from ._elementwise import binary_expression, binary_values, eltwise_function, eltwise_values, widen
from ._spec import KernelSpec, c_float

# Binary post-op algorithms: every binary algorithm but the ternary select (the name this module
# has always had).
BINARY_ALGORITHMS: tuple[str, ...] = BINARY_POST_OP_ALGORITHMS


def params(chain: tuple) -> str:
    """Kernel parameters of the operands, each followed by a comma (empty for none)."""
    return "".join(f" __global const float* {name}," for name in operands(chain))


def aligned_strides(dims: tuple[int, ...], strides: tuple[int, ...], ndims: int) -> tuple[int, ...]:
    """Strides right-aligned to ``ndims`` dimensions, 0 where the tensor broadcasts."""
    pad = ndims - len(dims)
    return (0,) * pad + tuple(0 if d == 1 else s for d, s in zip(dims, strides))


def operand_strides(chain: tuple, ndims: int) -> dict[str, tuple[int, ...]]:
    """Each operand's strides aligned to dst's ``ndims`` (0 on broadcast dimensions)."""
    return {name: aligned_strides(md.dims, md.strides, ndims) for name, md in operands(chain).items()}


def operand_access(
    chain: tuple, dst_dims: tuple[int, ...], dst_strides: tuple[int, ...]
) -> dict[str, str] | None:
    """For a flat kernel over dense dst (linear index = memory offset): ``"same"`` for an operand
    laid out as dst, ``"scalar"`` for a one-element one; None when one needs broadcasting that a
    flat kernel cannot express."""
    nd = len(dst_dims)
    dst_aligned = aligned_strides(dst_dims, dst_strides, nd)
    access = {}
    for name, md in operands(chain).items():
        if int(np.prod(md.dims)) == 1:
            access[name] = "scalar"
        elif (
            (1,) * (nd - len(md.dims)) + tuple(md.dims) == tuple(dst_dims)
            and aligned_strides(md.dims, md.strides, nd) == dst_aligned
        ):
            access[name] = "same"
        else:
            return None
    return access


def _fn_name(index: int, type_name: str) -> str:
    return f"post_op_{index}_{type_name}"


def functions(chain: tuple, types: tuple[str, ...] = ("float",)) -> str:
    """C helper functions of the chain's eltwise post-ops, one per type in ``types``."""
    out = []
    for i, op in enumerate(chain):
        if op[0] != "eltwise":
            continue
        _, alg, alpha, beta = op
        for type_name in types:
            out.append(eltwise_function(_fn_name(i, type_name), type_name, alg, alpha, beta))
    return "".join(out)


def apply(
    chain: tuple,
    var: str,
    type_name: str,
    old_dst: str,
    operand: Callable[[str], str],
) -> str:
    """C statements applying ``chain`` to variable ``var`` of type ``type_name`` (non-const).

    ``old_dst`` is an expression of dst's value before the store (type ``type_name``); ``operand``
    maps an operand's argument name to the expression of its value (type ``type_name``)."""
    lines = []
    for i, op in enumerate(chain):
        if op[0] == "eltwise":
            lines.append(f"{var} = {_fn_name(i, type_name)}({var});")
        elif op[0] == "sum":
            lines.append(f"{var} = {var} + ({type_name})({c_float(op[1])}) * ({old_dst});")
        else:
            expr = binary_expression(op[1], type_name)
            lines.append(
                f"{{ const {type_name} a = {var}; const {type_name} b = {operand(operand_name(i))};"
                f" {var} = {expr}; }}"
            )
    return " ".join(lines)


def apply_scalar(chain: tuple, var: str, dst_offset: str, operand_offsets: Mapping[str, str]) -> str:
    """``apply`` on one float: dst read at ``dst_offset``, each operand at its offset expression."""
    return apply(
        chain, var, "float", f"dst[{dst_offset}]", lambda name: f"{name}[{operand_offsets[name]}]"
    )


def apply_flat(chain: tuple, var: str, vec_type: str, access: Mapping[str, str]) -> tuple[str, str]:
    """``apply`` for a flat kernel: on the vector of work-item ``i`` and on the scalar tail element
    ``j``. ``access`` says, per operand, whether it is one value (``"scalar"``) or laid out as dst."""
    vector = apply(
        chain, var, vec_type, f"((__global {vec_type}*)dst)[i]",
        lambda name: f"(({vec_type})({name}[0]))" if access[name] == "scalar"
        else f"((__global const {vec_type}*){name})[i]",
    )
    tail = apply_scalar(
        chain, var, "j", {name: "0" if access[name] == "scalar" else "j" for name in arg_names(chain)}
    )
    return vector, tail


def describe(chain: tuple) -> str:
    """The chain in one comma- and space-free word (verbose lines)."""
    parts = []
    for op in chain:
        if op[0] == "eltwise":
            parts.append(f"eltwise:{op[1]}:{op[2]:g}:{op[3]:g}")
        elif op[0] == "sum":
            parts.append(f"sum:{op[1]:g}")
        else:
            parts.append(f"binary:{op[1]}:{op[2]}")
    return "+".join(parts)


def reference(chain: tuple, value, old_dst=None, operands=None) -> np.ndarray:
    """``chain`` applied to ``value`` (the primitive's result) with numpy, returned as float32.

    ``old_dst``: dst's values before the primitive ran (needed by sum post-ops); ``operands``: the
    binary operands, keyed by chain index or by argument name (``post_op_{i}_src1``). Each step
    rounds to float32, as the kernel does."""
    y = np.asarray(value, dtype=np.float32)
    operands = operands or {}
    for i, op in enumerate(chain):
        if op[0] == "eltwise":
            alpha = op[2] if len(op) > 2 else None  # un-normalised chains: the defaults
            beta = op[3] if len(op) > 3 else None
            y = eltwise_values(op[1], widen(y), alpha, beta)
        elif op[0] == "sum":
            if old_dst is None:
                raise ValueError(f"post_ops[{i}] (sum) needs old_dst")
            scale = float(np.float32(op[1] if len(op) > 1 else 1.0))
            y = (y.astype(np.float64) + scale * np.asarray(old_dst, np.float64)).astype(np.float32)
        elif op[0] == "binary":
            operand = operands.get(i, operands.get(operand_name(i)))
            if operand is None:
                raise ValueError(f"post_ops[{i}] (binary) needs operand {operand_name(i)}")
            y = np.broadcast_to(binary_values(op[1], widen(y), widen(operand)), y.shape).astype(np.float32)
        else:
            raise ValueError(f"post_ops[{i}]: unknown post-op kind {op[0]!r}")
    return y


def scaled_reference(
    chain: tuple, value, old_dst=None, operands=None, *, output_scale: float = 1.0
) -> np.ndarray:
    """``reference`` of ``value * output_scale`` (oneDNN v2's output scales, applied before the
    chain), the product rounded to float32 as the kernels' leading ``linear`` eltwise does."""
    y = np.asarray(value, dtype=np.float32)
    if output_scale != 1.0:
        y = eltwise_values("linear", widen(y), output_scale, 0.0)
    return reference(chain, y, old_dst, operands)


def generate_scaled(
    make_kernel: Callable[[tuple], KernelSpec], post_ops: tuple, output_scale: float
) -> KernelSpec:
    """``make_kernel(chain)`` for a descriptor's validated ``post_ops`` and ``output_scale``.

    A scale other than 1 reaches the generator as a leading ``linear`` eltwise post-op, so the
    generator numbers the chain's binary operands one further than the user did; the spec's
    ``arg_names``, which bind the buffers by position, are renamed back to the user's
    ``post_op_{i}_src1`` (the kernel source keeps the generator's parameter names).
    """
    if output_scale == 1.0:
        return make_kernel(post_ops)
    chain = (("eltwise", "linear", output_scale, 0.0),) + post_ops
    spec = make_kernel(chain)
    user_names = dict(zip(arg_names(chain), arg_names(post_ops)))
    return attrs.evolve(spec, arg_names=tuple(user_names.get(name, name) for name in spec.arg_names))

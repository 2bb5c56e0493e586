"""Post-op chains (oneDNN's attribute post-ops): code applying them inside a generator, and references.

A chain is a tuple of plain tuples, applied in order to a primitive's result before its store:

- ``("eltwise", alg, alpha, beta)``: ``value = alg(value)``, any eltwise algorithm;
- ``("sum", scale)``: ``value = value + scale * dst``, with dst's value read before the store;
- ``("binary", alg, src1)``: ``value = alg(value, operand)``; ``src1`` is a memory descriptor (an
  object with ``dims`` and ``strides``) broadcasting to dst numpy-style (aligned right). The operand
  is an extra kernel argument named ``post_op_{i}_src1``, ``i`` its index in the chain.

Generators emit ``functions(chain, types)`` once, before their kernel, and ``apply(...)`` (or
``apply_scalar(...)``) where the value is computed. Descriptors validate chains (runtime side);
the functions here assume a valid one.
"""

from __future__ import annotations

import string
from typing import Callable, Mapping

import numpy as np

from . import binary as binary_kernels
from . import eltwise as eltwise_kernels
from ._spec import c_float

KINDS: tuple[str, ...] = ("eltwise", "sum", "binary")

# Binary post-op algorithms: every binary algorithm but the ternary select.
BINARY_ALGORITHMS: tuple[str, ...] = tuple(
    a for a in binary_kernels.ALGORITHMS if a not in binary_kernels.TERNARY
)


def operand_name(index: int) -> str:
    return f"post_op_{index}_src1"


def operands(chain: tuple) -> dict[str, object]:
    """``{argument name: memory descriptor}`` of the chain's binary operands, in chain order."""
    return {operand_name(i): op[2] for i, op in enumerate(chain) if op[0] == "binary"}


def arg_names(chain: tuple) -> tuple[str, ...]:
    return tuple(operands(chain))


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
            out.append(eltwise_kernels._function(_fn_name(i, type_name), type_name, alg, alpha, beta))
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
            expr = string.Template(binary_kernels._EXPRESSIONS[op[1]]).substitute(T=type_name)
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
            y = eltwise_kernels.reference(op[1], y, alpha=alpha, beta=beta)
        elif op[0] == "sum":
            if old_dst is None:
                raise ValueError(f"post_ops[{i}] (sum) needs old_dst")
            scale = float(np.float32(op[1] if len(op) > 1 else 1.0))
            y = (y.astype(np.float64) + scale * np.asarray(old_dst, np.float64)).astype(np.float32)
        elif op[0] == "binary":
            operand = operands.get(i, operands.get(operand_name(i)))
            if operand is None:
                raise ValueError(f"post_ops[{i}] (binary) needs operand {operand_name(i)}")
            y = np.broadcast_to(binary_kernels.reference(op[1], y, operand), y.shape).astype(np.float32)
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
        y = eltwise_kernels.reference("linear", y, alpha=output_scale, beta=0.0)
    return reference(chain, y, old_dst, operands)

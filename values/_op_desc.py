"""What every primitive descriptor shares: its declared arguments, dtype policy, argument
descriptors, support check and label, written once for all kinds; and the registry of kinds.

A descriptor is a frozen, hashable attrs value (it is part of the primitive cache key). Each kind
declares, as class attributes:

- ``kind``: the registry name (``"matmul"``), also the cache key's kind and the blob's tag;
- ``ARGS``: its execution arguments in kernel-argument order, each an ``Arg`` naming the field
  that holds the ``MemoryDesc`` (or a tuple of them, for variadic sources), whether it is an
  input or an output, whether it may be absent (None), and which storage types it accepts.

From that, ``OpDesc`` gives ``arg_descs`` (inputs, then the post-op operands ``post_op_{i}_src1``,
then outputs: the order kernels bind), ``check_supported`` (every argument's dtype against its
policy, post-op operands f32), and ``label``. The kernel generator, numpy reference and
tolerance of a kind are registered beside its kernel (``triodnn.kernels``), not here: this layer
imports no kernel.
"""

from __future__ import annotations

from typing import ClassVar

import attrs

from . import _post_ops
from ._dtypes import DATA_TYPES
from ._errors import ArgumentMismatchError, InvalidArgumentError, UnsupportedError
from ._memory_desc import MemoryDesc

# Every storage type a kernel can load and store ("f32 math, any storage"); s4/u4, packed two a
# byte, only where a kind says so (reorder): kernels addressing elements by pointer can't.
ANY_STORAGE: tuple[str, ...] = tuple(name for name, info in DATA_TYPES.items() if not info.packed)
WITH_PACKED: tuple[str, ...] = tuple(DATA_TYPES)
F32: tuple[str, ...] = ("f32",)


@attrs.frozen
class Arg:
    """One execution argument of a primitive kind.

    ``name`` is the field of the descriptor and the argument name at execution; a variadic
    argument (a tuple of memory descriptors in field ``name``) executes as ``{prefix}0``,
    ``{prefix}1``, .... ``dtypes`` is the storage types this argument accepts (``why`` says why
    others are refused, in the error).
    """

    name: str
    output: bool = False
    optional: bool = False
    dtypes: tuple[str, ...] = ANY_STORAGE
    variadic_prefix: str | None = None
    why: str = ""


def check_memory_desc(name: str, value) -> None:
    """``InvalidArgumentError`` naming ``name`` unless ``value`` is a MemoryDesc."""
    if not isinstance(value, MemoryDesc):
        raise InvalidArgumentError(f"{name} is {type(value).__name__}, expected triodnn.MemoryDesc")


def memory_desc(name: str):
    """An attrs validator: ``check_memory_desc`` on the field's value."""

    def validate(instance, attribute, value) -> None:
        check_memory_desc(name, value)

    return validate


def optional_memory_desc(name: str):
    """An attrs validator: None, or ``check_memory_desc`` on the field's value."""

    def validate(instance, attribute, value) -> None:
        if value is not None:
            check_memory_desc(name, value)

    return validate


def one_of(name: str, allowed: tuple):
    """An attrs validator: ``InvalidArgumentError`` naming the field, the value and the allowed
    values unless the value is one of ``allowed``."""

    def validate(instance, attribute, value) -> None:
        if value not in allowed:
            raise InvalidArgumentError(f"{name} {value!r} is not one of {', '.join(map(repr, allowed))}")

    return validate


def algorithm(what: str, known: tuple[str, ...]):
    """An attrs validator for an ``alg`` field: ``InvalidArgumentError`` naming the value and the
    known algorithms unless it is one of ``known``; ``what`` reads "an eltwise", "a pooling"."""

    def validate(instance, attribute, value) -> None:
        if value not in known:
            raise InvalidArgumentError(f"alg {value!r} is not {what} algorithm; known: {', '.join(known)}")

    return validate


class _Omitted:
    """A parameter not given: the descriptor resolves it to the algorithm's default once the
    algorithm is known. Not None, which stays an invalid value rather than a silent default."""

    def __repr__(self) -> str:
        return "<algorithm default>"


OMITTED = _Omitted()


# Descriptor classes by kind: what cache blobs can name, and what the kernel registry covers.
OP_KINDS: dict[str, type] = {}


def op_kind(cls: type) -> type:
    """Class decorator: register a descriptor class under its ``kind``."""
    kind = cls.__dict__.get("kind")
    if not isinstance(kind, str) or not kind:
        raise TypeError(f"{cls.__name__} declares no kind")
    if kind in OP_KINDS and OP_KINDS[kind] is not cls:
        raise TypeError(f"op kind {kind!r} is declared twice: {OP_KINDS[kind].__name__} and {cls.__name__}")
    OP_KINDS[kind] = cls
    return cls


class OpDesc:
    """Base of the primitive descriptors; see the module docstring."""

    __slots__ = ()

    # Every descriptor class is an attrs class (``attrs.fields`` reads it, e.g. for cache blobs).
    __attrs_attrs__: ClassVar[tuple[attrs.Attribute, ...]]
    kind: ClassVar[str]
    ARGS: ClassVar[tuple[Arg, ...]] = ()

    def _set(self, name: str, value) -> None:
        """Set a field of this frozen value while it is being built (``__attrs_post_init__``):
        defaults that depend on other fields (dst from src) and normalised forms."""
        object.__setattr__(self, name, value)

    def _dst_like_src(self, src: MemoryDesc, dst: MemoryDesc | None) -> None:
        """``dst`` defaults to ``src`` (its dims, layout and data type) and must have src's dims:
        the rule of the kinds that map each element to one of the same place (eltwise, softmax,
        the normalizations)."""
        if dst is None:
            self._set("dst", src)
            dst = src
        check_memory_desc("dst", dst)
        if dst.dims != src.dims:
            raise ArgumentMismatchError(f"dst dims {dst.dims} differ from src dims {src.dims}")

    def _arg_items(self, output: bool):
        for arg in self.ARGS:
            if arg.output != output:
                continue
            value = getattr(self, arg.name)
            if value is None:
                continue
            if arg.variadic_prefix is not None:
                for i, md in enumerate(value):
                    yield arg, f"{arg.variadic_prefix}{i}", md
            else:
                yield arg, arg.name, value

    @property
    def arg_descs(self) -> dict[str, MemoryDesc]:
        """``{argument name: MemoryDesc}`` in kernel order: inputs, post-op operands, outputs."""
        descs = {name: md for _, name, md in self._arg_items(False)}
        descs.update(_post_ops.operands(getattr(self, "post_ops", ())))
        descs.update((name, md) for _, name, md in self._arg_items(True))
        return descs

    @property
    def output_names(self) -> frozenset[str]:
        """The execution arguments this primitive writes (``Arg(output=True)``); it reads every
        other one. What graph execution orders writes after earlier reads by."""
        return frozenset(name for _, name, _ in self._arg_items(True))

    def check_supported(self) -> None:
        """``UnsupportedError`` naming the first argument whose dtype this kind cannot store."""
        chain = getattr(self, "post_ops", ())
        for i, op in enumerate(chain):
            if op[0] == "binary" and op[2].dtype != "f32":
                raise UnsupportedError(
                    f"{self.kind}: post_ops[{i}] binary operand {_post_ops.operand_name(i)} has "
                    f"dtype {op[2].dtype!r}; post-op operands are f32 only"
                )
        for output in (False, True):
            for arg, name, md in self._arg_items(output):
                if md.dtype not in arg.dtypes:
                    why = arg.why or f"supported: {', '.join(arg.dtypes)}"
                    raise UnsupportedError(f"{self.kind}: {name} has dtype {md.dtype!r}; {why}")

    @property
    def label(self) -> str:
        """``kind`` or ``kind:alg``: what verbose lines, traces and errors call the primitive."""
        alg = getattr(self, "alg", None)
        return self.kind if alg is None else f"{self.kind}:{alg}"

"""The pooling descriptor, as a value; and the algorithm names and window geometry it validates
against (the kernel and the reference use them too)."""

from __future__ import annotations

import operator

import attrs

from ._errors import ArgumentMismatchError, InvalidArgumentError
from ._memory_desc import MemoryDesc
from ._op_desc import Arg, OpDesc, algorithm, check_memory_desc, memory_desc, op_kind

# By oneDNN name: pooling_max, pooling_avg_include_padding, pooling_avg_exclude_padding.
POOLING_ALGORITHMS: tuple[str, ...] = ("max", "avg_include_padding", "avg_exclude_padding")


def output_extent(in_len: int, kernel: int, stride: int, pad_l: int, pad_r: int, dilation: int) -> int:
    """oneDNN's output length of one spatial dimension (may be <= 0 for invalid geometries)."""
    return (in_len + pad_l + pad_r - ((kernel - 1) * dilation + 1)) // stride + 1


def empty_window(in_len: int, out_len: int, kernel: int, stride: int, pad_l: int, dilation: int) -> int | None:
    """The first output index whose window holds no input element, None when every window does."""
    for o in range(out_len):
        start = o * stride - pad_l
        if not any(0 <= start + k * dilation < in_len for k in range(kernel)):
            return o
    return None


def int_tuple(name: str, value) -> tuple[int, ...] | None:
    """Converter body: an int or a sequence of ints (no bools, no floats) to a tuple; None passes."""
    if value is None:
        return None
    items = (value,) if isinstance(value, int) or not hasattr(value, "__iter__") else value
    if isinstance(items, (str, bytes)):
        raise InvalidArgumentError(f"{name} {value!r} is not a sequence of integers")
    out = []
    for v in items:
        if isinstance(v, bool):
            raise InvalidArgumentError(f"{name} {value!r} must hold integers")
        try:
            out.append(operator.index(v))
        except TypeError:
            raise InvalidArgumentError(f"{name} {value!r} must hold integers") from None
    return tuple(out)


# The fields' converters, one named function each (mypy's attrs plugin types ``__init__`` from a
# named converter; a factory's closure it cannot read).
def _kernel(value) -> tuple[int, ...] | None:
    return int_tuple("kernel", value)


def _strides(value) -> tuple[int, ...] | None:
    return int_tuple("strides", value)


def _padding_l(value) -> tuple[int, ...] | None:
    return int_tuple("padding_l", value)


def _padding_r(value) -> tuple[int, ...] | None:
    return int_tuple("padding_r", value)


def _dilation(value) -> tuple[int, ...] | None:
    return int_tuple("dilation", value)


@op_kind
@attrs.frozen(cache_hash=True)
class PoolingDesc(OpDesc):
    """``dst = pool(src)``, oneDNN's pooling forward, on ``(N, C, spatial...)`` dims, 1-3 spatial.

    ``alg``: ``max``, ``avg_include_padding`` or ``avg_exclude_padding``. ``kernel``, ``strides``,
    ``padding_l`` take one value per spatial dimension (an int means the same for each);
    ``padding_r`` defaults to ``padding_l``; ``dilation`` is the plain factor, default 1 (oneDNN
    counts from 0: its ``d`` is ``d + 1`` here). Any strides for src and dst (NXC via strides).
    ``dst`` defaults to the dense tensor of the computed dims
    ``out = (in + pl + pr - ((k - 1) * dil + 1)) // s + 1``; when given, its dims must match.
    ``src`` and ``dst`` may each have any data type (f32 math); dst defaults to src's.
    """

    alg: str = attrs.field(validator=algorithm("a pooling", POOLING_ALGORITHMS))
    src: MemoryDesc = attrs.field(validator=memory_desc("src"))
    dst: MemoryDesc = attrs.field(default=None)
    kernel: tuple[int, ...] = attrs.field(converter=_kernel, kw_only=True)
    strides: tuple[int, ...] = attrs.field(converter=_strides, kw_only=True)
    padding_l: tuple[int, ...] = attrs.field(converter=_padding_l, kw_only=True)
    padding_r: tuple[int, ...] = attrs.field(default=None, converter=_padding_r, kw_only=True)
    dilation: tuple[int, ...] = attrs.field(default=None, converter=_dilation, kw_only=True)

    kind = "pooling"
    ARGS = (Arg("src"), Arg("dst", output=True))

    def __attrs_post_init__(self) -> None:
        src = self.src
        nsp = src.ndims - 2
        if not 1 <= nsp <= 3:
            raise InvalidArgumentError(
                f"src dims {src.dims} must be (N, C, spatial...) with 1 to 3 spatial dimensions"
            )
        if self.padding_r is None:
            self._set("padding_r", self.padding_l)
        if self.dilation is None:
            self._set("dilation", (1,) * nsp)
        for name in ("kernel", "strides", "padding_l", "padding_r", "dilation"):
            value = getattr(self, name)
            if len(value) == 1 and nsp > 1:
                value = value * nsp
                self._set(name, value)
            if len(value) != nsp:
                raise InvalidArgumentError(
                    f"{name} {value} has {len(value)} values; src {src.dims} has {nsp} spatial dimensions"
                )
        for name, low in (("kernel", 1), ("strides", 1), ("padding_l", 0), ("padding_r", 0), ("dilation", 1)):
            value = getattr(self, name)
            if any(v < low for v in value):
                raise InvalidArgumentError(f"{name} {value} must be >= {low} in every dimension")
        out = []
        for k in range(nsp):
            i_len = src.dims[2 + k]
            o = output_extent(
                i_len, self.kernel[k], self.strides[k], self.padding_l[k], self.padding_r[k], self.dilation[k]
            )
            if o < 1:
                raise InvalidArgumentError(
                    f"kernel {self.kernel} (dilation {self.dilation}) with padding_l {self.padding_l} "
                    f"and padding_r {self.padding_r} does not fit src {src.dims}: spatial dimension {k} "
                    f"would have {o} outputs"
                )
            empty = empty_window(i_len, o, self.kernel[k], self.strides[k], self.padding_l[k], self.dilation[k])
            if empty is not None:
                raise InvalidArgumentError(
                    f"padding_l {self.padding_l} / padding_r {self.padding_r} with kernel {self.kernel}, "
                    f"strides {self.strides}, dilation {self.dilation}: the window of output {empty} in "
                    f"spatial dimension {k} lies entirely in padding"
                )
            out.append(o)
        dims = src.dims[:2] + tuple(out)
        if self.dst is None:
            self._set("dst", MemoryDesc(dims, src.dtype))
        check_memory_desc("dst", self.dst)
        if self.dst.dims != dims:
            raise ArgumentMismatchError(f"dst dims {self.dst.dims} differ from the pooled dims {dims}")

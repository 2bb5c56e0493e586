"""The pooling backward descriptor: ``diff_src`` from ``diff_dst`` (and, for max, the forward's
``src``), as a value."""

from __future__ import annotations

import attrs

from ._errors import ArgumentMismatchError, InvalidArgumentError
from ._memory_desc import MemoryDesc
from ._op_desc import Arg, OpDesc, algorithm, check_memory_desc, memory_desc, op_kind
from ._pooling_desc import POOLING_ALGORITHMS, PoolingDesc, _dilation, _kernel, _padding_l, _padding_r, _strides


@op_kind
@attrs.frozen(cache_hash=True)
class PoolingBackwardDesc(OpDesc):
    """``diff_src`` of oneDNN's pooling backward, on ``(N, C, spatial...)`` dims, 1-3 spatial.

    The geometry (``kernel``, ``strides``, ``padding_l``, ``padding_r``, ``dilation``) means what
    it means for ``PoolingDesc``, whose forward of ``diff_src``'s dims must give ``diff_dst``'s
    dims. ``avg_*``: each diff_dst element spreads over its window, divided as the forward divides.
    ``max`` needs the forward's ``src`` (diff_src's dims): each diff_dst element goes to the first
    maximum of its window in tap order (oneDNN's workspace rule: a later tap wins only when
    strictly greater); avg algorithms take no src. Any strides and storage types, f32 math.
    """

    alg: str = attrs.field(validator=algorithm("a pooling backward", POOLING_ALGORITHMS))
    diff_dst: MemoryDesc = attrs.field(validator=memory_desc("diff_dst"))
    diff_src: MemoryDesc = attrs.field(validator=memory_desc("diff_src"))
    src: MemoryDesc | None = attrs.field(default=None)
    kernel: tuple[int, ...] = attrs.field(converter=_kernel, kw_only=True)
    strides: tuple[int, ...] = attrs.field(converter=_strides, kw_only=True)
    padding_l: tuple[int, ...] = attrs.field(converter=_padding_l, kw_only=True)
    padding_r: tuple[int, ...] = attrs.field(default=None, converter=_padding_r, kw_only=True)
    dilation: tuple[int, ...] = attrs.field(default=None, converter=_dilation, kw_only=True)

    kind = "pooling_backward"
    ARGS = (Arg("src", optional=True), Arg("diff_dst"), Arg("diff_src", output=True))

    def __attrs_post_init__(self) -> None:
        # The forward descriptor on diff_src's dims validates the geometry and normalises the
        # per-dimension values; its errors speak of src, which here is diff_src's shape.
        try:
            forward = PoolingDesc(
                self.alg, MemoryDesc(self.diff_src.dims, "f32"), kernel=self.kernel, strides=self.strides,
                padding_l=self.padding_l, padding_r=self.padding_r, dilation=self.dilation,
            )
        except InvalidArgumentError as error:
            raise InvalidArgumentError(f"diff_src {self.diff_src.dims} (the forward's src): {error}") from None
        for name in ("kernel", "strides", "padding_l", "padding_r", "dilation"):
            self._set(name, getattr(forward, name))
        if self.diff_dst.dims != forward.dst.dims:
            raise ArgumentMismatchError(
                f"diff_dst dims {self.diff_dst.dims} differ from the pooled dims {forward.dst.dims} "
                f"of diff_src {self.diff_src.dims}"
            )
        if self.alg == "max":
            if self.src is None:
                raise InvalidArgumentError("max pooling backward needs the forward's src (where the maxima are)")
            check_memory_desc("src", self.src)
            if self.src.dims != self.diff_src.dims:
                raise ArgumentMismatchError(f"src dims {self.src.dims} differ from diff_src dims {self.diff_src.dims}")
        elif self.src is not None:
            raise InvalidArgumentError(f"{self.alg} pooling backward takes no src (got {self.src!r})")

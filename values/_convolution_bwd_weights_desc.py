"""The convolution backward-weights descriptor: the gradient of a convolution's weights."""

from __future__ import annotations

import attrs

from ._convolution_desc import _per_axis, check_spatial, output_spatial
from ._errors import ArgumentMismatchError, InvalidArgumentError
from ._memory_desc import MemoryDesc
from ._op_desc import Arg, OpDesc, check_memory_desc, op_kind


@op_kind
@attrs.frozen(cache_hash=True)
class ConvolutionBackwardWeightsDesc(OpDesc):
    """Weights gradient of a forward convolution (oneDNN's ``convolution_backward_weights``),
    1D/2D/3D: ``diff_weights[oc, ic, k...] = sum_{n, o...} src[n, g * ICg + ic, o * s - pl + k *
    dil] * diff_dst[n, oc, o...]`` with ``g = oc // OCg`` and the padding reading as zero.

    * ``src``: the forward's src, (N, C, spatial...), any strides.
    * ``diff_dst``: the gradient of the forward's dst, (N, OC, out...) with ``out`` by
      ``ConvolutionDesc``'s rule, any strides.
    * ``diff_weights``: (OC, C / groups, k...), the plain (ungrouped) form of ``ConvolutionDesc``'s
      weights, any strides; the kernel sizes come from its dims.
    * ``strides``, ``padding_l``, ``padding_r``, ``dilation``, ``groups``: as ``ConvolutionDesc``'s
      (dilation a plain factor, 1 = none).

    A transposed convolution's weights gradient is this one with src and diff_dst swapped (its
    dst is the input of the convolution it transposes), the weights ``(IC, OC/groups, k...)``.
    Any storage type for each tensor, f32 math.
    """

    src: MemoryDesc
    diff_dst: MemoryDesc
    diff_weights: MemoryDesc
    strides: tuple[int, ...] = attrs.field(default=None)
    padding_l: tuple[int, ...] = attrs.field(default=None)
    padding_r: tuple[int, ...] = attrs.field(default=None)
    dilation: tuple[int, ...] = attrs.field(default=None)
    groups: int = 1

    kind = "convolution_backward_weights"
    ARGS = (Arg("src"), Arg("diff_dst"), Arg("diff_weights", output=True))

    @property
    def weights(self) -> MemoryDesc:
        # check_spatial reads the weights' rank from here.
        return self.diff_weights

    def __attrs_post_init__(self) -> None:
        check_memory_desc("diff_weights", self.diff_weights)
        nsp, groups, strides = check_spatial(self, "OC, C/groups")
        self._set("groups", groups)
        self._set("strides", strides)
        if self.dilation is not None and 0 in (
            self.dilation if isinstance(self.dilation, (list, tuple)) else (self.dilation,)
        ):
            raise InvalidArgumentError(
                f"dilation {self.dilation!r} must be >= 1: it is a plain factor here, 1 = none "
                "(oneDNN's 0 = none is 1 here)"
            )
        self._set("dilation", _per_axis("dilation", self.dilation, nsp, 1, 1))
        self._set("padding_l", _per_axis("padding_l", self.padding_l, nsp, 0, 0))
        padding_r = self.padding_l if self.padding_r is None else self.padding_r
        self._set("padding_r", _per_axis("padding_r", padding_r, nsp, 0, 0))
        check_memory_desc("diff_dst", self.diff_dst)

        n, c = self.src.dims[:2]
        oc, icg = self.diff_weights.dims[:2]
        if c % groups or oc % groups:
            raise ArgumentMismatchError(
                f"src channels {c} and diff_weights output channels {oc} (dims {self.diff_weights.dims}) "
                f"must both be divisible by groups {groups}"
            )
        if icg != c // groups:
            raise ArgumentMismatchError(
                f"diff_weights dims {self.diff_weights.dims} have {icg} input channels per group; src has "
                f"{c} channels in {groups} groups, so {c // groups} are expected"
            )
        dims = (n, oc) + output_spatial("diff_weights", self.src.dims, self.diff_weights.dims, self.strides,
                                        self.padding_l, self.padding_r, self.dilation)
        if self.diff_dst.dims != dims:
            raise ArgumentMismatchError(
                f"diff_dst dims {self.diff_dst.dims} differ from the convolution's output dims {dims} "
                f"(src {self.src.dims}, diff_weights {self.diff_weights.dims})"
            )

    @property
    def label(self) -> str:
        return f"convolution bwd weights {self.src.ndims - 2}d" + (f" g{self.groups}" if self.groups > 1 else "")

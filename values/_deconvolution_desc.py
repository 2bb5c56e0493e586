"""The deconvolution (transposed convolution, forward) descriptor, and its output-size rule."""

from __future__ import annotations

import attrs

from ._convolution_desc import _layout_like, _per_axis, check_spatial
from ._errors import ArgumentMismatchError
from ._memory_desc import MemoryDesc
from ._op_desc import Arg, OpDesc, check_memory_desc, op_kind


def deconv_out_size(in_size: int, kernel: int, stride: int, pad_l: int, pad_r: int, dilation: int,
                    output_padding: int = 0) -> int:
    """``(in - 1) * s + (k - 1) * dil + 1 - pl - pr + output_padding``: the input size of the
    convolution this one transposes (oneDNN Graph's infer_convtranspose_output_shape)."""
    return (in_size - 1) * stride + (kernel - 1) * dilation + 1 - pad_l - pad_r + output_padding


@op_kind
@attrs.frozen(cache_hash=True)
class DeconvolutionDesc(OpDesc):
    """Forward deconvolution (transposed convolution), 1D/2D/3D: the gradient of a convolution
    with respect to its src, ``dst[n, oc, i * s - pl + k * dil] += src[n, ic, i] * weights[ic,
    oc % OCg, k]`` over the input channels ``ic`` of ``oc``'s group.

    * ``src``: (N, IC, spatial...), any strides.
    * ``weights``: (IC, OC / groups, k...), any strides: the transposed convolution's own form
      (oneDNN Graph's ``IOX``, PyTorch's ``ConvTranspose`` weight); the groups split IC and OC
      alike, and come from ``groups``.
    * ``bias``: optional, (OC,).
    * ``dst``: (N, OC, out...) with ``out = (in - 1) * s + (k - 1) * dil + 1 - pl - pr +
      output_padding``; defaults to the dense layout with src's axis order.
    * ``strides``, ``padding_l``, ``padding_r``, ``dilation``, ``output_padding`` (keyword): an
      int or one per spatial axis, as ``ConvolutionDesc``'s; dilation is a plain factor (1 =
      none). ``output_padding`` (default 0) adds output positions at the end, which only bias
      and the taps reaching them fill.

    Any storage type for each tensor, f32 math.
    """

    src: MemoryDesc
    weights: MemoryDesc
    dst: MemoryDesc = attrs.field(default=None)
    bias: MemoryDesc | None = None
    strides: tuple[int, ...] = attrs.field(default=None)
    padding_l: tuple[int, ...] = attrs.field(default=None)
    padding_r: tuple[int, ...] = attrs.field(default=None)
    dilation: tuple[int, ...] = attrs.field(default=None)
    groups: int = 1
    output_padding: tuple[int, ...] = attrs.field(default=None, kw_only=True)

    kind = "deconvolution"
    ARGS = (Arg("src"), Arg("weights"), Arg("bias", optional=True), Arg("dst", output=True))

    def __attrs_post_init__(self) -> None:
        nsp, groups, strides = check_spatial(self, "IC, OC/groups")
        self._set("groups", groups)
        self._set("strides", strides)
        self._set("dilation", _per_axis("dilation", self.dilation, nsp, 1, 1))
        self._set("padding_l", _per_axis("padding_l", self.padding_l, nsp, 0, 0))
        padding_r = self.padding_l if self.padding_r is None else self.padding_r
        self._set("padding_r", _per_axis("padding_r", padding_r, nsp, 0, 0))
        self._set("output_padding", _per_axis("output_padding", self.output_padding, nsp, 0, 0))

        n, ic = self.src.dims[:2]
        wic, ocg = self.weights.dims[:2]
        if ic % groups:
            raise ArgumentMismatchError(f"src channels {ic} (dims {self.src.dims}) are not divisible by groups {groups}")
        if wic != ic:
            raise ArgumentMismatchError(
                f"weights dims {self.weights.dims} have {wic} input channels; src dims {self.src.dims} have {ic}"
            )
        out = []
        for i in range(nsp):
            o = deconv_out_size(self.src.dims[2 + i], self.weights.dims[2 + i], self.strides[i], self.padding_l[i],
                                self.padding_r[i], self.dilation[i], self.output_padding[i])
            if o < 1:
                raise ArgumentMismatchError(
                    f"spatial axis {i}: the padding {self.padding_l[i]} + {self.padding_r[i]} leaves no output "
                    f"(src size {self.src.dims[2 + i]}, kernel {self.weights.dims[2 + i]}, stride {self.strides[i]})"
                )
            out.append(o)
        dims = (n, ocg * groups) + tuple(out)
        if self.dst is None:
            self._set("dst", _layout_like(dims, self.src))
        check_memory_desc("dst", self.dst)
        if self.dst.dims != dims:
            raise ArgumentMismatchError(f"dst dims {self.dst.dims} differ from the deconvolution's output dims {dims}")
        if self.bias is not None:
            check_memory_desc("bias", self.bias)
            if self.bias.dims != (dims[1],):
                raise ArgumentMismatchError(f"bias dims {self.bias.dims} must be ({dims[1]},), one per output channel")

    @property
    def label(self) -> str:
        return f"deconvolution {self.src.ndims - 2}d" + (f" g{self.groups}" if self.groups > 1 else "")

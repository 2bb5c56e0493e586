"""Pure values: errors, data types, memory descriptors, op descriptors, post-op chains, keys.

The bottom layer of triodnn. Nothing here imports pyopencl or trio, or any other triodnn layer:
kernels generate from these values, actors key caches on them, the public API re-exports them.
"""

from ._binary_desc import BinaryDesc as BinaryDesc
from ._concat_desc import ConcatDesc as ConcatDesc
from ._convolution_bwd_weights_desc import ConvolutionBackwardWeightsDesc as ConvolutionBackwardWeightsDesc
from ._convolution_desc import ConvolutionDesc as ConvolutionDesc
from ._deconvolution_desc import DeconvolutionDesc as DeconvolutionDesc
from ._dequantizing_matmul_desc import DequantizingMatmulDesc as DequantizingMatmulDesc  # int4/int8 weights
from ._dropout_desc import DropoutDesc as DropoutDesc  # Dropout with oneDNN's Philox mask
from ._dynamic_quantize_desc import DynamicQuantizeDesc as DynamicQuantizeDesc
from ._eltwise_bwd_desc import EltwiseBackwardDesc as EltwiseBackwardDesc
from ._eltwise_desc import EltwiseDesc as EltwiseDesc
from ._errors import ArgumentMismatchError as ArgumentMismatchError
from ._errors import BuildError as BuildError
from ._errors import CacheBlobError as CacheBlobError
from ._errors import ClosedError as ClosedError
from ._errors import DependencyError as DependencyError
from ._errors import DeviceLostError as DeviceLostError
from ._errors import EngineMismatchError as EngineMismatchError
from ._errors import EngineNotFoundError as EngineNotFoundError
from ._errors import ExecutionError as ExecutionError
from ._errors import InvalidArgumentError as InvalidArgumentError
from ._errors import InvalidGraphError as InvalidGraphError
from ._errors import MissingArgumentError as MissingArgumentError
from ._errors import NotSubmittedError as NotSubmittedError
from ._errors import OutOfMemoryError as OutOfMemoryError
from ._errors import ProfilingError as ProfilingError
from ._errors import ShapeInferenceError as ShapeInferenceError
from ._errors import TriodnnError as TriodnnError
from ._errors import UnsupportedError as UnsupportedError
from ._errors import UnusableDeviceWarning as UnusableDeviceWarning
from ._errors import WrongThreadError as WrongThreadError
from ._gen_index_desc import GenIndexDesc as GenIndexDesc
from ._keys import DeviceIdentity as DeviceIdentity
from ._keys import DeviceInfo as DeviceInfo
from ._keys import EngineIdentity as EngineIdentity
from ._keys import PrimitiveImpl as PrimitiveImpl
from ._keys import PrimitiveKey as PrimitiveKey
from ._matmul_desc import MatmulDesc as MatmulDesc
from ._memory_desc import MemoryDesc as MemoryDesc
from ._normalization_bwd_desc import BatchNormBackwardDesc as BatchNormBackwardDesc
from ._normalization_bwd_desc import BatchNormTrainingDesc as BatchNormTrainingDesc
from ._normalization_bwd_desc import LayerNormBackwardDesc as LayerNormBackwardDesc
from ._normalization_desc import BatchNormInferenceDesc as BatchNormInferenceDesc
from ._normalization_desc import GroupNormDesc as GroupNormDesc
from ._normalization_desc import LayerNormDesc as LayerNormDesc
from ._normalization_desc import RMSNormDesc as RMSNormDesc
from ._op_desc import OP_KINDS as OP_KINDS
from ._op_desc import Arg as Arg
from ._op_desc import OpDesc as OpDesc
from ._op_desc import op_kind as op_kind
from ._pooling_bwd_desc import PoolingBackwardDesc as PoolingBackwardDesc
from ._pooling_desc import PoolingDesc as PoolingDesc
from ._prelu_bwd_desc import PreluBackwardDesc as PreluBackwardDesc
from ._prelu_desc import PreluDesc as PreluDesc
from ._quantization import Quantization as Quantization  # quantized SDPA operands
from ._quantize_desc import QuantizeDesc as QuantizeDesc
from ._quantized_matmul_desc import QuantizedMatmulDesc as QuantizedMatmulDesc  # int8 matmul
from ._reduction_desc import ReductionDesc as ReductionDesc
from ._reorder_desc import CrossEngineReorderDesc as CrossEngineReorderDesc
from ._reorder_desc import ReorderDesc as ReorderDesc
from ._resampling_bwd_desc import ResamplingBackwardDesc as ResamplingBackwardDesc
from ._resampling_desc import ResamplingDesc as ResamplingDesc
from ._sdpa_backward_desc import SdpaBackwardDesc as SdpaBackwardDesc  # fused SDPA backward
from ._sdpa_desc import SdpaDesc as SdpaDesc
from ._softmax_bwd_desc import SoftmaxBackwardDesc as SoftmaxBackwardDesc
from ._softmax_desc import SoftmaxDesc as SoftmaxDesc
from ._sum_desc import SumDesc as SumDesc

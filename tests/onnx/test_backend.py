"""triodnn.onnx.backend under ONNX's own backend tests: the models and expected outputs the
``onnx`` wheel ships (``onnx/backend/test/data``), none of them written here.

``onnx.backend.test.BackendTest`` makes one unittest case per model and device; this module
includes pytorch-converted/ and pytorch-operator/ whole (117 models: 112 run, 5 are excluded
below, f64 inputs) and excludes, by name, what triodnn refuses, each with why.
Devices the machine lacks are skipped by ONNX's runner (``supports_device``). Of the node tests
(one ONNX operator each, about 1500), ``NODE_CASES`` picks cases of each converter's attributes,
and two a converter must leave to the Wildcard (integer division, a ceil-mode window ONNX drops).
"""

from __future__ import annotations

import os
import re

import numpy as np
import onnx
import onnx.backend.test
import onnx.numpy_helper
import pytest
from onnx.backend.test.runner import Runner

import triodnn
import triodnn.onnx.backend as backend
from triodnn._runtime import default_engine_spec

# The engine the suite runs on ($TRIODNN_ENGINE, else cpu:0): a GPU machine may have no CPU
# OpenCL device at all. ONNX's runner asks for "CPU" and "CUDA" itself.
DEVICE = default_engine_spec()

# node/: one or a few cases of each converter's attributes (the whole family of every converted
# op takes minutes on 2 cores, most of it kernel builds)
NODE_CASES = (
    "basic_conv_with_padding", "conv_with_strides_and_asymmetric_padding", "conv_with_autopad_same",
    "conv_with_strides_padding", "maxpool_2d_pads", "maxpool_2d_ceil", "maxpool_2d_dilations",
    "maxpool_2d_same_upper", "maxpool_3d_default", "averagepool_2d_pads_count_include_pad",
    "averagepool_2d_same_lower", "averagepool_2d_strides", "globalaveragepool", "globalmaxpool",
    "batchnorm_epsilon", "gemm_all_attributes", "gemm_alpha", "gemm_beta", "gemm_transposeA",
    "gemm_default_vector_bias", "matmul_3d", "matmul_4d", "softmax_axis_0", "softmax_default_axis",
    "logsoftmax_axis_1", "relu", "leakyrelu", "elu", "hardsigmoid", "clip", "gelu_tanh_1", "softplus",
    "sigmoid", "add_bcast", "div_bcast", "pow_bcast_scalar", "max_example", "sum_example",
    "concat_3d_axis_1", "transpose_all_permutations_0", "reshape_reordered_all_dims", "flatten_axis2",
    "squeeze", "unsqueeze_axis_1", "reduce_mean_keepdims_example", "reduce_sum_keepdims_example",
    "reduce_max_do_not_keepdims_example", "layer_normalization_2d_axis_negative_1", "where_example",
    "cast_FLOAT_to_FLOAT16", "div_int32_trunc", "maxpool_2d_ceil_output_size_reduce_by_one",
    "convtranspose", "convtranspose_pads", "convtranspose_dilations", "convtranspose_group_2",
    "convtranspose_output_shape", "prelu_example", "prelu_broadcast", "quantizelinear", "quantizelinear_axis",
    "dequantizelinear", "dequantizelinear_axis", "neg", "selu", "selu_default", "instancenorm_example",
    "instancenorm_epsilon", "lrn", "lrn_default",
)

# Every model of pytorch-converted/ (torch.nn modules exported to ONNX) and pytorch-operator/
# (torch operators): the directories whose pass rate is held to 90% or more.
WHOLE = ("OnnxBackendPyTorchConvertedModelTest", "OnnxBackendPyTorchOperatorModelTest")
INCLUDED = [rf"^test_({'|'.join(NODE_CASES)})_(cpu|cuda)$"]
EXCLUDED = {
    # f64 tensors: triodnn's kernels compute in f32 at most, and refuse f64 inputs by name
    r"^test_operator_add_broadcast_": "f64 inputs",
    r"^test_operator_add_size1_": "f64 inputs",
    r"^test_operator_addconstant_": "f64 inputs",
}

backend_test = onnx.backend.test.BackendTest(backend, __name__)
for pattern in EXCLUDED:
    backend_test.exclude(pattern)
def _included(cases: dict) -> dict:
    """Only what is included becomes a test here (ONNX's runner would list every other case as
    skipped). A function, so that no loop variable is left in the module for pytest to collect."""
    for class_name, case in cases.items():
        for attribute in [a for a in vars(case) if a.startswith("test_")]:
            if class_name not in WHOLE and not any(re.search(pattern, attribute) for pattern in INCLUDED):
                delattr(case, attribute)
    return cases


globals().update(_included(backend_test.test_cases))  # a property that makes new classes at each reading


@pytest.fixture(autouse=True, scope="module")
def _close_the_backends_portal():
    """The backend's portal (a runtime and its thread) ends with this module, not with the test
    process: later test files of the same worker start from no runtime."""
    yield
    backend.close()


def test_the_exclusions_still_fail_as_said():
    """Each excluded model still fails with the typed error its reason names, so an exclusion
    that starts passing is noticed."""
    data = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "pytorch-operator")
    for name, error, words in (("test_operator_add_broadcast", triodnn.UnsupportedError, "ONNX element type 11"),):
        with pytest.raises(error, match=words):
            backend.prepare(onnx.load(os.path.join(data, name, "model.onnx")), DEVICE).run(
                _inputs(os.path.join(data, name, "test_data_set_0")))


def _inputs(directory):
    names = sorted(f for f in os.listdir(directory) if f.startswith("input_"))
    return [onnx.numpy_helper.to_array(onnx.load_tensor(os.path.join(directory, f))) for f in names]


def test_squeezenet_from_the_light_models():
    """ONNX's light SqueezeNet (weights generated by ConstantOfShape, folded at import; Dropout
    passed through; the opset-9 Softmax over a 4-D tensor), on the input ONNX's runner makes
    for it, against the output the wheel ships (the runner's tolerance for light models)."""
    data = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light")
    model = onnx.load(os.path.join(data, "light_squeezenet.onnx"))
    inits = {i.name for i in model.graph.initializer}
    (info,) = [i for i in model.graph.input if i.name not in inits]
    x = Runner.generate_dummy_data(info, seed=0, name="squeezenet", random=False)
    want = onnx.numpy_helper.to_array(onnx.load_tensor(os.path.join(data, "light_squeezenet_output_0.pb")))
    rep = backend.prepare(model, DEVICE)
    assert not rep.onnx_graph.wildcard_nodes
    (got,) = rep.run([x])
    np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-7)


def test_inputs_and_devices_are_checked():
    model = onnx.helper.make_model(onnx.helper.make_graph(
        [onnx.helper.make_node("Relu", ["x"], ["y"])], "g",
        [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [3])],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [3])]))
    rep = backend.prepare(model, DEVICE)
    x = np.array([-1.0, 0.0, 2.0], np.float32)
    np.testing.assert_array_equal(rep.run({"x": x}).y, [0.0, 0.0, 2.0])
    np.testing.assert_array_equal(backend.run_model(model, [x], DEVICE)[0], [0.0, 0.0, 2.0])
    with pytest.raises(triodnn.InvalidArgumentError, match=r"inputs \['z'\] are not the model's; it takes \['x'\]"):
        rep.run({"z": x})
    with pytest.raises(triodnn.InvalidArgumentError, match=r"2 inputs given; the model takes 1: \['x'\]"):
        rep.run([x, x])
    with pytest.raises(triodnn.InvalidArgumentError, match="device 'TPU'"):
        backend.prepare(model, "TPU")
    assert backend.supports_device(DEVICE) and not backend.supports_device("TPU")
    backend.close()
    with pytest.raises(triodnn.ClosedError):
        rep.run({"x": x})
    np.testing.assert_array_equal(backend.run_model(model, [x], DEVICE)[0], [0.0, 0.0, 2.0])  # a new portal
    assert backend.supports_device("GPU") == any(r.kind == "gpu" for r in triodnn.available_engines())
    assert backend.supports_device("CPU") == any(r.kind == "cpu" for r in triodnn.available_engines())

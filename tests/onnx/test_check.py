"""``triodnn onnx`` and ``triodnn.onnx.check_model``: a model from ONNX's test data checked against
the data set shipped beside it, a model without data sets against ONNX Runtime (or, where it is
not installed, the reference evaluator), a
wrong expected output reported as FAILED (exit 1), input errors (exit 2)."""

from __future__ import annotations

import os
import shutil

import numpy as np
import onnx
import pytest
import trio
from onnx import TensorProto, helper, numpy_helper

import triodnn.onnx
from triodnn._cli import main
from triodnn._runtime import default_engine_spec
from triodnn.onnx import reference_name, reference_outputs

DATA = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "pytorch-converted")


def test_a_shipped_model_passes_and_is_timed(capsys):
    model = os.path.join(DATA, "test_Conv2d", "model.onnx")
    assert main(["onnx", model, "--mode", "CP", "--repeat", "3"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith(f"0:PASSED {model} test_data_set_0: max abs error ")
    assert out[1].startswith(f"perf: {model} on {default_engine_spec()} (") and out[1].endswith("over 3 runs, each awaited")
    assert out[-1] == "tests:1 passed:1 failed:0"


def test_a_wrong_expected_output_fails(tmp_path, capsys):
    shutil.copytree(os.path.join(DATA, "test_Linear"), tmp_path / "m")
    out_file = tmp_path / "m" / "test_data_set_0" / "output_0.pb"
    want = numpy_helper.to_array(onnx.load_tensor(str(out_file)))
    onnx.save_tensor(numpy_helper.from_array(want + 1.0), str(out_file))
    assert main(["onnx", str(tmp_path / "m" / "model.onnx")]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("0:FAILED") and f"output 0: {want.size} of {want.size} outside tolerance" in out[0]
    assert out[-1] == "tests:1 passed:0 failed:1"


def test_without_data_sets_onnx_runtime_or_the_reference_evaluator_decides(tmp_path):
    """A symbolic batch dim runs as 1; the LRN node runs through its handler (one Wildcard)."""
    graph = helper.make_graph(
        [helper.make_node("LRN", ["x"], ["l"], size=3), helper.make_node("Sigmoid", ["l"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4, 5, 5])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4, 5, 5])])
    path = tmp_path / "lrn.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), str(path))
    result = trio.run(lambda: triodnn.onnx.check_model(str(path), mode="CP", repeat=2))
    assert result.passed and result.wildcard_ops == 1 and len(result.times_ms) == 2
    (check,) = result.data_sets
    assert check.name == f"drawn (seed 0) against {reference_name()}" and check.max_abs_error < 1e-6


def test_onnx_runtime_and_the_reference_evaluator_agree_on_a_small_model():
    """Both references ``check_model`` may use, on one model: ONNX Runtime (installed with the
    test extra) and ONNX's reference evaluator, its stand-in elsewhere."""
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Tanh", ["m"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])],
        [numpy_helper.from_array(np.arange(12, dtype=np.float32).reshape(3, 4) / 10, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    x = np.linspace(-1, 1, 6, dtype=np.float32).reshape(2, 3)
    want = np.tanh(x.astype(np.float64) @ (np.arange(12).reshape(3, 4) / 10))
    assert reference_name().startswith("ONNX Runtime ")
    for use_onnxruntime in (True, False):
        (y,) = reference_outputs(model, {"x": x}, onnxruntime=use_onnxruntime)
        np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-6)


def test_the_reference_evaluator_computes_lrn_as_onnx_runtime_does():
    """On one image, onnx 1.23's own LRN leaves every channel but the first undivided; the
    evaluator ``reference_outputs`` falls back on carries triodnn's LRN, which agrees with
    ONNX Runtime (the specification)."""
    graph = helper.make_graph(
        [helper.make_node("LRN", ["x"], ["y"], size=3, alpha=0.5, beta=1.0, bias=1.0)], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 1, 1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 1, 1])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    x = np.arange(1, 5, dtype=np.float32).reshape(1, 4, 1, 1)
    (by_runtime,) = reference_outputs(model, {"x": x})
    (by_evaluator,) = reference_outputs(model, {"x": x}, onnxruntime=False)
    np.testing.assert_allclose(by_evaluator, by_runtime, rtol=1e-6)
    squares = np.arange(1, 5, dtype=np.float64) ** 2
    windows = [squares[max(0, c - 1):c + 2].sum() for c in range(4)]
    np.testing.assert_allclose(by_evaluator.reshape(4), np.arange(1, 5) / (1 + 0.5 / 3 * np.array(windows)), rtol=1e-6)


def test_a_batch_repeats_the_sample(tmp_path, capsys):
    """A model with a symbolic batch dim and a data set of batch 1, run as a batch of 4."""
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Softmax", ["r"], ["y"], axis=1)], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 6])])
    folder = tmp_path / "m"
    (folder / "test_data_set_0").mkdir(parents=True)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    onnx.save(model, str(folder / "model.onnx"))
    x = np.linspace(-1, 1, 6, dtype=np.float32).reshape(1, 6)
    r = np.maximum(x, 0).astype(np.float64)
    want = np.exp(r) / np.exp(r).sum(1, keepdims=True)
    onnx.save_tensor(numpy_helper.from_array(x), str(folder / "test_data_set_0" / "input_0.pb"))
    onnx.save_tensor(numpy_helper.from_array(want.astype(np.float32)), str(folder / "test_data_set_0" / "output_0.pb"))
    assert main(["onnx", str(folder / "model.onnx"), "--batch", "4"]) == 0
    assert capsys.readouterr().out.splitlines()[0].startswith(f"0:PASSED {folder / 'model.onnx'} test_data_set_0 x4:")


def test_input_errors_exit_2(tmp_path, capsys):
    assert main(["onnx", str(tmp_path / "missing.onnx")]) == 2
    assert "OnnxImportError: no ONNX model at" in capsys.readouterr().err
    assert main(["onnx", os.path.join(DATA, "test_Conv2d", "model.onnx"), "--input-shape", "x:3xq"]) == 2
    assert "--input-shape 'x:3xq' is not NAME:AxBxC" in capsys.readouterr().err
    with pytest.raises(triodnn.onnx.OnnxImportError, match="mode 'X' is not C, P or CP"):
        trio.run(lambda: triodnn.onnx.check_model(os.path.join(DATA, "test_Conv2d", "model.onnx"), mode="X"))
    assert np.isinf(triodnn.onnx._check.compare([np.zeros(2)], [np.zeros(3)])[1])

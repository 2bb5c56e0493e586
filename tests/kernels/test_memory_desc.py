"""MemoryDesc as a value (layouts, sizes, validation) and the kernels' pure layout helpers."""

from __future__ import annotations

import math

import numpy as np
import pytest

import triodnn
from triodnn import InvalidArgumentError, MemoryDesc
from triodnn.kernels import c_float, dense_strides, is_dense

# -- layouts -----------------------------------------------------------------------------------


def test_default_strides_are_dense_row_major():
    """Omitted strides mean row-major, dense, f32: what from_numpy and BinaryDesc's dst assume."""
    desc = MemoryDesc((2, 3, 4))
    assert desc.strides == (12, 4, 1)
    assert desc.dtype == "f32"
    assert (desc.ndims, desc.nelems, desc.span, desc.nbytes) == (3, 24, 24, 96)
    assert desc.is_dense
    assert MemoryDesc(7).dims == (7,) and MemoryDesc(7).strides == (1,)
    assert MemoryDesc((5, 1, 3)).strides == (3, 3, 1)


def test_dims_accept_numpy_integers():
    desc = MemoryDesc(np.array([2, 3]), "f16", np.array([3, 1]))
    assert desc.dims == (2, 3) and desc.strides == (3, 1)
    assert all(type(v) is int for v in desc.dims + desc.strides)


@pytest.mark.parametrize(
    "dims, tag, strides",
    [
        ((2, 3, 4, 5), "nhwc", (60, 1, 15, 3)),
        ((2, 3, 4, 5), "acdb", (60, 1, 15, 3)),
        ((2, 3, 4, 5), "nchw", (60, 20, 5, 1)),
        ((2, 3, 4, 5), "chwn", (1, 40, 10, 2)),
        ((3, 4), "ba", (1, 3)),
        ((3, 4), "io", (1, 3)),
        ((2, 3, 4), "bac", (4, 8, 1)),
        ((2, 3, 4), "ntc", (4, 8, 1)),
    ],
)
def test_format_tag_resolves_to_strides(dims, tag, strides):
    """A tag is only a spelling: it resolves to strides, so equality and hashing see one layout."""
    by_tag = MemoryDesc(dims, "f32", tag)
    explicit = MemoryDesc(dims, "f32", strides)
    assert by_tag.strides == strides
    assert by_tag == explicit and hash(by_tag) == hash(explicit)
    assert by_tag.is_dense and by_tag.span == math.prod(dims)
    assert len({by_tag, explicit}) == 1


def test_tag_and_row_major_differ_from_each_other():
    assert MemoryDesc((2, 3, 4, 5), strides="nhwc") != MemoryDesc((2, 3, 4, 5))
    assert MemoryDesc((2, 3, 4, 5), strides="nchw") == MemoryDesc((2, 3, 4, 5))
    assert MemoryDesc((4,), "f32") != MemoryDesc((4,), "f16")


@pytest.mark.parametrize("tag", ["nhwc", "abc", "abcz", "aabc", "abcde", ""])
def test_bad_format_tag(tag):
    with pytest.raises(InvalidArgumentError, match=f"format_tag '{tag}'"):
        MemoryDesc((2, 3, 4, 5) if tag != "nhwc" else (2, 3, 4), "f32", tag)


def test_padded_strides_size_span_and_bytes():
    """Padding counts in span/nbytes (what a buffer must hold), not in nelems."""
    desc = MemoryDesc((3, 5), "f32", (8, 1))
    assert desc.nelems == 15
    assert desc.span == 1 + 8 * 2 + 4 == 21
    assert desc.nbytes == 84
    assert not desc.is_dense

    half = MemoryDesc((3, 5), "f16", (8, 1))
    assert half.itemsize == 2 and half.nbytes == 42

    transposed_padded = MemoryDesc((3, 5), "f32", (1, 4))  # columns of 3 padded to 4
    assert transposed_padded.span == 1 + 2 + 16 == 19
    assert transposed_padded.nbytes == 76


def test_stride_zero_allowed_on_unit_dimension():
    """A size-1 dimension never advances, so its stride cannot overlap anything."""
    desc = MemoryDesc((1, 4), "f32", (0, 1))
    assert desc.span == 4 and desc.is_dense


def test_like_takes_shape_and_dtype_of_an_array():
    assert MemoryDesc.like(np.zeros((2, 3), np.float32)) == MemoryDesc((2, 3), "f32")
    assert MemoryDesc.like(np.zeros(4, np.int8)) == MemoryDesc((4,), "s8")
    with pytest.raises(InvalidArgumentError, match="float64"):
        MemoryDesc.like(np.zeros(4, np.float64))


def test_str_names_dtype_dims_and_strides():
    assert str(MemoryDesc((3, 5), "f32", (8, 1))) == "f32:3x5:s8:1"


def test_frozen():
    desc = MemoryDesc((2, 2))
    with pytest.raises(AttributeError):
        desc.dims = (4,)


# -- validation --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "dims",
    [0, -3, (), (2, 0), (4, -1), (2.0, 3), ("a", 2), "ab", (True, 2), None, (1,) * 13],
    ids=["zero", "negative", "empty", "zero-inner", "negative-inner", "float", "str-elem", "str",
         "bool", "none", "13-dims"],
)
def test_invalid_dims(dims):
    with pytest.raises(InvalidArgumentError, match=r"dims"):
        MemoryDesc(dims)


def test_twelve_dims_is_the_limit():
    assert MemoryDesc((1,) * 12).ndims == 12
    with pytest.raises(InvalidArgumentError, match="1 to 12 dimensions"):
        MemoryDesc((1,) * 13)


@pytest.mark.parametrize("dtype", ["f64", "float32", "F32", None, 3])
def test_invalid_dtype(dtype):
    with pytest.raises(InvalidArgumentError, match=f"dtype {dtype!r}"):
        MemoryDesc((2, 2), dtype)


@pytest.mark.parametrize(
    "dims, strides, message",
    [
        ((2, 3), (1,), r"strides \(1,\) has 1 entries for dims \(2, 3\)"),
        ((2, 3), (3, 1, 1), r"has 3 entries"),
        ((2, 3), (-3, 1), r"strides \(-3, 1\) must be non-negative"),
        ((4, 4), (1, 1), r"strides \(1, 1\) overlap"),
        ((4, 4), (0, 1), r"strides \(0, 1\) overlap"),
        ((4, 4), (4, 2), r"strides \(4, 2\) overlap"),
        ((2, 3, 4), (12, 3, 1), r"overlap"),
        ((2, 3), (3.0, 1), r"strides \(3.0, 1\) must hold integers"),
        ((2, 3), 5, r"strides 5 is neither a sequence nor a format tag"),
    ],
)
def test_invalid_strides(dims, strides, message):
    with pytest.raises(InvalidArgumentError, match=message):
        MemoryDesc(dims, "f32", strides)


def test_errors_are_value_errors():
    """numpy-style callers catching ValueError keep working."""
    with pytest.raises(ValueError):
        MemoryDesc((0,))
    assert issubclass(triodnn.InvalidArgumentError, triodnn.TriodnnError)


# -- the kernels' pure helpers -----------------------------------------------------------------


@pytest.mark.parametrize(
    "dims, strides",
    [((5,), (1,)), ((2, 3), (3, 1)), ((2, 3, 4), (12, 4, 1)), ((4, 1, 2), (2, 2, 1))],
)
def test_dense_strides_matches_numpy(dims, strides):
    assert dense_strides(dims) == strides
    assert dense_strides(dims) == tuple(s // 4 for s in np.zeros(dims, np.float32).strides)
    assert dense_strides(dims) == MemoryDesc(dims).strides


@pytest.mark.parametrize(
    "dims, strides, dense",
    [
        ((2, 3), (3, 1), True),
        ((2, 3), (1, 2), True),  # column-major
        ((2, 3, 4, 5), (60, 1, 15, 3), True),  # nhwc
        ((3, 5), (8, 1), False),  # padded rows
        ((3, 5), (1, 4), False),  # padded columns
        ((1, 4), (99, 1), True),  # a unit dimension's stride does not matter
        ((4, 4), (1, 1), False),  # overlapping
        ((2, 3), (6, 2), False),  # every other element
    ],
)
def test_is_dense(dims, strides, dense):
    assert is_dense(dims, strides) is dense


@pytest.mark.parametrize(
    "value",
    [0.1, -2.5, 1.0 / 3.0, 1e-40, 3.4028234663852886e38, 2.0**-149, 0.0, 16777217.0, -7e-12],
)
def test_c_float_is_exact(value):
    """The literal denotes float32(value) exactly: hex floats never round a second time."""
    literal = c_float(value)
    assert literal.startswith("(") and literal.endswith("f)")
    assert float.fromhex(literal[1:-2]) == float(np.float32(value))


def test_c_float_rounds_to_float32_not_float64():
    assert c_float(0.1) == f"({float(np.float32(0.1)).hex()}f)"
    assert c_float(0.1) != f"({(0.1).hex()}f)"


def test_c_float_negative_zero_keeps_its_sign():
    assert c_float(-0.0).startswith("(-")


def test_c_float_special_values():
    assert c_float(float("nan")) == "NAN"
    assert c_float(float("inf")) == "INFINITY"
    assert c_float(float("-inf")) == "(-INFINITY)"

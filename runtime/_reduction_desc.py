"""Transitional re-exports (issue 15): the softmax and reduction descriptors live in
``triodnn._values``; this module goes in the final sweep."""

from ._values._axes import axis_index as _to_axis
from ._values._reduction_desc import ReductionDesc as ReductionDesc
from ._values._softmax_desc import SoftmaxDesc as SoftmaxDesc

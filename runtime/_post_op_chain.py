"""Transitional re-exports (issue 15): post-op chain validation lives in ``triodnn._values._post_ops``,
``generate_scaled`` in ``triodnn.kernels._post_ops``. The stub goes once no module imports it."""

from ._values._post_ops import check as check
from ._values._post_ops import eq_key as eq_key
from ._values._post_ops import output_scale_field as output_scale_field
from .kernels._post_ops import generate_scaled as generate_scaled

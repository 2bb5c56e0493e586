"""Transitional re-exports (issue 15): the pooling and normalization descriptors live in
``triodnn._values``; this module goes in the final sweep."""

from ._values._normalization_desc import BatchNormInferenceDesc as BatchNormInferenceDesc
from ._values._normalization_desc import GroupNormDesc as GroupNormDesc
from ._values._normalization_desc import LayerNormDesc as LayerNormDesc
from ._values._normalization_desc import RMSNormDesc as RMSNormDesc
from ._values._pooling_desc import PoolingDesc as PoolingDesc

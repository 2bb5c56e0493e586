"""Moved to ``triodnn._values._convolution_desc`` (issue 15); this re-export goes in the final sweep."""

from ._values._convolution_desc import ConvolutionDesc as ConvolutionDesc

"""triodnn.testing: checking triodnn against numpy, outside the production code.

    from triodnn.testing import make_inputs, reference, run_case, tolerance

- ``run_case`` / ``run_cases``: the benchdnn-style graph driver behind ``triodnn graph`` (fill
  the inputs, run every partition, compare each output with the op-by-op numpy reference);
  ``make_inputs`` and ``run_graph`` are its steps.
- ``fill_input``, ``tolerance``, ``narrowest_dtype``: benchdnn graph's input filling and the
  comparison tolerances of partitions.
- ``reference``, ``to_dtype_values``: numpy references of oneDNN Graph ops, one op at a time.
- ``run_demo``: ``triodnn demo``, a diamond of primitives checked against numpy.

Nothing in ``triodnn`` or ``triodnn.graph`` imports this package; the command line does.
"""

from ._demo import run_demo
from ._driver import CaseResult, OutputCheck, make_inputs, run_case, run_cases, run_graph
from ._filling import ROLES, fill_input, narrowest_dtype, tolerance
from ._reference import FLOAT_DTYPES, reference, to_dtype_values

__all__ = [
    "CaseResult",
    "FLOAT_DTYPES",
    "OutputCheck",
    "ROLES",
    "fill_input",
    "make_inputs",
    "narrowest_dtype",
    "reference",
    "run_case",
    "run_cases",
    "run_demo",
    "run_graph",
    "to_dtype_values",
    "tolerance",
]

"""oneDNN Graph op kinds by family: each module declares its kinds' schema, shape rule, lowering
and numpy reference, and registers them (``triodnn.graph._op_registry``).

To add a kind: declare it in its family's module (or a new one, imported below) with all four
parts and one ``register`` call, then test it (``tests/graph/test_op_registry.py`` checks that
every registered kind that runs has a shape rule, a lowering and a reference). The compiler
passes look kinds up and need no change.
"""

from . import (
    binary as binary,
)
from . import (
    convolution as convolution,
)
from . import (
    data_movement as data_movement,
)
from . import (
    dropout as dropout,
)
from . import (
    eltwise as eltwise,
)
from . import (
    matmul as matmul,
)
from . import (
    normalization as normalization,
)
from . import (
    pooling as pooling,
)
from . import (
    quantization as quantization,
)
from . import (
    reduction as reduction,
)
from . import (
    resampling as resampling,
)
from . import (
    softmax as softmax,
)
from . import (
    special as special,
)

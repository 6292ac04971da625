"""The theorem made executable.

    constructions  the ReLU and softmax constructions, the sink family, head contributions
    attack         worst-case inputs by projected gradient (lower bounds for any model)
    certify        certified upper bounds over every input (1-layer, 1-head softmax and ReLU)
    bounds         the theory study's worst-case, necessity and denied-sink measurements,
                   and ``sinklab worst``
    stacks         deeper stacks trained with plain targets

The constructions' names are re-exported here (``sinklab.theory.relu_construction``).
"""

from sinklab.theory.constructions import (
    family_sweep,
    head_split,
    relu_construction,
    relu_exactness,
    softmax_sink,
)

__all__ = ["family_sweep", "head_split", "relu_construction", "relu_exactness", "softmax_sink"]

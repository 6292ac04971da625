"""The theorem made executable.

    constructions  the ReLU and softmax constructions, the sink family, head contributions
    attack         worst-case inputs by projected gradient (lower bounds for any model)
    certify        certified upper bounds over every input (1-layer, 1-head softmax and ReLU)
    bounds         worst-case errors, the necessity bound and denied sinks, measured on models;
                   ``sinklab worst``
    stacks         deeper stacks trained with plain targets, measured
    verdicts       the theory study's claims and figures from those records, and its
                   protocol's numbers (no torch)

The constructions' names are reachable here (``sinklab.theory.relu_construction``); they are
imported on first use, so that ``sinklab.theory.verdicts`` stays free of torch.
"""

import importlib
from typing import Any

EXPORTS = ("family_sweep", "head_split", "relu_construction", "relu_exactness", "softmax_sink",
           "zero_row_construction")
__all__ = list(EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in EXPORTS:  # (also what ``from sinklab.theory import verdicts`` asks first)
        raise AttributeError(f"module 'sinklab.theory' has no attribute {name!r}")
    return getattr(importlib.import_module("sinklab.theory.constructions"), name)


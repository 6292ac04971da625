"""The theorem made executable.

    protocol       the numbers of the theory's training protocols (no torch)
    constructions  the ReLU and softmax constructions, the sink family, head contributions
    expressivity   which rules can express the task, 1x1 and 2x2: the table and its checks
    rule_constructions, floors, capacity
                   the table's constructions, the 1x1 arguments' floors (their proofs as
                   package data, ``proofs/``) and the zoo's capacity arguments
    attack         worst-case inputs by projected gradient (lower bounds for any model)
    rows, certify, necessity, trigger, key_problems
                   certified upper bounds over every input (1-layer, 1-head softmax and ReLU),
                   the necessity bound, and the same at trigger rows
    sink           certified lower bounds on a softmax model's BOS mass
    bounds         worst-case errors, the necessity bound and denied sinks, measured on models;
                   ``sinklab worst``
    stacks         deeper stacks trained with plain targets, measured

Nothing here imports the studies (``sinklab.studies.theory*`` reads these). The constructions'
names are reachable here (``sinklab.theory.relu_construction``); they are imported on first use,
so that ``sinklab.theory.protocol`` stays free of torch.
"""

import importlib
from typing import Any

EXPORTS = ("family_sweep", "head_split", "relu_construction", "relu_exactness", "softmax_sink",
           "zero_row_construction")
__all__ = list(EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in EXPORTS:  # (also what ``from sinklab.theory import protocol`` asks first)
        raise AttributeError(f"module 'sinklab.theory' has no attribute {name!r}")
    return getattr(importlib.import_module("sinklab.theory.constructions"), name)


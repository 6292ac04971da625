"""The numbers of the theory's training protocols, without torch: the denied-sink settings, the
plateau rule, the error bins, and the plain-target stacks' shapes, protocol and its search.

``constructions`` and ``stacks`` build their run configs from them, and the ``sinklab theory``
study (``sinklab.studies.theory``) names them in its options and help texts, which need no
torch.
"""

from __future__ import annotations

import itertools
import math

DENIED_EPS = (0.01, 0.03, 0.1, 0.3, 0.5)  # BOS share caps 1 - eps of the denied-sink study
# The plateau rule of every run the theory study trains to a plateau (denied sinks, plain stacks):
# a run stops when its training-batch L-infinity error has set no new best for this many steps
# (``train.patience``), or at its step cap.
PLATEAU_PATIENCE = 2000
ERROR_BINS = ((1.0, math.inf), (0.1, 1.0), (0.01, 0.1), (0.0, 0.01))
PLAIN_EXPERIMENTS = ("2x2", "4x4")
PLAIN_RULES = ("softmax", "relu")
PLAIN_LOG_EVERY = 100
# The plain stacks' protocol search: a grid of initial weight scales (model.init_std) and
# learning rates, every point trained on the search's seeds 0..PLAIN_GRID_SEEDS-1 with the
# plateau rule and a step cap of at most PLAIN_GRID_STEPS, at a constant rate. ``plain_choice``
# picks a point per shape and rule; PLAIN_PROTOCOL holds the points it picked on seeds 0-2, and
# the stacks the claims read are trained there on fresh seeds, PLAIN_FIRST_SEED on, with
# PLAIN_LR_DROPS tenfold drops of the rate where the plateau rule fires (``train.lr_drops``):
# on seeds 3-5 of 4x4 softmax at a constant 1e-3 every run ended on a plateau or at the cap with
# batch L∞ 1.7e-2 to 1.1e-1, the rate's own noise, which the drops remove.
PLAIN_GRID_STD = (0.02, 0.1, 0.2, 0.3)
PLAIN_GRID_LR = (3e-4, 1e-3, 3e-3)
# quick: no search (the stacks train at PLAIN_PROTOCOL), the study's slowest part otherwise
PLAIN_GRID_SEEDS, QUICK_PLAIN_GRID_SEEDS = 3, 0
PLAIN_GRID_STEPS = 8000
PLAIN_LR_DROPS = 2
PLAIN_FIRST_SEED = PLAIN_GRID_SEEDS
PLAIN_PROTOCOL = {  # (shape, rule): (init_std, lr), plain_choice's pick on seeds 0-2
    ("2x2", "softmax"): (0.1, 1e-3), ("2x2", "relu"): (0.1, 1e-3),
    ("4x4", "softmax"): (0.2, 1e-3), ("4x4", "relu"): (0.02, 3e-4),
}


def grid_runs(seeds: int) -> list[tuple[str, str, float, float, int]]:
    """Every run of the protocol search, as (shape, rule, init_std, lr, seed), seeds 0..seeds-1,
    in the grid's order."""
    return list(itertools.product(PLAIN_EXPERIMENTS, PLAIN_RULES, PLAIN_GRID_STD, PLAIN_GRID_LR,
                                  range(seeds)))

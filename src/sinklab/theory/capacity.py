"""What a rule cannot express: the capacity arguments of ``sinklab zoo``, and the measurements of
trained models that check them.

An argument (``Capacity``) proves that no weights of a rule express the task in a configuration;
``CAPACITY`` names the (configuration, rule) pairs each one covers, ``capacity_applies`` says
whether a run's settings are those it needs and ``capacity_bounds`` gives its numbers for a
run's task. The proofs are written out in the zoo's report (``studies/templates/zoo.md.j2``)
and, for the sigmoid and clipped-softmax arguments, in ``sinklab.theory.floors``.
``no_other_zero`` says whether BOS is a rule's only way to output zero (what denying it BOS
tests), and ``model_argument_error`` measures a trained model on an argument's sequences::

    from sinklab.theory.capacity import CAPACITY, capacity_applies, capacity_bounds
    argument = CAPACITY["1x1", "relu_len"]          # POSITION_FREE
    capacity_applies(cfg, argument)                 # the run's settings are the argument's
    capacity_bounds(cfg)["position_free"]["mse_floor"]  # Var(1/j) / 3, for any weights
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from sinklab.attention import RULES, build_rule
from sinklab.config import RunConfig
from sinklab.theory.floors import argument_errors, clipped_floor, sigmoid_floor
from sinklab.train import load_model

CAPACITY_SEQUENCES = 2000  # training-distribution sequences the capacity check is measured on


# ------------------------------------------------------------------ the capacity argument

@dataclass(frozen=True)
class Capacity:
    """A proof that a rule cannot express the task in a configuration; its full text is in the
    report template (``zoo.md.j2``), under ``key``. ``measured``: the argument bounds an error
    that ``capacity_mse`` measures on the trained models (a check of its numbers)."""

    key: str
    why: str  # the argument in one clause, for tables
    measured: bool = False
    # the argument holds for a stack of attention-only layers of any depth, residual or not
    # (not only for the 1x1 setting)
    any_depth: bool = False


POSITION_FREE = Capacity(
    "position_free",
    "its weights at the trigger row do not depend on the trigger's position j, so they cannot "
    "give the 1/j average", measured=True)
FIXED_WEIGHTS = Capacity(
    "fixed_weights",
    "its weights ignore the scores, so the model is linear and cannot both null every "
    "non-trigger row and average at the trigger row")

LINEAR_STACK = Capacity(
    "linear_stack",
    "its weights ignore the scores, so a stack of its layers is linear in the input: the row at "
    "the first trigger position gives x_1 one weight, which must be 1/j when that row is the "
    "trigger's and 0 when it is not", any_depth=True)

POLE_GAP = Capacity(
    "pole_gap",
    "its weights see the trigger's position j only through the bias -log(j + 1), which puts the "
    "pole of each content weight at or left of j = -1 where the average's 1/j has it at 0; "
    "three trigger positions turn that into an error floor")

CLIP_OFFSET = Capacity(
    "clip_offset",
    "its trigger row's clipped content weight 1.03 / (j + r) - 0.03 keeps an offset that no one "
    "scale turns into 1/j at every trigger position (at its default zeta and gamma)")

# the arguments whose sequences are written down (``floors.argument_errors``): a trained
# model's error on them is checked against the floor
SEQUENCE_ARGUMENTS = (POLE_GAP, CLIP_OFFSET)

# (configuration, rule) -> the argument that the rule cannot express the task there. The
# position-dependent arguments are 1x1 only: from two layers on, a first layer can write the
# query's position (or its prefix's mean) into the residual stream, and they no longer hold
# (relu_len and relu_raw get 5-10x closer at 2x2). Uniform's weights are fixed at any depth, so
# its stack stays linear. Sigmoid with bias -log n sees the row's length through n, but only
# as a pole left of -1 (``sinklab.theory.floors.SIGMOID_1X1_ARGUMENT``), at 1x1.
CAPACITY: dict[tuple[str, str], Capacity] = {
    ("1x1", "relu_len"): POSITION_FREE,  # ReLU(S_ik) / L: L is the same for every query
    ("1x1", "relu_raw"): POSITION_FREE,  # ReLU(S_ik): no division at all
    ("1x1", "uniform"): FIXED_WEIGHTS,  # 1 / (i + 1) whatever the scores
    ("2x2", "uniform"): LINEAR_STACK,  # the same weights in every layer: a linear stack
    ("1x1", "sigmoid"): POLE_GAP,  # the bias -log(j + 1) is all its weights know of j
    ("1x1", "clipped_softmax"): CLIP_OFFSET,  # two layers can (expressivity's construction)
}


def capacity_applies(cfg: RunConfig, argument: Capacity | None = None) -> bool:
    """Whether a run's settings are those the arguments need: attention-only layers with BOS
    visible, the rule's default arguments (sigmoid's bias -log n), one trigger per sequence at
    positions from 2 (so that key 1 is a content token, and row 1 a non-trigger row, at every
    trigger position) over at least two positions (three for ``POLE_GAP`` and ``CLIP_OFFSET``,
    which also needs two content coordinates); and, unless the
    ``argument`` holds at any depth (``Capacity.any_depth``), one layer with the plain
    target."""
    task = cfg.task
    shape = (argument is not None and argument.any_depth) or \
        (cfg.model.n_layers == 1 and not cfg.residual)
    defaults = not RULES[cfg.model.attention].non_default(cfg.model.attention_args)
    return (shape and defaults and cfg.model.block == "attention"
            and cfg.model.bos == "visible" and task.single_trigger
            and task.train_trigger_min >= 2
            and task.train_trigger_max - task.train_trigger_min >= (
                2 if argument in (POLE_GAP, CLIP_OFFSET) else 1)
            and (argument is not CLIP_OFFSET or task.d_model >= 5))


def capacity_bounds(cfg: RunConfig) -> dict[str, Any]:
    """The arguments' numbers for a run's task (the proofs are in the report).

    ``position_free``: with the trigger position j uniform over the training range, every
    weights' expected squared error in each content coordinate at the trigger row is at least
    Var(1/j) / 3 (``mse_floor``), and some sequences of the training distribution err by at
    least (1/j_min - 1/j_max) / 2 there (``sup_floor``). ``fixed_weights``: some sequences with
    the trigger at j_min err by at least (j + 1) / (j (j + 3)), j = j_min (``sup_floor``).
    ``linear_stack``: some sequences err by at least 1 / (2 j_min) at row j_min, at any depth
    (``sup_floor``). ``pole_gap``: some sequences err by at least the floor of
    ``sinklab.theory.floors.sigmoid_floor`` (``sup_floor``, with its three trigger
    positions and their Lagrange weights; None with fewer than three positions).
    ``clip_offset``: some sequences err by at least ``floors.clipped_floor`` (``sup_floor``,
    with the best fit found, its score gap r and scale mu; None where it does not apply)."""
    task = cfg.task
    j = np.arange(task.train_trigger_min, task.train_trigger_max + 1, dtype=float)
    var = float(np.var(1 / j))  # over the uniform trigger position (population variance)
    mse_floor = var / 3  # Var(u) = 1/3 for u ~ Uniform(-1, 1)
    tol = cfg.train.tol
    lo = j[0]
    common = {"j_min": int(lo), "j_max": int(j[-1]), "tol": tol}
    pole, clip = sigmoid_floor(task), clipped_floor(task)
    return {
        "position_free": {**common, "var_inv_j": var, "mse_floor": mse_floor,
                          "rms_floor": math.sqrt(mse_floor), "sup_floor": (1 / lo - 1 / j[-1]) / 2,
                          "mse_floor_over_tol2": mse_floor / tol ** 2,
                          "content_coordinates": task.d_model - 3,
                          "sequences": CAPACITY_SEQUENCES},
        "fixed_weights": {**common, "w_best": 2 * (lo + 1) / (lo * (lo + 3)),
                          "sup_floor": (lo + 1) / (lo * (lo + 3))},
        "linear_stack": {**common, "sup_floor": 1 / (2 * lo)},
        "pole_gap": None if pole is None else {
            **common, "sup_floor": pole.floor, "exact": str(pole.exact),
            "nodes": list(pole.nodes), "weights": [str(w) for w in pole.weights]},
        "clip_offset": None if clip is None else {
            **common, "sup_floor": clip.floor, "r": clip.r, "mu": clip.mu,
            "attained": clip.attained, "intervals": clip.n_intervals},
    }


# --------------------------------------------------------------------------- BOS denied


def no_other_zero(rule: str) -> bool:
    """Whether the rule has no way to output zero but BOS: a row that sees one key (row 1 with
    BOS removed) puts exactly 1 on it whatever its score and the rule's parameters. Softmax,
    clipped softmax and uniform do; a rule with free rows, an implicit or learned sink key or a
    gate can put less. Computed by calling the rule, so a plugin's rule is classed too."""
    mask = torch.tensor([[True, False], [False, True]])[None]  # row 1 sees key 1 alone
    generator = torch.Generator().manual_seed(0)
    for _ in range(4):  # four draws of the rule's parameters
        built = build_rule(rule, 1, 1, 4)
        with torch.no_grad():
            built.init_member(0, generator, 1.0)
        x = torch.randn(1, 1, 2, 4, generator=generator)
        for score in (-30.0, -1.0, 0.0, 1.0, 30.0):
            scores = torch.full((1, 2, 2), score)
            with torch.no_grad():
                if built.value_side:
                    q = torch.randn(1, 1, 2, 1, 4, generator=generator)
                    weights = built(scores, mask, x, q)
                    mixed = torch.ones(1, 1, 2, 1, 4)
                    passed = built.passed(mixed, built.mix(mixed, weights, x, q))
                    if passed is not None and float(passed[0, 0, 1, 0]) != 1.0:
                        return False
                else:
                    weights = built(scores, mask, x)
            if float(weights[0, 1, 1]) != 1.0:
                return False
    return True


# ------------------------------------------------------------------- trained models


def model_argument_error(path: Path, key: str) -> float:
    """The trained 1x1 model in ``path``: its largest error on the sequences of the argument
    ``key`` that has them (``POLE_GAP``'s, ``CLIP_OFFSET``'s, or "bos_denied" for a run with
    BOS denied that a proof forces to err; ``sinklab.theory.floors.argument_errors``)."""
    cfg, model = load_model(path)
    return argument_errors(model, cfg.task, key)[0]

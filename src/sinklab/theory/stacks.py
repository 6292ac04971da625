"""The theorem's multi-layer claim in its own setting: attention stacks with plain targets.

The theorem's multi-layer statement is about stacks without a residual stream, x <- MHA_l(x),
whose target is 0 off the trigger and mean(x_1..x_j) at it (``task.target=plain``); the paper's
experiments use residual targets instead. This module configures the 2x2 and 4x4 softmax and
ReLU runs of that setting, trained to a step cap or the plateau rule
(``sinklab.theory.protocol.PLATEAU_PATIENCE``), and measures where a trained stack puts its BOS
weight (per layer, head and query position, at non-trigger and at trigger rows): whether some
head sinks, and whether every non-trigger position has a sinking head somewhere in the stack.
The ``sinklab theory`` study trains them (``sinklab.studies.theory.plain_cells``), collects
their records (``sinklab.studies.theory_records.plain_collect``) and decides the claims
(``sinklab.studies.theory_claims.plain_claims``)::

    plain/{2x2,4x4}_{softmax,relu}_seed{s}/   the runs (``plain_name``, ``plain_config``)
"""

from __future__ import annotations

import math
from typing import Any

import torch

from sinklab import metrics
from sinklab.config import EXPERIMENTS, RunConfig, build_run_config
from sinklab.definitions import SINK_HEAD_THRESHOLD
from sinklab.errors import ConfigError
from sinklab.model import AttentionStack
from sinklab.task import Batch
from sinklab.theory import constructions as theory
from sinklab.theory.protocol import (
    PLAIN_EXPERIMENTS,
    PLAIN_LOG_EVERY,
    PLAIN_LR_DROPS,
    PLAIN_PROTOCOL,
)


def plain_name(experiment: str, rule: str, seed: int) -> str:
    """The run's folder, relative to the study's."""
    return f"plain/{experiment}_{rule}_seed{seed}"


def grid_name(experiment: str, rule: str, init_std: float, lr: float, seed: int) -> str:
    """A run of the protocol search, relative to the study's folder."""
    return f"plain-grid/{experiment}_{rule}_std{init_std:g}_lr{lr:g}_seed{seed}"


def plain_config(experiment: str, rule: str, seed: int, max_steps: int,
                 device: str = "auto", protocol: tuple[float, float] | None = None,
                 lr_drops: int = PLAIN_LR_DROPS) -> RunConfig:
    """One plain-target stack: the paper's protocol but for the initial weight scale and the
    learning rate, ``protocol`` = (init_std, lr), by default the searched ``PLAIN_PROTOCOL`` of
    its shape and rule (the paper's N(0, 0.02^2) weights and multi-layer rate 1e-4 are for
    residual stacks: without a residual stream each layer shrinks what it passes on, and a
    ReLU stack's output is stuck at zero from the first step), capped at ``max_steps`` and
    stopped early by the plateau rule (``train.patience``), whose first ``lr_drops`` firings
    lower the rate tenfold instead (``train.lr_drops``; the search trains with none)."""
    if experiment not in PLAIN_EXPERIMENTS:
        raise ConfigError(f"plain-target experiment {experiment!r} is not one of "
                          f"{', '.join(PLAIN_EXPERIMENTS)}.")
    layers, heads = EXPERIMENTS[experiment]
    init_std, lr = PLAIN_PROTOCOL[(experiment, rule)] if protocol is None else protocol
    return build_run_config({
        "task": {"target": "plain"},
        "model": {"attention": rule, "n_layers": layers, "n_heads": heads,
                  "init_std": init_std},
        "train": {"seed": seed, "max_steps": max_steps, "log_every": PLAIN_LOG_EVERY,
                  "lr": lr, "patience": theory.PLATEAU_PATIENCE, "lr_drops": lr_drops,
                  "device": device}})


# ------------------------------------------------------------------------ measurements


def _listed(values: torch.Tensor) -> list[Any]:
    """A float tensor as nested lists, NaN (a row type that never occurs there) as None."""
    return [_listed(v) for v in values] if values.dim() else \
        (None if math.isnan(values.item()) else values.item())


def _covered(bos: torch.Tensor, threshold: float) -> list[bool | None]:
    """Per query position: does some (layer, head) have mean BOS mass >= threshold there?
    ``bos`` (layers, heads, L) with NaN where the row type never occurs; None at those
    positions."""
    seen = ~torch.isnan(bos).all(dim=(0, 1))
    hit = (bos.nan_to_num(nan=-math.inf) >= threshold).any(dim=0).any(dim=0)
    return [bool(h) if s else None for h, s in zip(hit.tolist(), seen.tolist())]


@torch.no_grad()
def plain_measure(model: AttentionStack, batch: Batch,
                  threshold: float = SINK_HEAD_THRESHOLD) -> dict[str, Any]:
    """Where a one-member stack puts its BOS weight on ``batch`` (sequences with the trigger
    anywhere the task allows: ``theory.all_triggers_batch``).

    Returned (layers and heads 1-indexed in ``sink_heads``, positions 0-indexed everywhere):

    - ``bos_nontrigger`` / ``bos_trigger``: (layers, heads, L) nested lists, the mean BOS weight
      over the sequences whose row at that query position is a non-trigger row / the trigger
      row; None where no sequence has such a row (position 0, the BOS row, is neither);
    - ``head_bos``: (layers, heads), the mean BOS weight over all non-trigger rows
      (``metrics.bos_mass_nontrigger``, the reproduction's per-head number);
    - ``sink_heads``: the [layer, head] pairs whose ``head_bos`` is >= ``threshold``, and
      ``layers_with_sink``, per layer whether some head of it sinks;
    - ``positions_covered`` / ``trigger_positions_covered``: per query position (length L,
      None where the row type never occurs) whether some (layer, head) has BOS mass >=
      ``threshold`` there;
    - ``bos_max_by_position``: per position the largest non-trigger BOS mass over every head;
    - ``linf_all_triggers``: the model's L-infinity error on the batch.
    """
    device = next(model.parameters()).device
    x, y, trigger = batch.x.to(device), batch.y.to(device), batch.trigger.to(device)
    out = model(x, return_weights=True)
    weights = torch.stack(out.patterns, dim=1)[0].to(torch.float64)  # (layers, B, H, L, L)
    bos = weights[..., 0]  # (layers, B, H, L): each query row's weight on BOS
    nontrigger, is_trigger = metrics.row_types(trigger, weights.shape[-1])  # (B, L)

    def per_position(rows: torch.Tensor) -> torch.Tensor:  # (layers, H, L), NaN if never
        w = rows[:, None, :].to(bos.dtype)  # (B, 1, L)
        return (bos * w).sum(dim=1) / w.sum(dim=0)

    bos_nt, bos_tr = per_position(nontrigger), per_position(is_trigger)
    head_bos = metrics.bos_mass_nontrigger(weights, trigger)  # (layers, H)
    sinks = head_bos >= threshold
    top = bos_nt.amax(dim=(0, 1))  # NaN where no head has a non-trigger row: position 0
    return {
        "bos_nontrigger": _listed(bos_nt), "bos_trigger": _listed(bos_tr),
        "head_bos": head_bos.tolist(),
        "sink_heads": [[li + 1, hi + 1] for li, hi in sinks.nonzero().tolist()],
        "layers_with_sink": sinks.any(dim=1).tolist(),
        "positions_covered": _covered(bos_nt, threshold),
        "trigger_positions_covered": _covered(bos_tr, threshold),
        "bos_max_by_position": _listed(top),
        "linf_all_triggers": metrics.error_split(out.out[0], y, trigger)["linf"].item(),
    }

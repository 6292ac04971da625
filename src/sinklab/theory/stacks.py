"""The theorem's multi-layer claim in its own setting: attention stacks with plain targets.

The theorem's multi-layer statement is about stacks without a residual stream, x <- MHA_l(x),
whose target is 0 off the trigger and mean(x_1..x_j) at it (``task.target=plain``); the paper's
experiments use residual targets instead. This module declares the 2x2 and 4x4 softmax and ReLU
runs of that setting, trained to a step cap or the plateau rule (``sinklab.theory.constructions.
PLATEAU_PATIENCE``), measures where each trained stack puts its BOS weight (per layer, head and
query position, at non-trigger and at trigger rows), and decides the existential claim: some
head sinks, and every non-trigger position has a sinking head somewhere in the stack. The
``sinklab theory`` study (``sinklab.studies.theorem``) wires these pieces in::

    plain/{2x2,4x4}_{softmax,relu}_seed{s}/   the runs (``plain_cells``)
    records["plain"] = plain_collect(ctx, seeds, max_steps, n_sequences)
    claims += plain_claims(records["plain"]["runs"])
    figures += PLAIN_FIGURES; the report includes templates/theorem_plain.md.j2
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import torch

from sinklab import metrics
from sinklab.config import RunConfig, build_run_config
from sinklab.definitions import SINK_HEAD_THRESHOLD
from sinklab.errors import ConfigError
from sinklab.model import AttentionStack
from sinklab.runs.files import read_log
from sinklab.studies.reproduction import EXPERIMENTS
from sinklab.task import Batch
from sinklab.theory import constructions as theory
from sinklab.theory.attack import attack
from sinklab.theory.verdicts import (
    PLAIN_ATTACK_RESTARTS,
    PLAIN_CHOICE_RULE,
    PLAIN_EXPERIMENTS,
    PLAIN_FIRST_SEED,
    PLAIN_GRID_LR,
    PLAIN_GRID_STD,
    PLAIN_GRID_STEPS,
    PLAIN_LOG_EVERY,
    PLAIN_LR_DROPS,
    PLAIN_PROTOCOL,
    PLAIN_RULES,
    PLAIN_SEQUENCES,
    grid_points,
    grid_runs,
    plain_choice,
    plain_groups,
)
from sinklab.train import build_ensemble, load_model, plateau_rule_text

if TYPE_CHECKING:
    from sinklab.studies.base import Context


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


def plain_protocol(seeds: int, max_steps: int) -> dict[str, Any]:
    """The settings the report quotes, read from a run's own config: the step cap, the plateau
    rule (its patience, and in words ``sinklab.train.plateau_rule_text``), the stop rule, the
    sink threshold, and the initial weight scale and learning rate of each shape and rule."""
    cfgs = {(e, rule): plain_config(e, rule, 0, max_steps)
            for e in PLAIN_EXPERIMENTS for rule in PLAIN_RULES}
    cfg = next(iter(cfgs.values()))
    return {
        "experiments": list(PLAIN_EXPERIMENTS), "rules": list(PLAIN_RULES), "seeds": seeds,
        "max_steps": cfg.train.max_steps, "patience": cfg.train.patience,
        "plateau_rule": plateau_rule_text(cfg.train.patience, cfg.train.lr_drops,
                                          cfg.train.lr_drop_factor),
        "lr_drops": cfg.train.lr_drops, "lr_drop_factor": cfg.train.lr_drop_factor,
        "grid_max_steps": min(max_steps, PLAIN_GRID_STEPS),
        "grid_plateau_rule": plateau_rule_text(cfg.train.patience),
        "tol": cfg.train.tol, "batch_size": cfg.train.batch_size,
        "beta1": cfg.train.beta1, "beta2": cfg.train.beta2, "log_every": cfg.train.log_every,
        "protocol": [{"experiment": e, "rule": rule, "init_std": c.model.init_std,
                      "lr": c.train.lr} for (e, rule), c in cfgs.items()],
        "first_seed": PLAIN_FIRST_SEED, "paper_init_std": build_run_config({}).model.init_std,
        "paper_lr": {e: build_run_config({"model": {"n_layers": EXPERIMENTS[e][0],
                                                    "n_heads": EXPERIMENTS[e][1]}}).train.lr
                     for e in PLAIN_EXPERIMENTS},
        "shape": {e: list(EXPERIMENTS[e]) for e in PLAIN_EXPERIMENTS},
        "seq_len": cfg.task.seq_len, "d_model": cfg.task.d_model,
        "train_trigger_min": cfg.task.train_trigger_min,
        "train_trigger_max": cfg.task.train_trigger_max,
        "eval_sequences": cfg.eval.n_sequences, "eval_trigger": cfg.task.eval_trigger,
        "threshold": SINK_HEAD_THRESHOLD,
    }


# ----------------------------------------------------------------------------- records


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


def _untrained(cfg: RunConfig, device: torch.device) -> AttentionStack:
    """The run's stack as its training started: the same config and seed, no update, on
    ``device``."""
    return build_ensemble([cfg], device)


def plain_records(ctx: Context, seeds: int, n_sequences: int = PLAIN_SEQUENCES,
                  attack_steps: int = 100, restarts: int = PLAIN_ATTACK_RESTARTS
                  ) -> list[dict[str, Any]]:
    """One row per plain-target run (seeds ``PLAIN_FIRST_SEED`` on): how it stopped, its errors
    (the test set's, from ``summary.json``, the best training batch of its log, and the
    attack's worst case over every input: ``attacked``, the largest error per row type), and
    where its trained model puts its BOS weight on ``n_sequences`` sequences with every
    trigger position (``plain_measure``); ``untrained`` is the same measurement of the same
    stack before any update, the claims' control.

    ``ctx`` needs only ``out`` (the study's folder) and ``summary(name)``."""
    rows = []
    for e in PLAIN_EXPERIMENTS:
        for rule in PLAIN_RULES:
            for seed in range(PLAIN_FIRST_SEED, PLAIN_FIRST_SEED + seeds):
                name = plain_name(e, rule, seed)
                summary = ctx.summary(name)
                best = theory.floor(read_log(ctx.out / name / "metrics.jsonl"))["best_linf"]
                cfg, model = load_model(ctx.out / name)
                batch = theory.all_triggers_batch(cfg, n_sequences, seed=0, dtype=torch.float32)
                found = attack(model, cfg, steps=attack_steps, restarts=restarts,
                               per_coordinate=False)
                before = plain_measure(_untrained(cfg, batch.x.device), batch)
                rows.append({
                    "experiment": e, "rule": rule, "seed": seed, "status": summary["status"],
                    "converged": summary["converged"], "steps": summary["steps"],
                    "lr_drop_steps": summary.get("lr_drop_steps", []),
                    "best_train_linf": best, "test_linf": summary["linf_error"],
                    "linf_trigger": summary["linf_trigger"],
                    "linf_nontrigger": summary["linf_nontrigger"],
                    "attacked": found.to_dict(contents="none")["max"],
                    **plain_measure(model, batch),
                    "untrained": {k: before[k] for k in
                                  ("sink_heads", "positions_covered", "head_bos",
                                   "bos_max_by_position", "linf_all_triggers")},
                })
    return rows


def grid_records(ctx: Context, seeds: int) -> list[dict[str, Any]]:
    """One row per run of the protocol search (seeds 0..seeds-1): its grid point, how it
    stopped and its best training-batch L∞."""
    rows = []
    for e, rule, std, lr, seed in grid_runs(seeds):
        name = grid_name(e, rule, std, lr, seed)
        summary = ctx.summary(name)
        log = read_log(ctx.out / name / "metrics.jsonl")
        rows.append({
            "experiment": e, "rule": rule, "init_std": std, "lr": lr, "seed": seed,
            "status": summary["status"], "converged": summary["converged"],
            "steps": summary["steps"], "best_train_linf": theory.floor(log)["best_linf"],
        })
    return rows


def plain_collect(ctx: Context, seeds: int, max_steps: int,
                  n_sequences: int = PLAIN_SEQUENCES, grid_seeds: int = 0,
                  attack_steps: int = 100, restarts: int = PLAIN_ATTACK_RESTARTS
                  ) -> dict[str, Any]:
    """What the report's plain-target section reads, as ``records["plain"]``: the protocol, the
    protocol search (``grid``: its grid, one row per point, the choice per shape and rule; None
    without search seeds), the test sequences' count, one row per run and one per (experiment,
    rule)."""
    runs = plain_records(ctx, seeds, n_sequences, attack_steps, restarts)
    grid = None
    if grid_seeds:
        points = grid_points(grid_records(ctx, grid_seeds))
        grid = {"init_std": list(PLAIN_GRID_STD), "lr": list(PLAIN_GRID_LR),
                "seeds": grid_seeds, "rule": PLAIN_CHOICE_RULE, "points": points,
                "choice": plain_choice(points)}
    return {"protocol": plain_protocol(seeds, max_steps), "sequences": n_sequences,
            "grid": grid, "attack": {"steps": attack_steps, "restarts": restarts},
            "runs": runs, "groups": plain_groups(runs)}

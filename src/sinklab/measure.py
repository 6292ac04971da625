"""Measurements of trained toy models that the studies read, each from a run folder or a model:
errors on other test sets (validation sequences, other lengths, several triggers), errors with
BOS hidden, Gu's relative sink rate with a row floor, and self-attention at non-trigger rows.
``sinklab zoo`` and ``sinklab extensions`` call them and keep their results in ``cache/``."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from sinklab import metrics
from sinklab.config import RunConfig, TaskConfig, build_run_config, derive_seed
from sinklab.definitions import GU_EPS, OFF_ROW
from sinklab.evaluate import eval_batch, evaluate
from sinklab.metrics import row_sums
from sinklab.model import AttentionStack
from sinklab.runs.files import read_json, read_npz
from sinklab.task import CONTENT_START, sample_batch
from sinklab.train import load_model

# ------------------------------------------------------------------ sinklab zoo's pass


def gu_relative(weights: torch.Tensor, trigger: torch.Tensor, eps: float = GU_EPS,
                floor: float = OFF_ROW) -> dict[str, Any]:
    """Gu et al.'s relative sink rate with a row floor, for one model's weights.

    ``weights`` (layers, B, H, L, L), ``trigger`` (B,). A row is divided by its sum only when
    that sum is positive and at least ``floor`` times its head's mean trigger-row sum; a row
    below the floor is ignored: it adds nothing to a_0 = (1/L) sum_i A_i0 / sum_k A_ik (Gu et
    al.'s importance of key 0, which every one of the L queries sees), as an all-zero row adds
    nothing. Rows are not re-averaged over the kept ones, or a head whose only rows left were
    BOS's own (which sees BOS alone) and the trigger's would count as a sink.

    Returns the rate in percent over (sample, layer, head), the rows ignored (and how many of
    them were exactly zero) and the rows in all (one per sample, layer, head and query)."""
    sums = weights.sum(-1)  # (layers, B, H, L)
    reference = row_sums(weights, trigger)["trigger"]  # (layers, H)
    kept = (sums > 0) & (sums >= floor * reference[:, None, :, None])
    share = torch.where(kept, weights[..., 0] / sums.clamp(min=1e-30), 0.0)
    a0 = share.sum(-1) / weights.shape[-1]  # (layers, B, H)
    return {"rate": 100 * float((a0 > eps).double().mean()),
            "rows_ignored": int((~kept).sum()), "rows_zero": int((sums == 0).sum()),
            "rows": int(kept.numel())}


@torch.no_grad()
def validation_mse(cfg: RunConfig, model: AttentionStack, seed: int) -> float:
    """MSE of a trained model on the validation sequences drawn with ``seed`` (not the test
    set's)."""
    val_cfg = replace(cfg, eval=replace(cfg.eval, seed=seed))
    (metrics,), _ = evaluate(model, eval_batch(val_cfg, torch.device("cpu")))
    return metrics["mse"]


@torch.no_grad()
def bos_ablation(cfg: RunConfig, model: AttentionStack, keys: Sequence[str]) -> dict[str, float]:
    """A trained model's test errors with BOS hidden from every query but its own
    (``model.bos=ablated``), at trigger and non-trigger rows."""
    ablated = AttentionStack(replace(cfg.model, bos="ablated"), cfg.task.d_model,
                             residual=cfg.residual)
    ablated.load_state_dict(model.state_dict())
    (metrics,), _ = evaluate(ablated, eval_batch(cfg, torch.device("cpu")))
    return {key: metrics[key] for key in keys}


@torch.no_grad()
def capacity_mse(cfg: RunConfig, model: AttentionStack, n_sequences: int) -> float:
    """Mean squared error over the content coordinates of the trigger row, on sequences of the
    training distribution (triggers anywhere in the training range): what the position-free
    argument bounds from below."""
    gen = torch.Generator().manual_seed(derive_seed(cfg.eval.seed, "capacity"))
    batch = sample_batch(cfg.task, n_sequences, gen, residual=cfg.residual)
    err = model(batch.x).out[0] - batch.y  # (B, L, d)
    rows = err[torch.arange(err.shape[0]), batch.trigger]  # (B, d): each trigger row
    return float(rows[:, CONTENT_START:-1].pow(2).mean())


def zoo_checks(path: Path, *, validation_seed: int, capacity_sequences: int | None,
               ablation_keys: Sequence[str], eps: float = GU_EPS,
               floor: float = OFF_ROW) -> dict[str, Any]:
    """One pass over the trained model in ``path``: validation MSE, the test errors with BOS
    hidden, the relative Gu rate with its row floor and, given ``capacity_sequences``, the error
    the capacity argument bounds."""
    cfg, model = load_model(path)
    batch = eval_batch(cfg, torch.device("cpu"))
    with torch.no_grad():
        weights = torch.stack(model(batch.x, return_weights=True).seen(), dim=1)[0]
    return {"validation_mse": validation_mse(cfg, model, validation_seed),
            "ablated": bos_ablation(cfg, model, ablation_keys),
            "gu": gu_relative(weights, batch.trigger, eps, floor),
            "capacity_mse": capacity_mse(cfg, model, capacity_sequences)
            if capacity_sequences is not None else None}


# ------------------------------------------------------------ sinklab extensions' tests


@torch.no_grad()
def length_evaluation(path: Path, lengths: Sequence[int]) -> list[dict[str, Any]]:
    """A trained model tested at every length in ``lengths``, trigger at its eval trigger
    and at L - 1: L∞ at non-trigger and trigger rows, BOS weight of the most sinking head."""
    cfg, model = load_model(path)
    rows = []
    for n in lengths:
        for trigger in dict.fromkeys((cfg.task.eval_trigger, n - 1)):
            test_cfg = replace(cfg, task=replace(cfg.task, seq_len=n, eval_trigger=trigger))
            (m,), _ = evaluate(model, eval_batch(test_cfg, torch.device("cpu")))
            rows.append({"seq_len": n, "trigger": trigger,
                         "linf_nontrigger": m["linf_nontrigger"],
                         "linf_trigger": m["linf_trigger"],
                         "bos_max": float(np.max(m["bos_mass_nontrigger"]))})
    return rows


@torch.no_grad()
def mixed_evaluation(path: Path, mixed: TaskConfig, n_sequences: int) -> dict[str, Any]:
    """A trained model tested on a shared mixed test set (``n_sequences`` of the task ``mixed``):
    L∞ error over the sequences with no trigger, one, and several, and the non-trigger BOS
    weight."""
    cfg, model = load_model(path)
    task = replace(mixed, seq_len=cfg.task.seq_len, d_model=cfg.task.d_model,
                   train_trigger_max=cfg.task.seq_len - 1)
    gen = torch.Generator().manual_seed(derive_seed(cfg.eval.seed, "mixed"))
    batch = sample_batch(task, n_sequences, gen, residual=cfg.residual)
    out = model(batch.x, return_weights=True)
    count = batch.trigger.sum(-1)
    err = (out.out[0] - batch.y).abs().amax(dim=(-2, -1))  # per sequence
    result: dict[str, Any] = {}
    for name, sel in (("none", count == 0), ("one", count == 1), ("several", count >= 2)):
        result[f"linf_{name}"] = err[sel].max().item() if bool(sel.any()) else None
        result[f"n_{name}"] = int(sel.sum())
    bos = torch.stack([metrics.bos_mass_nontrigger(w[0], batch.trigger) for w in out.seen()])
    result["bos_max"] = bos.max().item()
    return result


def self_mass(path: Path) -> float:
    """The largest mean weight a head puts on the query itself at non-trigger rows, read off
    the run's mean attention maps (test set, trigger at the run's eval trigger)."""
    cfg = build_run_config(read_json(path / "config.json"))
    mean = torch.from_numpy(read_npz(path / "attention.npz")["mean"])  # (layers, heads, L, L)
    trigger = torch.tensor([cfg.task.eval_trigger])
    return metrics.self_mass_nontrigger(mean[:, None], trigger).max().item()

"""Evaluation on the fixed test set: every registered metric of a model, per layer and head.

The test set is ``eval.n_sequences`` sequences (default 1000) with the trigger at
``task.eval_trigger`` (default 7, the paper's "trigger at 8"), drawn from a generator seeded by
``eval.seed`` alone, so every run of a configuration sees the same test sequences.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from sinklab import metrics
from sinklab.config import RunConfig, derive_seed
from sinklab.model import AttentionStack
from sinklab.task import Batch, sample_batch


def eval_batch(cfg: RunConfig, device: torch.device) -> Batch:
    """The fixed test set for ``cfg`` on ``device``."""
    generator = torch.Generator(device=device).manual_seed(derive_seed(cfg.eval.seed, "eval"))
    return sample_batch(cfg.task, cfg.eval.n_sequences, generator, residual=cfg.residual,
                        trigger=cfg.task.eval_trigger)


@torch.no_grad()
def evaluate(
    model: AttentionStack, batch: Batch, training: metrics.Training | None = None,
) -> tuple[list[dict[str, Any]], dict[str, np.ndarray]]:
    """Every registered metric (``sinklab.metrics.METRICS``) for every member of ``model`` on
    ``batch``, and the attention maps.

    Returns one dict per member (per-head values as lists indexed [layer][head]); the training
    metrics (steps, converged, ...) are there only with ``training``, how each member's training
    ended. Also arrays ``mean`` and ``std`` of shape (members, layers, heads, L, L): the mean and
    standard deviation of the weights over the test sequences, the paper's Fig. 3 maps. The
    weights are those the heads' outputs see (``ModelOutput.seen``: a per-dimension gate's
    share included).
    """
    out = model(batch.x, return_weights=True)
    weights = torch.stack(out.seen(), dim=1)  # (E, layers, B, H, L, L)
    ev = metrics.Evaluation(weights, out.out, batch.y, batch.trigger, training)
    maps = {
        "mean": weights.mean(dim=2).cpu().numpy(),
        "std": weights.std(dim=2, correction=0).cpu().numpy(),
    }
    return metrics.metric_values(ev), maps

"""Evaluation on the fixed test set: every metric of a trained model, per layer and head.

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


def _nested(t: torch.Tensor) -> list:
    return t.detach().cpu().double().tolist()


@torch.no_grad()
def evaluate(model: AttentionStack,
             batch: Batch) -> tuple[list[dict[str, Any]], dict[str, np.ndarray]]:
    """Metrics for every member of ``model`` on ``batch``, and the attention maps.

    Returns one dict per member (lists indexed [layer][head]) and arrays ``mean`` and ``std``
    of shape (members, layers, heads, L, L): the mean and standard deviation of the weights over
    the test sequences, the paper's Fig. 3 maps.
    """
    out = model(batch.x, return_weights=True)
    errors = metrics.error_split(out.out, batch.y, batch.trigger)  # each (E,)
    weights = torch.stack(out.patterns, dim=1)  # (E, layers, B, H, L, L)
    bos = metrics.bos_mass_nontrigger(weights, batch.trigger)  # (E, layers, H)
    bos_rows = metrics.bos_mass_nontrigger_rows(weights, batch.trigger)  # (E, layers, H, L)
    trig = metrics.trigger_stats(weights, batch.trigger)
    sums = metrics.row_sums(weights, batch.trigger)
    rate = metrics.sink_rate(weights)  # (E, layers, H)
    rate_rel = metrics.sink_rate(weights, relative=True)
    n_sink = metrics.sink_heads(bos)  # (E,)
    per_layer = (bos >= metrics.SINK_HEAD_THRESHOLD).sum(-1)  # (E, layers)

    members = []
    for e in range(model.n_members):
        members.append({
            "linf_error": errors["linf"][e].item(),
            "mse": errors["mse"][e].item(),
            "linf_trigger": errors["linf_trigger"][e].item(),
            "mse_trigger": errors["mse_trigger"][e].item(),
            "linf_nontrigger": errors["linf_nontrigger"][e].item(),
            "mse_nontrigger": errors["mse_nontrigger"][e].item(),
            "bos_mass_nontrigger": _nested(bos[e]),
            "bos_mass_nontrigger_min": _nested(bos_rows[e].nan_to_num(nan=float("inf")).amin(-1)),
            "bos_mass_trigger": _nested(trig["bos"][e]),
            "trigger_content_mass": _nested(trig["content"][e]),
            "trigger_key_mean": _nested(trig["key_mean"][e]),
            "trigger_key_std": _nested(trig["key_std"][e]),
            "row_sum_nontrigger": _nested(sums["nontrigger"][e]),
            "row_sum_trigger": _nested(sums["trigger"][e]),
            "sink_rate": 100 * rate[e].mean().item(),
            "sink_rate_relative": 100 * rate_rel[e].mean().item(),
            "sink_rate_per_head": _nested(rate[e]),
            "sink_heads": int(n_sink[e].item()),
            "sink_heads_per_layer": [int(v) for v in per_layer[e].tolist()],
        })
    maps = {
        "mean": weights.mean(dim=2).cpu().numpy(),
        "std": weights.std(dim=2, correction=0).cpu().numpy(),
    }
    return members, maps

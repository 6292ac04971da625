"""Reading a language-model run's logged points (``curve.jsonl``, written by
``sinklab.pretrain.training``): the model-level numbers of a point, the heads and layers that
sink at it, and the point from which something holds to the end of the run. What
``sinklab birth``, the pretraining study's pilot and its analysis read the same way; no torch.

A point holds per layer and head the first-token mass and Gu et al.'s sink rate (the share of
windows whose first-key importance exceeds eps = 0.3), and per layer the first token's residual
norm over the others'; a head sinks at ``HEAD_SINK_RATE``, a model at ``MODEL_SINK_RATE``
(``sinklab.definitions``).
"""

from __future__ import annotations

from typing import Any

from sinklab.definitions import HEAD_SINK_RATE


def mean_of(rows: list[list[float]]) -> float:
    """The mean over every layer and head of a per-layer, per-head number."""
    values = [v for row in rows for v in row]
    return sum(values) / len(values)


def point_summary(point: dict[str, Any]) -> dict[str, Any]:
    """One logged point's model-level numbers: means over layers and heads, the largest
    layer's first-token residual ratio, and the layers with a sink head (``sink_layers``)."""
    return {"step": point["step"], "tokens": point["tokens"], "val_loss": point["val_loss"],
            "sink_rate": mean_of(point["sink_rate"]),
            "sink_rate_relative": mean_of(point["sink_rate_relative"]),
            "first_mass": mean_of(point["first_mass"]),
            "value_ratio": mean_of(point["value_ratio"]),
            "resid_ratio_max": float(max(point["resid_ratio"])),
            "sink_layers": sink_layers(point)}


def sink_heads(point: dict[str, Any], head_rate: float = HEAD_SINK_RATE
               ) -> list[tuple[int, int]]:
    """The (layer, head) pairs of a point whose sink rate reaches ``head_rate``."""
    return [(layer, head) for layer, rates in enumerate(point["sink_rate"])
            for head, rate in enumerate(rates) if rate >= head_rate]


def sink_layers(point: dict[str, Any], head_rate: float = HEAD_SINK_RATE) -> list[int]:
    """The layers of a point (or of a summary's final ``heads_final``) with a sink head."""
    return sorted({layer for layer, _ in sink_heads(point, head_rate)})


def held_from(curve: list[dict[str, Any]], holds: list[bool]) -> int | None:
    """The tokens of the first point of ``curve`` from which ``holds`` is true to the end, or
    None."""
    for i in range(len(holds)):
        if all(holds[i:]):
            return curve[i]["tokens"]
    return None

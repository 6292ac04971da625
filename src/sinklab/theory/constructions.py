"""The paper's theorem, made numerical: constructions, the sink family, denied sinks, frontiers.

Five pieces, each a function of explicit inputs, gathered by the ``sinklab theory`` study
(``sinklab.studies.theory``):

- ``relu_construction``: weights for the paper's model class that solve the task *exactly* with
  ReLU attention and no sink, for any sequence length and width (>= 4); the same weights solve
  it exactly with softpick (``zero_row_construction``);
- ``softmax_sink``: a family of softmax weights indexed by a logit gap c that solves the task
  approximately by parking non-trigger rows on BOS; its error falls only as BOS mass rises;
- ``denied_configs``: training runs whose BOS key is removed, or whose BOS share is capped at
  1 - eps, at every non-trigger row (``model.bos``), to measure the error floor without a sink;
- ``frontier_points``: every logged checkpoint of a reproduce folder as (error, BOS mass);
- ``head_contributions``: per-head output norms at non-trigger rows of multi-layer models;
  ``head_split``: each head's output there split into its mean (a constant vector) and the
  variation around it.

Weights use the model's row-vector convention: q = x W_Q, scores = q k^T, output = A (x W_V) W_O.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np
import torch

from sinklab import metrics
from sinklab.attention import RULES, causal_mask, has_parameters
from sinklab.config import RunConfig, build_run_config, value_text
from sinklab.errors import ConfigError
from sinklab.model import AttentionStack
from sinklab.task import BOS, TRIGGER, Batch, sample_batch
from sinklab.theory.protocol import DENIED_EPS, ERROR_BINS, PLATEAU_PATIENCE


def construction_config(rule: str, seq_len: int = 16, d_model: int = 16, n_layers: int = 1,
                        n_heads: int = 1) -> RunConfig:
    """The run config a construction is built for; sizes are validated as for training.

    A construction sets W_Q, W_K, W_V and W_O of the paper's attention-only layer and nothing
    else, so a rule with parameters of its own cannot take part in one (ConfigError).
    """
    if rule in RULES and has_parameters(rule):
        plain = ", ".join(r for r in sorted(RULES) if not has_parameters(r))
        raise ConfigError(f"the {rule!r} rule has parameters of its own, which a construction "
                          f"does not set: build constructions with a rule without parameters "
                          f"({plain}).")
    task = {"seq_len": seq_len, "d_model": d_model}
    if isinstance(seq_len, int) and seq_len < 8:  # the default test trigger (7) must fit
        task["eval_trigger"] = max(seq_len - 1, 2)
    return build_run_config({"task": task,
                             "model": {"attention": rule, "n_layers": n_layers,
                                       "n_heads": n_heads}})


def _empty_model(cfg: RunConfig, dtype: torch.dtype) -> AttentionStack:
    model = AttentionStack(cfg.model, cfg.task.d_model, residual=cfg.residual)
    return model.to(dtype)


# The rules for which ``zero_row_construction``'s weights solve the task exactly: each turns a
# row of scores that are all 0 into an all-zero row, and j equal positive scores beside a 0 on
# BOS into 1/j on each of the j keys.
ZERO_ROW_RULES = ("relu", "softpick")


def relu_construction(seq_len: int = 16, d_model: int = 16, n_layers: int = 1, n_heads: int = 1,
                      dtype: torch.dtype = torch.float32) -> tuple[RunConfig, AttentionStack]:
    """``zero_row_construction`` for the paper's ReLU rule."""
    return zero_row_construction("relu", seq_len, d_model, n_layers, n_heads, dtype)


@torch.no_grad()
def zero_row_construction(rule: str = "relu", seq_len: int = 16, d_model: int = 16,
                          n_layers: int = 1, n_heads: int = 1,
                          dtype: torch.dtype = torch.float32) -> tuple[RunConfig, AttentionStack]:
    """Weights that solve the task exactly with ``rule`` (one of ``ZERO_ROW_RULES``), with no
    BOS weight anywhere: every non-trigger row is all zero.

    Layer 1, head 1 does the work; every other head of every layer is zero (silent), so with
    several layers the residual stream carries x through and the target is x plus the mean at
    the trigger. In that head:

    - W_Q maps the trigger flag to e_1 and everything else to 0, so only the trigger row has a
      non-zero query;
    - W_K maps the trigger flag and the bias flag to e_1: every token but BOS has exactly one
      of them, so its key is e_1 and BOS's key is 0;
    - hence at the trigger row j, S_jk = 1 for k = 1..j and 0 for BOS, and ReLU(S) / j puts
      1/j on each of x_1..x_j; at every other row S = 0 and the row is all zero. Softpick,
      ReLU(e^S - 1) / sum |e^S - 1|, does the same: e - 1 on each of the j keys over j (e - 1),
      and BOS's e^0 - 1 = 0 adds nothing to the denominator; a row of zero scores is all zero;
    - W_V = W_O = I, so the trigger row outputs mean(x_1..x_j) and every other row 0.

    Another rule is a ConfigError naming these; with these weights sigmoid's and unscaled
    ReLU's trigger rows are not a mean (the tests show them far from exact).
    """
    if rule not in ZERO_ROW_RULES:
        raise ConfigError(f"the zero-row construction is exact for the rules "
                          f"{', '.join(ZERO_ROW_RULES)} only, not {rule!r}: choose one of them.")
    cfg = construction_config(rule, seq_len, d_model, n_layers, n_heads)
    model = _empty_model(cfg, dtype)
    last = d_model - 1
    attn = model.blocks[0].attn
    attn.w_q[0, 0, TRIGGER, TRIGGER] = 1.0
    attn.w_k[0, 0, TRIGGER, TRIGGER] = 1.0
    attn.w_k[0, 0, last, TRIGGER] = 1.0
    attn.w_v[0, 0] = torch.eye(d_model, dtype=dtype)
    attn.w_o[0, 0] = torch.eye(d_model, dtype=dtype)
    return cfg, model


@torch.no_grad()
def softmax_sink(c: float, seq_len: int = 16, d_model: int = 16,
                 dtype: torch.dtype = torch.float64) -> tuple[RunConfig, AttentionStack]:
    """Softmax weights with logit gap ``c`` that use BOS as the sink (1 layer, 1 head).

    Queries: the trigger flag maps to c e_1, the bias flag and the BOS flag to c e_0. Keys: BOS
    maps to e_0, every other token (trigger or bias flag) to e_1. So a non-trigger row scores
    BOS at c and every visible content token at 0, and the trigger row scores the content at c
    and BOS at 0. Values: W_V W_O = I with the BOS coordinate removed, so BOS's value is 0 and
    every other token's value is itself.

    At a non-trigger row i the output is (i / (e^c + i)) mean(x_1..x_i): exactly 1 - BOS mass
    times a content mean. At the trigger row j it is (j e^c / (1 + j e^c)) mean(x_1..x_j).
    """
    cfg = construction_config("softmax", seq_len, d_model)
    model = _empty_model(cfg, dtype)
    last = d_model - 1
    attn = model.blocks[0].attn
    attn.w_q[0, 0, TRIGGER, TRIGGER] = c
    attn.w_q[0, 0, last, BOS] = c
    attn.w_q[0, 0, BOS, BOS] = c
    attn.w_k[0, 0, BOS, BOS] = 1.0
    attn.w_k[0, 0, TRIGGER, TRIGGER] = 1.0
    attn.w_k[0, 0, last, TRIGGER] = 1.0
    attn.w_v[0, 0] = torch.eye(d_model, dtype=dtype)
    attn.w_v[0, 0, BOS, BOS] = 0.0
    attn.w_o[0, 0] = torch.eye(d_model, dtype=dtype)
    return cfg, model


def all_triggers_batch(cfg: RunConfig, n_sequences: int, seed: int,
                       dtype: torch.dtype = torch.float64) -> Batch:
    """Test sequences of the paper's input set, one trigger each, anywhere in 2..L-1: the set
    the theorem and the certificate speak of, whatever trigger range or count (a zoo
    extension's) the model was trained on."""
    generator = torch.Generator().manual_seed(seed)
    task = dataclasses.replace(cfg.task, train_trigger_min=2,
                               train_trigger_max=cfg.task.seq_len - 1, no_trigger_prob=0.0,
                               max_triggers=1)
    return sample_batch(task, n_sequences, generator, residual=cfg.residual, dtype=dtype)


@torch.no_grad()
def measure(model: AttentionStack, batch: Batch) -> dict[str, Any]:
    """Errors and sink numbers of a (one-member) model on a batch, as plain floats."""
    model = model.to(batch.x.dtype)
    out = model(batch.x, return_weights=True)
    err = metrics.error_split(out.out[0], batch.y, batch.trigger)
    weights = torch.stack(out.patterns, dim=1)[0]  # (layers, B, H, L, L)
    bos = metrics.bos_mass_nontrigger(weights, batch.trigger)  # (layers, H)
    nontrigger, _ = metrics.row_types(batch.trigger, weights.shape[-1])
    bos_rows = weights[..., 0].transpose(-1, -2)[:, nontrigger]  # (layers, rows, H)
    return {
        "linf": err["linf"].item(), "mse": err["mse"].item(),
        "linf_trigger": err["linf_trigger"].item(),
        "linf_nontrigger": err["linf_nontrigger"].item(),
        "mse_nontrigger": err["mse_nontrigger"].item(),
        "bos_mass_nontrigger": bos.tolist(),
        "bos_mass_nontrigger_min": bos_rows.amin(dim=1).tolist(),
        "bos_weight_max": weights[..., 0].max().item(),
    }


def fit_slope(x: list[float], y: list[float]) -> float:
    """Least-squares slope of log10(y) against log10(x) over the points where both are > 0."""
    pts = [(math.log10(a), math.log10(b)) for a, b in zip(x, y) if a > 0 and b > 0]
    if len(pts) < 2:
        return float("nan")
    xs, ys = np.array(pts).T
    return float(np.polyfit(xs, ys, 1)[0])


def family_sweep(gaps: list[float], n_sequences: int = 2000, seed: int = 0,
                 seq_len: int = 16, d_model: int = 16) -> dict[str, Any]:
    """The softmax sink family over logit gaps: error and BOS mass per gap, and the slopes."""
    cfg, _ = softmax_sink(0.0, seq_len, d_model)
    batch = all_triggers_batch(cfg, n_sequences, seed)
    points = []
    for c in gaps:
        _, model = softmax_sink(c, seq_len, d_model)
        m = measure(model, batch)
        points.append({"c": c, **m, "one_minus_bos": 1 - m["bos_mass_nontrigger"][0][0]})
    gap = [p["one_minus_bos"] for p in points]
    return {
        "points": points,
        "slope_linf": fit_slope(gap, [p["linf_nontrigger"] for p in points]),
        "slope_mse": fit_slope(gap, [p["mse_nontrigger"] for p in points]),
        "n_sequences": n_sequences, "seed": seed, "seq_len": seq_len, "d_model": d_model,
    }


def relu_exactness(sizes: list[tuple[int, int]], n_sequences: int = 256,
                   seed: int = 0) -> list[dict[str, Any]]:
    """The ReLU construction's errors and BOS weights for (seq_len, d_model) pairs, both dtypes,
    1x1 and 2x2 (residual)."""
    rows = []
    for seq_len, d_model in sizes:
        for layers, heads in ((1, 1), (2, 2)):
            for dtype in (torch.float32, torch.float64):
                cfg, model = relu_construction(seq_len, d_model, layers, heads, dtype)
                m = measure(model, all_triggers_batch(cfg, n_sequences, seed, dtype))
                rows.append({"seq_len": seq_len, "d_model": d_model, "model": f"{layers}x{heads}",
                             "dtype": str(dtype).removeprefix("torch."), **m})
    return rows


# ---------------------------------------------------------------------------- denied sinks


def denied_settings(eps_values: tuple[float, ...] = DENIED_EPS) -> list[tuple[str, float | None]]:
    """(name, eps) of every denied-sink setting: the BOS key removed, then each cap."""
    return [("removed", None)] + [(f"capped-{value_text(eps)}", eps) for eps in eps_values]


def denied_config(rule: str, setting: str, eps: float | None, seed: int, max_steps: int,
                  device: str = "auto") -> RunConfig:
    """A 1x1 run with its sink denied: ``setting`` is "removed" or "capped-<eps>". It trains
    to a plateau (``PLATEAU_PATIENCE``) or the stop rule, at most ``max_steps`` steps."""
    model: dict[str, Any] = {"attention": rule, "bos": "removed" if eps is None else "capped"}
    if eps is not None:
        model["bos_cap_eps"] = eps
    return build_run_config({"model": model,
                             "train": {"seed": seed, "max_steps": max_steps, "log_every": 50,
                                       "patience": PLATEAU_PATIENCE, "device": device}})


def floor(rows: list[dict[str, Any]]) -> dict[str, float]:
    """The best training-batch L-infinity error and MSE (loss) among a run's logged checkpoints
    (``sinklab.runs.files.read_log`` rows)."""
    good = [r for r in rows if r.get("loss") is not None and math.isfinite(r["loss"])]
    if not good:
        return {"best_linf": float("nan"), "best_mse": float("nan")}
    return {"best_linf": min(r["train_linf"] for r in good),
            "best_mse": min(r["loss"] for r in good)}


# ------------------------------------------------------------------------------- frontier


def frontier_points(rows: list[dict[str, Any]]) -> list[dict[str, float]]:
    """(step, training-batch L-infinity error, min and max non-trigger BOS mass over heads) per
    checkpoint of a training log (``sinklab.runs.files.read_log`` rows)."""
    points = []
    for r in rows:
        if r.get("train_linf") is None or not math.isfinite(r["train_linf"]):
            continue
        bos = np.ravel(r["bos_mass_nontrigger"])
        points.append({"step": r["step"], "train_linf": r["train_linf"],
                       "bos_min": float(bos.min()), "bos_max": float(bos.max())})
    return points


def _ranks(values: list[float]) -> np.ndarray:
    """Ranks from 0, ties sharing their average rank."""
    a = np.asarray(values, dtype=float)
    ranks = np.empty(len(a))
    ranks[np.argsort(a, kind="stable")] = np.arange(len(a))
    _, group, counts = np.unique(a, return_inverse=True, return_counts=True)
    return np.bincount(group, weights=ranks)[group] / counts[group]


def spearman(x: list[float], y: list[float]) -> float:
    """Spearman rank correlation; NaN when either variable is constant (no ordering to see)."""
    if len(x) < 3:
        return float("nan")
    rx, ry = _ranks(x), _ranks(y)
    if rx.std() == 0 or ry.std() == 0:
        return float("nan")
    return float(np.corrcoef(rx, ry)[0, 1])


def frontier_summary(points: list[dict[str, float]], min_bos_range: float = 0.0
                     ) -> dict[str, Any]:
    """Mean min/max BOS mass of the checkpoints in each error band, and the rank correlation
    of the error with 1 - max BOS mass (positive: less sink, more error).

    The correlation is computed only when the max BOS mass spans more than ``min_bos_range``
    over the checkpoints (``bos_range``, largest minus smallest); otherwise it is None: ranks
    of masses that all sit within a sliver of each other order noise, not sinks."""
    bands = []
    for lo, hi in ERROR_BINS:
        sel = [p for p in points if lo <= p["train_linf"] < hi]
        bands.append({"linf_from": lo, "linf_to": hi, "n": len(sel),
                      "bos_min": float(np.mean([p["bos_min"] for p in sel])) if sel else None,
                      "bos_max": float(np.mean([p["bos_max"] for p in sel])) if sel else None})
    tops = [p["bos_max"] for p in points]
    bos_range = max(tops) - min(tops) if tops else 0.0
    rho = (spearman([p["train_linf"] for p in points], [1 - b for b in tops])
           if bos_range > min_bos_range else None)
    return {"n_checkpoints": len(points), "bands": bands,
            "bos_max_overall": max(tops, default=None), "bos_range": bos_range,
            "spearman_error_vs_one_minus_max_bos": rho}


# ---------------------------------------------------------------------- head contributions


@torch.no_grad()
def head_contributions(model: AttentionStack, batch: Batch) -> list[dict[str, Any]]:
    """Per layer of a one-member model: each head's output contribution at non-trigger rows.

    For head h of a layer with input stream z, its contribution is A_h (z W_V^h) W_O^h. Returned
    per layer: the head's non-trigger BOS mass, the mean L2 norm (over non-trigger rows and
    sequences) of A_h z W_V^h before W_O ("pre") and of the contribution after it ("post"),
    the mean norm of the sum over heads (at non-trigger and, for scale, trigger rows), and the
    mean norm of everything the layers so far have added to the residual stream.
    """
    x = batch.x.to(model.blocks[0].attn.w_q.dtype)
    mask = causal_mask(x.shape[-2], x.device)
    nontrigger, is_trigger = metrics.row_types(batch.trigger, x.shape[-2])
    h = x[None]
    stream = x  # what the residual stream started as
    layers = []
    for block in model.blocks:
        attn = block.attn
        y, _, weights, _ = attn(h, mask)  # weights (1, B, H, L, L)
        heads = []
        total = torch.zeros_like(h[0])
        for hd in range(attn.w_q.shape[1]):
            pre = weights[0, :, hd] @ (h[0] @ attn.w_v[0, hd])  # (B, L, d)
            post = pre @ attn.w_o[0, hd]
            total = total + post
            heads.append({
                "bos_mass_nontrigger": weights[0, :, hd, :, 0][nontrigger].mean().item(),
                "pre_norm": pre.norm(dim=-1)[nontrigger].mean().item(),
                "post_norm": post.norm(dim=-1)[nontrigger].mean().item(),
            })
        torch.testing.assert_close(total, y[0], rtol=1e-4, atol=1e-5)  # the heads add up
        sum_norm = total.norm(dim=-1)
        h = h + y if model.residual else y
        # with a residual stream: how far the layers so far have moved each row from x
        moved = (h[0] - stream).norm(dim=-1) if model.residual else h[0].norm(dim=-1)
        layers.append({
            "heads": heads,
            "sum_norm_nontrigger": sum_norm[nontrigger].mean().item(),
            "sum_norm_trigger": sum_norm[is_trigger].mean().item(),
            "sum_of_head_norms_nontrigger": sum(hh["post_norm"] for hh in heads),
            "cumulative_norm_nontrigger": moved[nontrigger].mean().item(),
            "cumulative_norm_trigger": moved[is_trigger].mean().item(),
        })
    return layers


def mean_split(v: torch.Tensor) -> dict[str, float]:
    """Vectors v (N, d) split into their mean m and the variation around it, as root mean
    squares: ``rms`` = sqrt(mean |v_n|^2), ``const`` = |m|, ``var`` = sqrt(mean |v_n - m|^2),
    so that rms^2 = const^2 + var^2 exactly (computed in float64)."""
    v = v.to(torch.float64)
    m = v.mean(dim=0)
    return {"rms": v.pow(2).sum(-1).mean().sqrt().item(), "const": m.norm().item(),
            "var": (v - m).pow(2).sum(-1).mean().sqrt().item()}


@torch.no_grad()
def head_split(model: AttentionStack, batch: Batch) -> dict[str, Any]:
    """What every head of a one-member model writes at non-trigger rows, split (``mean_split``)
    over all non-trigger rows of all sequences into a constant (the mean vector, the same at
    every row, which heads and layers can cancel by adding opposite constants) and the variation
    around it.

    Returned: per layer, each head's non-trigger BOS mass and the split of its contribution
    A_h (z W_V^h) W_O^h; the split of the layer's sum over heads (``layer``); the split of what
    layers 1..l have added to the stream so far (``cumulative``: the stream minus x with a
    residual stream, the stream itself without); and ``error``, the split of the model's own
    output minus the target at those rows, computed by a separate forward pass. With a residual
    stream the target there is x, so the last layer's ``cumulative`` is the error.
    """
    x = batch.x.to(model.blocks[0].attn.w_q.dtype)
    mask = causal_mask(x.shape[-2], x.device)
    nontrigger, _ = metrics.row_types(batch.trigger, x.shape[-2])
    h = x[None]
    layers = []
    for block in model.blocks:
        attn = block.attn
        y, _, weights, _ = attn(h, mask)  # y (1, B, L, d), weights (1, B, H, L, L)
        heads = []
        for hd in range(attn.w_q.shape[1]):
            post = weights[0, :, hd] @ (h[0] @ attn.w_v[0, hd]) @ attn.w_o[0, hd]  # (B, L, d)
            heads.append({"bos_mass_nontrigger": weights[0, :, hd, :, 0][nontrigger].mean().item(),
                          **mean_split(post[nontrigger])})
        h = h + y if model.residual else y
        moved = h[0] - x if model.residual else h[0]
        layers.append({"heads": heads, "layer": mean_split(y[0][nontrigger]),
                       "cumulative": mean_split(moved[nontrigger])})
    out = model(x).out[0]
    return {"layers": layers, "error": mean_split((out - batch.y)[nontrigger])}

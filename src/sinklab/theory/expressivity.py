"""Which attention rules can express the trigger-conditional task, 1x1 and 2x2 (issue 28 item 1).

For each of sinklab's thirteen rules (``TABLE_RULES``) and each configuration, "1x1" (one layer,
one head, the plain target: the theorem's setting) and "2x2" (two residual layers of two heads),
``EXPRESSIVITY`` records a ``Verdict``: a construction (weights written down, exact or to an
error as small as wanted), an impossibility argument, or "unknown". The constructions are here
or in ``sinklab.theory.constructions``; ``check_construction`` measures one; ``sigmoid_floor``
and ``clipped_floor`` give the two new arguments' numbers (``SIGMOID_1X1_ARGUMENT``,
``CLIPPED_1X1_ARGUMENT``)::

    from sinklab.theory import expressivity as ex
    ex.EXPRESSIVITY["1x1", "softmax1"]        # Verdict(verdict="can", how="to any error", ...)
    ex.check_construction("1x1", "softmax1")  # measured errors at three strengths, with bounds
    ex.sigmoid_floor(cfg.task)                # the 1x1 sigmoid floor (0.0099 at L = 16)
    ex.clipped_floor(cfg.task)                # the 1x1 clipped-softmax floor (0.1033 at L = 16)

Weights use the model's row-vector convention: q = x W_Q, scores = q k^T (no 1/sqrt(d)),
output = A (x W_V) W_O. Each construction sets layer 1, head 1 and leaves every other head of a
2x2 stack zero (silent), so there the residual stream carries x through and the target is x plus
the mean at the trigger, exactly as in ``zero_row_construction``; the clipped-softmax one, which
needs two layers, sets head 1 of both.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np
import torch
from torch import Tensor

from sinklab import metrics
from sinklab.config import RunConfig, TaskConfig, build_run_config
from sinklab.errors import ConfigError
from sinklab.model import Attention, AttentionStack
from sinklab.task import BOS, CONTENT_START, TRIGGER, Batch, encode, targets
from sinklab.theory.constructions import (
    all_triggers_batch,
    construction_config,
    measure,
    softmax_sink,
    zero_row_construction,
)

CONFIGS: dict[str, tuple[int, int]] = {"1x1": (1, 1), "2x2": (2, 2)}  # (n_layers, n_heads)
# The rules the table speaks of: sinklab's own thirteen (a test checks each is registered),
# clipped_softmax at its defaults (``CLIP_ZETA``, ``CLIP_GAMMA``).
TABLE_RULES = ("softmax", "relu", "relu_len", "relu_raw", "softmax1", "sink_logit", "sigmoid",
               "softpick", "gated", "uniform", "gated_dim", "kv_bias", "clipped_softmax")
VERDICTS = ("can", "cannot", "unknown")
EXACT, ANY_ERROR, OPEN = "exact", "to any error", "open"
# The impossibility arguments, by key: the first three are ``sinklab.studies.zoo``'s capacity
# arguments (their proofs are in the zoo report), the last is ``SIGMOID_1X1_ARGUMENT``.
ARGUMENTS: dict[str, str] = {
    "position_free": "the trigger row's weights do not depend on the trigger position j, so they "
                     "cannot give the 1/j average",
    "fixed_weights": "the weights ignore the scores, so the model is linear and cannot both null "
                     "every non-trigger row and average at the trigger row",
    "linear_stack": "the weights ignore the scores, so the stack is linear at any depth and x_1's "
                    "weight at the first trigger row must be both 1/j and 0",
    "pole_gap": "the trigger row's content weight 1/(1 + (j + 1) a) has its pole in j at or left "
                "of -1 while the target's 1/j has its pole at 0, and three trigger positions "
                "pin that down to an error floor",
    "clip_offset": "the trigger row's clipped content weight 1.03 / (j + r) - 0.03 keeps its "
                   "offset -0.03 per key whatever the position-free score gap r, so no scale "
                   "of it follows 1/j over the trigger positions, which gives an error floor",
}
STRENGTHS = (4.0, 8.0, 16.0)  # the logit gaps c at which a "to any error" construction is shown
# clipped_softmax's defaults, the ones the table speaks of (a test checks them against the
# registration), and the softmax weight at or below which a clipped weight is exactly 0.
CLIP_ZETA, CLIP_GAMMA = 1.0, -0.03
CLIP_ZERO = -CLIP_GAMMA / (CLIP_ZETA - CLIP_GAMMA)


@dataclass(frozen=True)
class Verdict:
    """Whether a rule can express the task in a configuration, and on what grounds.

    ``verdict`` is "can", "cannot" or "unknown"; ``how`` is "exact" or "to any error" for "can"
    (with the ``construction`` function's name), an ``ARGUMENTS`` key for "cannot", "open" for
    "unknown"; ``why`` is one sentence.
    """

    verdict: str
    how: str
    construction: str | None
    why: str

    def __post_init__(self) -> None:
        allowed = {"can": (EXACT, ANY_ERROR), "cannot": tuple(ARGUMENTS), "unknown": (OPEN,)}
        if self.verdict not in allowed:
            raise ValueError(f"Verdict.verdict={self.verdict!r} is not allowed: choose one of "
                             f"{', '.join(VERDICTS)}.")
        if self.how not in allowed[self.verdict]:
            raise ValueError(f"Verdict.how={self.how!r} is not allowed with verdict "
                             f"{self.verdict!r}: choose one of "
                             f"{', '.join(allowed[self.verdict])}.")
        if (self.construction is not None) != (self.verdict == "can"):
            raise ValueError(f"Verdict.construction={self.construction!r} is not allowed with "
                             f"verdict {self.verdict!r}: a construction goes with 'can' only.")


# ------------------------------------------------------------------------- constructions


def _config(rule: str, seq_len: int, d_model: int, n_layers: int, n_heads: int) -> RunConfig:
    """``construction_config`` for any rule: a rule with parameters gets the same config with
    its name swapped in (``construction_config`` refuses it, since it sets no parameters; the
    constructions here set them)."""
    plain = construction_config("softmax", seq_len, d_model, n_layers, n_heads)
    values = plain.to_dict()
    values["model"]["attention"] = rule
    return build_run_config(values)


def _stack(cfg: RunConfig, dtype: torch.dtype) -> tuple[AttentionStack, Attention]:
    """A model for ``cfg`` with every weight zero, and its first layer's attention."""
    model = AttentionStack(cfg.model, cfg.task.d_model, residual=cfg.residual).to(dtype)
    return model, model.blocks[0].attn


def _values_without_bos(attn: Attention, d_model: int, scale: float = 1.0) -> None:
    """Head 1's W_V = I with the BOS coordinate removed and W_O = ``scale`` I: BOS's value is 0
    and every other token's value is ``scale`` times itself."""
    eye = torch.eye(d_model, dtype=attn.w_v.dtype)
    attn.w_v[0, 0] = eye
    attn.w_v[0, 0, BOS, BOS] = 0.0
    attn.w_o[0, 0] = scale * eye


@torch.no_grad()
def softmax_construction(c: float, seq_len: int = 16, d_model: int = 16, n_layers: int = 1,
                         n_heads: int = 1, dtype: torch.dtype = torch.float64
                         ) -> tuple[RunConfig, AttentionStack]:
    """``softmax_sink(c)``'s weights in layer 1, head 1 (the whole model at 1x1).

    Non-trigger rows score BOS at c and the content at 0, so row i outputs
    (i / (e^c + i)) mean(x_1..x_i); the trigger row outputs (j e^c / (1 + j e^c)) mean(x_1..x_j).
    Every coordinate of a mean lies in [-1, 1], so the L-infinity error is at most
    (L - 1) / (e^c + L - 1) (``error_bound``): to any error as c grows, never exact (softmax's
    weights are all positive, so a row that outputs exactly 0 has no content in its values).
    """
    cfg = _config("softmax", seq_len, d_model, n_layers, n_heads)
    model, attn = _stack(cfg, dtype)
    sink = softmax_sink(c, seq_len, d_model, dtype)[1].blocks[0].attn
    for name in ("w_q", "w_k", "w_v", "w_o"):
        getattr(attn, name)[0, 0] = getattr(sink, name)[0, 0]
    return cfg, model


def _trigger_reads_content(attn: Attention, d_model: int, strength: float) -> None:
    """The part every sink construction shares: the trigger flag's query strength e_1 against
    keys e_1 from the trigger and bias flags (every token but BOS), so the trigger row scores
    its content keys at ``strength`` and BOS at 0; values W_V W_O = I without BOS's coordinate."""
    last = d_model - 1
    attn.w_q[0, 0, TRIGGER, 1] = strength
    attn.w_k[0, 0, TRIGGER, 1] = 1.0
    attn.w_k[0, 0, last, 1] = 1.0
    _values_without_bos(attn, d_model)


@torch.no_grad()
def softmax1_construction(c: float, seq_len: int = 16, d_model: int = 16, n_layers: int = 1,
                          n_heads: int = 1, dtype: torch.dtype = torch.float64
                          ) -> tuple[RunConfig, AttentionStack]:
    """softmax_1 weights that use its implicit zero logit as the sink, not BOS.

    Queries: the BOS and bias flags map to -c e_0, the trigger flag to c e_1. Keys: every flag
    maps to e_0 (every token has exactly one), the trigger and bias flags also to e_1. So a
    non-trigger row scores every visible key at -c: each of its i + 1 keys gets
    1 / (e^c + i + 1) and the row outputs (i / (e^c + i + 1)) mean(x_1..x_i), almost nothing.
    The trigger row scores the j content keys at c and BOS at 0: each content key gets
    e^c / (2 + j e^c). Values: W_V W_O = I without the BOS coordinate. The L-infinity error is
    at most (L - 1) / (e^c + L) for c >= 0 (``error_bound``), and BOS's weight is at most
    1 / (e^c + 1) (at BOS's own row).
    """
    cfg = _config("softmax1", seq_len, d_model, n_layers, n_heads)
    model, attn = _stack(cfg, dtype)
    last = d_model - 1
    attn.w_q[0, 0, BOS, 0] = -c
    attn.w_q[0, 0, last, 0] = -c
    for flag in (BOS, TRIGGER, last):
        attn.w_k[0, 0, flag, 0] = 1.0
    _trigger_reads_content(attn, d_model, c)
    return cfg, model


@torch.no_grad()
def sink_logit_construction(c: float, seq_len: int = 16, d_model: int = 16, n_layers: int = 1,
                            n_heads: int = 1, dtype: torch.dtype = torch.float64
                            ) -> tuple[RunConfig, AttentionStack]:
    """Weights for the learned sink logit: the logit is c, and only the trigger row scores.

    Head 1's logit b = c. Queries: the trigger flag maps to 2c e_1, nothing else to anything.
    Keys: the trigger and bias flags map to e_1. So a non-trigger row scores every key at 0 and
    each of its i + 1 keys gets 1 / (e^c + i + 1): the row outputs
    (i / (e^c + i + 1)) mean(x_1..x_i). The trigger row scores the j content keys at 2c and BOS
    at 0, so they get e^{2c} / (e^c + 1 + j e^{2c}) each. Values: W_V W_O = I without the BOS
    coordinate. The L-infinity error is at most (L - 1) / (e^c + L) for c >= 0 and L >= 4
    (``error_bound``).
    """
    cfg = _config("sink_logit", seq_len, d_model, n_layers, n_heads)
    model, attn = _stack(cfg, dtype)
    attn.rule.logit[0, 0] = c
    _trigger_reads_content(attn, d_model, 2 * c)
    return cfg, model


@torch.no_grad()
def gated_construction(c: float, seq_len: int = 16, d_model: int = 16, n_layers: int = 1,
                       n_heads: int = 1, dtype: torch.dtype = torch.float64
                       ) -> tuple[RunConfig, AttentionStack]:
    """Weights for gated attention: the gate closes at every row but the trigger's.

    Gate: w = 2c on the trigger flag, bias -c, so sigmoid(x_i . w - c) is sigmoid(-c) at BOS and
    at content tokens and sigmoid(c) at the trigger. Scores: the trigger flag's query c e_1
    against keys e_1 from the trigger and bias flags, so the trigger row puts e^c / (1 + j e^c)
    on each content key; every other row has a zero query and spreads 1 / (i + 1) over its keys
    (no sink: the closed gate does the work). Values: W_V W_O = I without the BOS coordinate.
    Row i outputs sigmoid(-c) (i / (i + 1)) mean(x_1..x_i); the trigger row
    sigmoid(c) (j e^c / (1 + j e^c)) mean(x_1..x_j). The L-infinity error is at most
    3 / (2 (1 + e^c)) (``error_bound``).
    """
    cfg = _config("gated", seq_len, d_model, n_layers, n_heads)
    model, attn = _stack(cfg, dtype)
    attn.rule.gate_w[0, 0, TRIGGER] = 2 * c
    attn.rule.gate_b[0, 0] = -c
    _trigger_reads_content(attn, d_model, c)
    return cfg, model


@torch.no_grad()
def gated_dim_construction(c: float, seq_len: int = 16, d_model: int = 16, n_layers: int = 1,
                           n_heads: int = 1, dtype: torch.dtype = torch.float64
                           ) -> tuple[RunConfig, AttentionStack]:
    """``gated_construction`` with its gate replicated on every dimension (the G1 gate).

    W_g's columns all equal the headwise gate's w (2c on the trigger flag) and b_g is -c on
    every dimension, so each head's mixed values are scaled by sigmoid(-c) at every row but the
    trigger's and by sigmoid(c) there: the headwise gate's scaling of its row of weights. Same
    scores and values, so the same outputs and the same L-infinity error bound
    3 / (2 (1 + e^c)) (``error_bound``).
    """
    cfg = _config("gated_dim", seq_len, d_model, n_layers, n_heads)
    model, attn = _stack(cfg, dtype)
    headwise = gated_construction(c, seq_len, d_model, 1, 1, dtype)[1].blocks[0].attn
    for name in ("w_q", "w_k", "w_v", "w_o"):
        getattr(attn, name)[0, 0] = getattr(headwise, name)[0, 0]
    attn.rule.gate_w[0, 0] = headwise.rule.gate_w[0, 0][:, None].expand(d_model, d_model)
    attn.rule.gate_b[0, 0] = headwise.rule.gate_b[0, 0]
    return cfg, model


@torch.no_grad()
def kv_bias_construction(c: float, seq_len: int = 16, d_model: int = 16, n_layers: int = 1,
                         n_heads: int = 1, dtype: torch.dtype = torch.float64
                         ) -> tuple[RunConfig, AttentionStack]:
    """Weights for a learned key and value: the learned key is a sink logit that only the
    non-trigger rows see, and the learned value is 0.

    Queries: the BOS and bias flags map to c e_0, the trigger flag to c e_1. The learned key is
    e_0, so it scores c at every non-trigger row and 0 at the trigger row. Keys: the trigger and
    bias flags map to e_1. So a non-trigger row scores its i + 1 keys at 0 and each gets
    1 / (e^c + i + 1); the trigger row scores the j content keys at c and BOS and the learned key
    at 0, so each content key gets e^c / (2 + j e^c). These are ``softmax1_construction``'s
    weights (the learned key is softmax_1's zero logit, raised to c where softmax_1's scores are
    lowered by c), so the L-infinity error bound is the same, (L - 1) / (e^c + L) for c >= 0
    (``error_bound``). Values: W_V W_O = I without the BOS coordinate.
    """
    cfg = _config("kv_bias", seq_len, d_model, n_layers, n_heads)
    model, attn = _stack(cfg, dtype)
    last = d_model - 1
    attn.w_q[0, 0, BOS, 0] = c
    attn.w_q[0, 0, last, 0] = c
    attn.rule.key[0, 0, 0] = 1.0  # the learned value stays 0
    _trigger_reads_content(attn, d_model, c)
    return cfg, model


@torch.no_grad()
def sigmoid_one_position(j: int, c: float, seq_len: int = 16, d_model: int = 16,
                         dtype: torch.dtype = torch.float64) -> tuple[RunConfig, AttentionStack]:
    """1x1 sigmoid weights that solve the task to any error *for one trigger position j*: the
    control of ``SIGMOID_1X1_ARGUMENT``, whose floor comes from the position varying.

    Queries: the BOS and bias flags map to -c e_0, the trigger flag to e_1. Keys: every flag
    maps to e_0, the trigger and bias flags also to log(j + 1) e_1. The trigger row at j scores
    each content key at log(j + 1), so it gets sigmoid(0) = 1/2, and BOS at 0; with W_V W_O =
    (2 / j) I without the BOS coordinate it outputs the mean exactly. Every non-trigger row
    scores its keys at -c and outputs less than (2 / j) e^{-c} in each coordinate. With the
    trigger anywhere else the content weight is not 1/2 and the trigger row errs.
    """
    cfg = _config("sigmoid", seq_len, d_model, 1, 1)
    model, attn = _stack(cfg, dtype)
    last = d_model - 1
    attn.w_q[0, 0, BOS, 0] = -c
    attn.w_q[0, 0, last, 0] = -c
    attn.w_q[0, 0, TRIGGER, 1] = 1.0
    for flag in (BOS, TRIGGER, last):
        attn.w_k[0, 0, flag, 0] = 1.0
    attn.w_k[0, 0, TRIGGER, 1] = math.log(j + 1)
    attn.w_k[0, 0, last, 1] = math.log(j + 1)
    _values_without_bos(attn, d_model, scale=2 / j)
    return cfg, model


@torch.no_grad()
def clipped_one_position(j: int, c: float = 8.0, seq_len: int = 16, d_model: int = 16,
                         dtype: torch.dtype = torch.float64) -> tuple[RunConfig, AttentionStack]:
    """1x1 clipped-softmax weights (defaults zeta = 1, gamma = -0.03) that solve the task
    exactly *for one trigger position j*: the control of ``CLIPPED_1X1_ARGUMENT``, whose floor
    comes from the position varying.

    Queries: the BOS and bias flags map to c e_0, the trigger flag to c e_1. Keys: the BOS flag
    maps to e_0, the trigger and bias flags to e_1. A non-trigger row i scores BOS at c and its
    other keys at 0, so each of those gets the softmax weight 1 / (e^c + i) <= e^{-c}, which
    clips to exactly 0 once e^c >= 1.03 / 0.03 (c >= 3.6): with BOS's value 0 the row is exactly
    zero, a sink with nothing left over. The trigger row scores its j content keys at c and BOS
    at 0, so each content key gets A = 1.03 / (j + e^{-c}) - 0.03 (BOS clips to 0); with
    W_V W_O = I / (j A) without the BOS coordinate the row is the mean. With the trigger
    anywhere else the content weight is not 1 / (j A) and the trigger row errs.
    """
    if math.exp(-c) > CLIP_ZERO:
        raise ConfigError(f"c={c!r} is not allowed: the non-trigger rows clip to zero only from "
                          f"c = {-math.log(CLIP_ZERO):.3f} on.")
    cfg = _config("clipped_softmax", seq_len, d_model, 1, 1)
    model, attn = _stack(cfg, dtype)
    last = d_model - 1
    attn.w_q[0, 0, BOS, 0] = c
    attn.w_q[0, 0, last, 0] = c
    attn.w_q[0, 0, TRIGGER, 1] = c
    attn.w_k[0, 0, BOS, 0] = 1.0
    attn.w_k[0, 0, TRIGGER, 1] = 1.0
    attn.w_k[0, 0, last, 1] = 1.0
    weight = (CLIP_ZETA - CLIP_GAMMA) / (j + math.exp(-c)) + CLIP_GAMMA
    _values_without_bos(attn, d_model, scale=1 / (j * weight))
    return cfg, model


def clipped_two_layer_scales(zeta: float = CLIP_ZETA, gamma: float = CLIP_GAMMA
                             ) -> tuple[float, float, float]:
    """(nu, r, mu) with (1 + nu A_r(j)) (1 + mu A_0(j)) = 1 + 1/j at every j, where
    A_r(j) = (zeta - gamma) / (j + r) + gamma is a clipped weight before clipping.

    Writing 1 + mu A_0(j) = a + b/j and 1 + nu A_r(j) = c + e/(j + r), the identity is
    (a j + b)(c (j + r) + e) = (j + 1)(j + r), three equations in j^2, j, 1: a c = 1,
    b (1/a - 1) = 1 and r = b^2 / (b - a), with b = kappa (1 - a), kappa = (zeta - gamma) / -gamma.
    So kappa (1 - a)^2 = a: the smaller root gives r > 0 (the larger one r < -1); at the defaults
    nu = -6.19, r = 6.38, mu = 5.22.
    """
    kappa = (zeta - gamma) / -gamma
    a = (2 * kappa + 1 - math.sqrt(4 * kappa + 1)) / (2 * kappa)
    b = kappa * (1 - a)
    return (1 / a - 1) / gamma, b * b / (b - a), (a - 1) / gamma


@torch.no_grad()
def clipped_two_layer_construction(c: float, seq_len: int = 16, d_model: int = 16,
                                   n_layers: int = 2, n_heads: int = 2,
                                   dtype: torch.dtype = torch.float64
                                   ) -> tuple[RunConfig, AttentionStack]:
    """Clipped-softmax weights (defaults) in head 1 of layers 1 and 2 of a residual stack, every
    other head zero: two sinks that leave nothing over, and two running sums whose scales
    multiply to 1 + 1/j (``clipped_two_layer_scales``: nu, r, mu).

    Both heads sink on BOS at non-trigger rows: queries c e_0 from the BOS and bias flags against
    BOS's key e_0, so every other key's softmax weight is at most e^{-c} and clips to exactly 0
    (c >= log(1.03 / 0.03)), and BOS's value is 0: those rows are exactly x. Values:
    W_V W_O = nu I (layer 1) and mu I (layer 2) without the BOS coordinate.

    Layer 1, trigger row j: the trigger flag's query log(r) e_0 scores BOS at log r and the
    content keys at 0, so each gets A_r(j) = 1.03 / (j + r) - 0.03 and the row adds
    C1(j) X_j, X_j = x_1 + ... + x_j, C1 = nu A_r(j) (in (-0.58, 0) for j <= 15). Layer 2,
    trigger row: its stream is x_j + C1 X_j, whose trigger coordinate 1 + C1 > 0 maps to the
    query -c e_0 and whose bias coordinate (j - 1) C1 <= 0 to c e_0, so BOS scores
    -c (1 - (j - 2) C1) <= -c and every content key 0 (keys read only the BOS coordinate, which
    no stream but BOS's has). Each content key gets 1.03 / (j + rho) - 0.03,
    rho = e^{-c (1 - (j - 2) C1)}, over streams that sum to (1 + C1) X_j, so the row ends at
    x_j + ((1 + C1)(1 + mu (1.03 / (j + rho) - 0.03)) - 1) X_j: the target at rho = 0. The
    L-infinity error is max_j (1 + C1) mu 1.03 rho / (j + rho) (``error_bound``), about
    1.14 e^{-c}, from j = 2.
    """
    nu, r, mu = clipped_two_layer_scales()
    kappa = (CLIP_ZETA - CLIP_GAMMA) / -CLIP_GAMMA
    if n_layers < 2 or math.exp(-c) > CLIP_ZERO or seq_len - 1 + r >= kappa:
        raise ConfigError(f"n_layers={n_layers}, c={c!r}, seq_len={seq_len} are not allowed: "
                          f"the construction needs two layers, c >= {-math.log(CLIP_ZERO):.3f} "
                          f"and seq_len <= {math.ceil(kappa - r)} (every layer-1 weight above "
                          "the clip).")
    cfg = _config("clipped_softmax", seq_len, d_model, n_layers, n_heads)
    model, first = _stack(cfg, dtype)
    second = model.blocks[1].attn
    last = d_model - 1
    for attn in (first, second):
        attn.w_q[0, 0, BOS, 0] = c
        attn.w_q[0, 0, last, 0] = c
        attn.w_k[0, 0, BOS, 0] = 1.0
    first.w_q[0, 0, TRIGGER, 0] = math.log(r)
    second.w_q[0, 0, TRIGGER, 0] = -c
    _values_without_bos(first, d_model, scale=nu)
    _values_without_bos(second, d_model, scale=mu)
    return cfg, model


def _clipped_two_layer_bound(c: float, seq_len: int) -> float:
    """``clipped_two_layer_construction``'s L-infinity error at strength c: its docstring's
    max over trigger positions j of (1 + C1(j)) mu 1.03 rho(j) / (j + rho(j))."""
    nu, r, mu = clipped_two_layer_scales()
    g = CLIP_ZETA - CLIP_GAMMA
    worst = 0.0
    for j in range(2, seq_len):
        c1 = nu * (g / (j + r) + CLIP_GAMMA)
        rho = math.exp(-c * (1 - (j - 2) * c1))
        worst = max(worst, (1 + c1) * mu * g * rho / (j + rho))
    return worst


# The constructions to any error, by name: (c, seq_len, d_model, n_layers, n_heads, dtype) ->
# (config, model). The exact ones are ``zero_row_construction`` for relu and softpick.
BUILDERS: dict[str, Callable[..., tuple[RunConfig, AttentionStack]]] = {
    "softmax_construction": softmax_construction,
    "softmax1_construction": softmax1_construction,
    "sink_logit_construction": sink_logit_construction,
    "gated_construction": gated_construction,
    "gated_dim_construction": gated_dim_construction,
    "kv_bias_construction": kv_bias_construction,
    "clipped_two_layer_construction": clipped_two_layer_construction,
}


def error_bound(rule: str, c: float, seq_len: int) -> float:
    """The stated L-infinity error of ``rule``'s "to any error" construction at strength c for
    sequences of ``seq_len`` tokens (its docstring derives it); it falls like e^{-c}."""
    n = seq_len
    bounds = {"softmax": (n - 1) / (math.exp(c) + n - 1),
              "softmax1": (n - 1) / (math.exp(c) + n),
              "sink_logit": (n - 1) / (math.exp(c) + n),
              "gated": 1.5 / (1 + math.exp(c)),
              "gated_dim": 1.5 / (1 + math.exp(c)),
              "kv_bias": (n - 1) / (math.exp(c) + n),
              "clipped_softmax": _clipped_two_layer_bound(c, n)}
    if rule not in bounds:
        raise ConfigError(f"no error bound for rule {rule!r}: the rules with a construction to "
                          f"any error are {', '.join(bounds)}.")
    return bounds[rule]


# --------------------------------------------------------------------- the sigmoid argument

SIGMOID_1X1_ARGUMENT = """\
Sigmoid attention with bias -log n (A_ik = sigmoid(S_ik - log(i + 1))), one layer, one head, the
plain target: no weights reach an L-infinity error below a floor F > 0 on the training
distribution; F = 7/705 = 0.00993 for the paper's task (L = 16, triggers at 2..15), twice the
stop rule's tolerance 5e-3.

Sequences. Fix a content coordinate m. For a trigger position j and a sign s = +1 or -1, let
every non-BOS token but the trigger carry content s e_m (so z_s = (0, 0, s e_m, 1)) and the
trigger carry content 0 (t = (0, 1, 0, 0)). These lie in the support of the training inputs.

The trigger row. Write M = W_V W_O and Q = W_Q W_K^T. At row j the query is t and n = j + 1 keys
are visible: BOS (score t Q e_0^T), the j - 1 tokens z_s (all with the same score t Q z_s^T) and
the trigger itself (score t Q t^T). With a_s = exp(-t Q z_s^T) > 0 the weight of every content
key is 1 / (1 + (j + 1) a_s), and the row's output is
    (j - 1) / (1 + (j + 1) a_s) z_s M  +  w_t(j) t M  +  w_0(j) e_0 M,
where w_t and w_0 depend only on t and BOS, so they are the same for s = +1 and s = -1. The
target's coordinate m is s (j - 1) / j. Subtracting the two signs, the last two terms cancel:
if both sequences err by at most E, then with P_s = (z_s M)_m and r_s = 1 / a_s,
    (j - 1) |h(j) - 1/j| <= E,   h(j) = alpha / (j + 1 + r_+) + beta / (j + 1 + r_-),
alpha = P_+ r_+ / 2, beta = -P_- r_- / 2: the same alpha, beta, r_+, r_- for every j, because
no score can see j (no positional encoding) except through the -log n bias.

The pole. j h(j) - 1 = N(j) / D(j) with D(j) = (j + 1 + r_+)(j + 1 + r_-) and N a polynomial
of degree at most 2 in j, N(0) = -D(0). So |N(j)| <= E j D(j) / (j - 1) at each trigger
position. Three positions p < q < r pin a quadratic: N(0) = sum_k l_k N(k) with the Lagrange
weights l_p = q r / ((p - q)(p - r)) and so on (exact for degree <= 2), and
D(k) / D(0) <= (k + 1)^2 for r_+, r_- >= 0. Hence
    1 = |N(0)| / D(0) <= E sum_k |l_k| k (k + 1)^2 / (k - 1),
i.e. E >= F = 1 / min over triples of sum_k |l_k| k (k + 1)^2 / (k - 1). For triggers at 2..15
the best triple is (2, 5, 15), l = (25/13, -1, 1/13), and F = 7/705. Some sequence among the
six (two signs at three positions) errs by at least F, whatever the weights; by continuity
sequences of positive probability near them err almost as much. The bound is sharp for this
family of functions h (poles at -1 - r, r -> 0), so a better floor needs other sequences.

What it does not say: it does not hold with a fixed bias (``attention_args.bias``: then the
weights cannot see j at all, the position-free argument), nor with two layers, where a first
layer can write position-dependent features into the residual stream. One trigger position alone
is solvable to any error (``sigmoid_one_position``); the floor is the price of every position at
once.
"""


@dataclass(frozen=True)
class SigmoidFloor:
    """``SIGMOID_1X1_ARGUMENT``'s numbers for one trigger range: the three trigger ``nodes``,
    their Lagrange weights at 0 (``weights``, exact), and the floor (exact and as a float)."""

    nodes: tuple[int, ...]
    weights: tuple[Fraction, ...]
    exact: Fraction

    @property
    def floor(self) -> float:
        return float(self.exact)


def _lagrange_at_zero(nodes: tuple[int, ...]) -> tuple[Fraction, ...]:
    """Weights l_k with sum_k l_k p(k) = p(0) for every polynomial p of degree < len(nodes)."""
    return tuple(math.prod(Fraction(-q, k - q) for q in nodes if q != k) for k in nodes)


def _node_cost(k: int) -> Fraction:
    """How much the bound's sum pays for a node at trigger position k: k (k + 1)^2 / (k - 1)."""
    return Fraction(k * (k + 1) ** 2, k - 1)


def sigmoid_floor(task: TaskConfig) -> SigmoidFloor | None:
    """The 1x1 sigmoid floor over ``task``'s training trigger positions (from 2 on: a trigger at
    1 has no content key before it), or None when fewer than three positions remain.

    The minimum over triples is that of the linear programme min sum |l_k| cost_k subject to
    sum l_k k^e = 0^e (e = 0, 1, 2), whose optimum sits on three nodes.
    """
    lo = max(task.train_trigger_min, 2)
    hi = task.train_trigger_max if task.train_trigger_max is not None else task.seq_len - 1
    positions = range(lo, hi + 1)
    if len(positions) < 3:
        return None
    cost = {k: float(_node_cost(k)) for k in positions}

    def total(nodes: tuple[int, ...]) -> float:  # float Lagrange weights: fast for long ranges
        return sum(abs(math.prod(q / (q - k) for q in nodes if q != k)) * cost[k] for k in nodes)

    best = min(itertools.combinations(positions, 3), key=total)
    weights = _lagrange_at_zero(best)
    exact = 1 / sum(abs(w) * _node_cost(k) for w, k in zip(weights, best))
    return SigmoidFloor(nodes=best, weights=weights, exact=exact)


def floor_sequences(task: TaskConfig, nodes: tuple[int, ...], coordinate: int = 0,
                    dtype: torch.dtype = torch.float64) -> Batch:
    """The argument's sequences, two per trigger position in ``nodes`` (signs +1 then -1): every
    non-BOS token but the trigger has content +-1 in content coordinate ``coordinate`` and 0
    elsewhere, the trigger has content 0. Plain targets (the 1x1 setting)."""
    n_content = task.d_model - 3
    trigger = torch.tensor([j for j in nodes for _ in (1, -1)])
    sign = torch.tensor([s for _ in nodes for s in (1.0, -1.0)], dtype=dtype)
    content = torch.zeros(len(trigger), task.seq_len, n_content, dtype=dtype)
    content[:, :, coordinate] = sign[:, None]
    content[torch.arange(len(trigger)), trigger] = 0.0
    x = encode(content, trigger)
    return Batch(x=x, y=targets(x, trigger, residual=False), trigger=trigger)


@torch.no_grad()
def pair_h(model: AttentionStack, task: TaskConfig, nodes: tuple[int, ...],
           coordinate: int = 0) -> Tensor:
    """h(j) of ``SIGMOID_1X1_ARGUMENT`` for each member of a 1x1 sigmoid ``model`` and each
    trigger position in ``nodes``, from its weights alone: (members, len(nodes)).

    2 (j - 1) h(j) is the difference, in content coordinate ``coordinate``, between the model's
    trigger-row outputs on the two ``floor_sequences`` with the trigger at j (signs + and -).
    """
    attn = model.blocks[0].attn
    m, last = CONTENT_START + coordinate, task.d_model - 1
    q = attn.w_q[:, 0] @ attn.w_k[:, 0].transpose(-1, -2)  # Q = W_Q W_K^T, (E, d, d)
    mv = attn.w_v[:, 0] @ attn.w_o[:, 0]  # M = W_V W_O, (E, d, d)
    columns = []
    for j in nodes:
        h = torch.zeros(q.shape[0], dtype=q.dtype)
        for s in (1.0, -1.0):
            score = q[:, TRIGGER, last] + s * q[:, TRIGGER, m]  # t Q z_s^T, t the trigger e_1
            weight = torch.sigmoid(score - math.log(j + 1))  # each content key's weight
            h = h + s * weight * (mv[:, last, m] + s * mv[:, m, m]) / 2  # P_s = (z_s M)_m
        columns.append(h)
    return torch.stack(columns, dim=1)


def pair_bound(model: AttentionStack, task: TaskConfig, nodes: tuple[int, ...],
               coordinate: int = 0) -> Tensor:
    """max over ``nodes`` of (j - 1) |h(j) - 1/j| per member (``pair_h``), (members,): a lower
    bound on the member's L-infinity error over ``floor_sequences`` (the argument's first step)
    and, by its second, at least ``sigmoid_floor``."""
    j = torch.tensor(nodes, dtype=model.blocks[0].attn.w_q.dtype)
    return ((j - 1) * (pair_h(model, task, nodes, coordinate) - 1 / j).abs()).amax(dim=1)


# ------------------------------------------------------------- the clipped-softmax argument

CLIPPED_1X1_ARGUMENT = """\
Clipped softmax at its defaults (A_ik = clip(1.03 p_ik - 0.03, 0, 1), p_i = softmax(S_i)), one
layer, one head, the plain target, d_model >= 5: no weights reach an L-infinity error below a
floor F > 0 on the training distribution; F = 0.1033 for the paper's task (L = 16, triggers at
2..15), twenty times the stop rule's tolerance 5e-3.

Sequences. Write M = W_V W_O, Q = W_Q W_K^T and g for the trigger flag's row of Q restricted to
the content coordinates. Take two content coordinates m, n and the direction w in their plane
with g . w = 0 and max(|w_m|, |w_n|) = 1: w = e_m if g_m = g_n = 0, else
(g_n e_m - g_m e_n) / max(|g_m|, |g_n|); name the coordinates so that |w_m| = 1. For a trigger
position j and a sign s = +1 or -1, let every non-BOS token but the trigger carry content s w
(z_s = (0, 0, s w, 1)) and the trigger carry content 0 (t = e_1). These lie in the support of
the training inputs.

The trigger row. The query is t. BOS scores t Q e_0^T = Q_10, each z_s scores
t Q z_s^T = Q_1,d-1 + s g . w = Q_1,d-1 for both signs, the trigger Q_11: no score depends on
j (no positional encoding) or on s. So each of the j - 1 content keys has the softmax weight
p(j) = 1 / (j + r), r = e^(Q_10 - Q_1,d-1) + e^(Q_11 - Q_1,d-1) - 1 > -1, and the clipped
weight A(j) = max(0, 1.03 / (j + r) - 0.03) (never above 1, as j + r > 1); BOS and the trigger
have weights that are also the same for both signs. Subtracting the two signs' outputs at row j,
BOS's and the trigger's terms cancel: out_+ - out_- = 2 (j - 1) A(j) w M, while the targets
differ by 2 ((j - 1) / j) w in the content coordinates. In coordinate m, with
mu = (w M)_m / w_m: if both sequences err by at most E, then
    (j - 1) |mu A(j) - 1/j| <= E    at every trigger position j,
with the same mu and r at every j.

The floor. So E >= F = inf over mu and r > -1 of max_j (j - 1) |mu A_r(j) - 1/j|. A mu <= 0
errs by (j - 1)/j >= 1/2 at every j; an r >= 1.03/0.03 - j_max makes A(j_max) = 0 and errs by
(j_max - 1)/j_max. On the rest, -1 < r < 1.03/0.03 - j_max, each A_r(j) falls as r grows, so
for r in an interval [r0, r1] it lies in [lo_j, hi_j] = [A_r1(j), A_r0(j)], and an error of at
most E at every j needs a mu > 0 with mu hi_j >= 1/j - E/(j - 1) and
mu lo_j <= 1/j + E/(j - 1) for every j. Every pair p, q then has
lo_q (1/p - E/(p - 1)) <= hi_p (1/q + E/(q - 1)), that is
    E >= (lo_q/p - hi_p/q) / (lo_q/(p - 1) + hi_p/(q - 1))    (lo_q > 0),
a lower bound on E for every r in the interval. ``clipped_floor`` covers the range with
intervals, halving those whose bound is loose, and F is the smallest bound (in float64):
F = 0.1033 (0.10336 rounded down), within 0.1% of the best fit it finds (r = 2.72, mu = 2.11,
which errs by 0.1034 on these sequences). Some sequence of the argument errs by at least F
whatever the weights; by continuity sequences of positive probability near them err almost as
much.

Why. With gamma = 0 (plain softmax) A_r(j) = 1/(j + r), and r -> 0, mu = 1 fits every j: the
sink. The offset -0.03 per key makes the content keys' total j A_r(j) = 1.03 j/(j + r) - 0.03 j
strictly concave (r > 0), strictly convex (r < 0) or strictly falling (r = 0) in j: it takes
each value at most twice, so no scale mu makes mu A_r(j) = 1/j at three positions.

What it does not say: that F is the best error one head can reach (the sequences leave the
trigger's own content at 0, and the best weights found err by more on the training inputs);
nor anything for two
layers, which reach any error (``clipped_two_layer_construction``: the second layer rescales the
first's running sum, and the two scales multiply to 1 + 1/j). The non-trigger rows are no
obstacle: a BOS sink with e^c >= 1.03/0.03 clips every other weight to exactly 0, and one
trigger position alone is solved exactly (``clipped_one_position``); the floor is the price of
every position at once.
"""


def clipped_weight(r: Any, j: Any, zeta: float = CLIP_ZETA, gamma: float = CLIP_GAMMA) -> Any:
    """A_r(j) = clip((zeta - gamma) / (j + r) + gamma, 0, 1): the clipped weight of each content
    key at the trigger row of ``CLIPPED_1X1_ARGUMENT``'s sequences (numpy arrays broadcast)."""
    return np.clip((zeta - gamma) / (j + r) + gamma, 0.0, 1.0)


def _pair_bounds(lo: np.ndarray, hi: np.ndarray, j: np.ndarray) -> np.ndarray:
    """For each row of weight ranges lo <= A(j) <= hi (rows, positions): the largest over pairs
    p, q (lo_q > 0) of (lo_q/p - hi_p/q) / (lo_q/(p - 1) + hi_p/(q - 1)), a lower bound on
    min over mu > 0 of max_j (j - 1) |mu A(j) - 1/j| (rows,); exact where lo = hi."""
    lo_q, hi_p = lo[:, None, :], hi[:, :, None]  # q on the last axis, p on the middle one
    p, q = j[None, :, None], j[None, None, :]
    num = lo_q / p - hi_p / q
    den = lo_q / (p - 1) + hi_p / (q - 1)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(lo_q > 0, num / den, -np.inf)
    return ratio.max(axis=(1, 2))


def clipped_fit(positions: tuple[int, ...], r: float, zeta: float = CLIP_ZETA,
                gamma: float = CLIP_GAMMA) -> tuple[float, float]:
    """min over mu of max_j (j - 1) |mu A_r(j) - 1/j| over the trigger ``positions``, and a mu
    that attains it: the smallest error ``CLIPPED_1X1_ARGUMENT``'s sequences allow at a score
    gap r (``clipped_weight``). With gamma = 0 (plain softmax) and r = 0 it is 0."""
    j = np.asarray(positions, dtype=float)
    a = clipped_weight(r, j, zeta, gamma)
    error = min(float(_pair_bounds(a[None], a[None], j)[0]), float(((j - 1) / j).max()))
    seen = a > 0
    if not seen.any():
        return error, 0.0
    mu = float(((1 / j[seen] - error / (j[seen] - 1)) / a[seen]).max())  # the lowest mu that fits
    return error, max(mu, 0.0)


@dataclass(frozen=True)
class ClippedFloor:
    """``CLIPPED_1X1_ARGUMENT``'s numbers for one trigger range: the ``positions``, the certified
    ``floor`` (float64), and the best fit found, its score gap ``r``, scale ``mu`` and error
    ``attained`` (the floor is at most that, and within ``rel`` of it)."""

    positions: tuple[int, ...]
    floor: float
    r: float
    mu: float
    attained: float
    n_intervals: int


def clipped_floor(task: TaskConfig, rel: float = 1e-3, zeta: float = CLIP_ZETA,
                  gamma: float = CLIP_GAMMA) -> ClippedFloor | None:
    """The 1x1 clipped-softmax floor over ``task``'s training trigger positions (from 2 on), or
    None when fewer than three positions remain, when ``d_model`` < 5 (the argument needs two
    content coordinates) or when gamma >= 0 (no offset to argue from).

    The score gaps -1 < r < (zeta - gamma) / -gamma - j_max are covered by intervals; each gets
    the pair bound of the argument (``_pair_bounds`` on the weights at its two ends), and every
    interval whose bound is below (1 - ``rel``) times the best fit found at the ends so far is
    halved, until none is. The floor is the smallest interval bound, or 1/2 or
    (j_max - 1)/j_max if smaller (mu <= 0, and r beyond the range).
    """
    lo = max(task.train_trigger_min, 2)
    hi = task.train_trigger_max if task.train_trigger_max is not None else task.seq_len - 1
    positions = tuple(range(lo, hi + 1))
    if len(positions) < 3 or task.d_model < 5 or gamma >= 0:
        return None
    j = np.asarray(positions, dtype=float)
    beyond = (zeta - gamma) / -gamma - j[-1]  # from here on A(j_max) = 0
    edges = np.linspace(-1.0, beyond, 129)
    for _ in range(64):
        at = clipped_weight(edges[:, None], j, zeta, gamma)  # (edges, positions), falling in r
        fits = _pair_bounds(at, at, j)
        bounds = _pair_bounds(at[1:], at[:-1], j)  # lo at an interval's right end, hi at its left
        loose = bounds < fits.min() * (1 - rel)
        if not loose.any():
            break
        edges = np.sort(np.r_[edges, (edges[:-1][loose] + edges[1:][loose]) / 2])
    else:
        raise RuntimeError("clipped_floor did not settle in 64 halvings")
    best = int(fits.argmin())
    attained, mu = clipped_fit(positions, float(edges[best]), zeta, gamma)
    floor = min(float(bounds.min()), 0.5, (j[-1] - 1) / j[-1])
    return ClippedFloor(positions=positions, floor=floor, r=float(edges[best]), mu=mu,
                        attained=attained, n_intervals=len(edges) - 1)


def clipped_direction(model: AttentionStack, task: TaskConfig) -> tuple[Tensor, Tensor]:
    """The argument's content direction w for each member of a 1x1 ``model``: in the plane of
    content coordinates 0 and 1, orthogonal to g (the trigger flag's row of W_Q W_K^T on the
    content coordinates), with largest entry 1 in size. Returns w (members, d - 3) and the
    content coordinate m where |w_m| = 1 (members,)."""
    attn = model.blocks[0].attn
    q = attn.w_q[:, 0] @ attn.w_k[:, 0].transpose(-1, -2)  # (E, d, d)
    g = q[:, TRIGGER, CONTENT_START:task.d_model - 1]  # (E, d - 3)
    gm, gn = g[:, 0], g[:, 1]
    size = torch.maximum(gm.abs(), gn.abs())
    flat = size == 0  # the trigger's query sees neither coordinate: w = e_0 will do
    scale = torch.where(flat, torch.ones_like(size), size)
    w = torch.zeros_like(g)
    w[:, 0] = torch.where(flat, torch.ones_like(gm), gn / scale)
    w[:, 1] = torch.where(flat, torch.zeros_like(gn), -gm / scale)
    m = (w[:, 1].abs() > w[:, 0].abs()).long()  # coordinate 0 unless |g_m| > |g_n|
    return w, m


@dataclass(frozen=True)
class ClippedSequences:
    """``CLIPPED_1X1_ARGUMENT``'s sequences for each member of a model: inputs and plain targets
    (members, 2 * positions, L, d), the trigger positions and signs (2 * positions,), and the
    direction w (members, d - 3) with its coordinate m (members,) (``clipped_direction``)."""

    x: Tensor
    y: Tensor
    trigger: Tensor
    sign: Tensor
    w: Tensor
    m: Tensor


@torch.no_grad()
def clipped_sequences(model: AttentionStack, task: TaskConfig,
                      positions: tuple[int, ...]) -> ClippedSequences:
    """Two sequences per trigger position (signs +1 then -1) for each member of a 1x1
    ``model``: every non-BOS token but the trigger has content s w, the trigger content 0."""
    w, m = clipped_direction(model, task)
    n = 2 * len(positions)
    trigger = torch.tensor([j for j in positions for _ in (1, -1)])
    sign = torch.tensor([s for _ in positions for s in (1.0, -1.0)], dtype=w.dtype)
    content = (sign[None, :, None, None] * w[:, None, None, :]).expand(-1, -1, task.seq_len, -1)
    content = content.clone()
    content[:, torch.arange(n), trigger] = 0.0
    flat = content.reshape(-1, task.seq_len, w.shape[1])  # (E * n, L, d - 3)
    flat_trigger = trigger.repeat(len(w))
    x = encode(flat, flat_trigger)
    y = targets(x, flat_trigger, residual=False)
    shape = (len(w), n, task.seq_len, task.d_model)
    return ClippedSequences(x=x.view(shape), y=y.view(shape), trigger=trigger, sign=sign, w=w,
                            m=m)


def clipped_content_weight(model: AttentionStack, task: TaskConfig,
                           positions: tuple[int, ...]) -> Tensor:
    """A(j) of ``CLIPPED_1X1_ARGUMENT`` for each member of a 1x1 clipped-softmax ``model`` (at
    ``CLIP_ZETA``, ``CLIP_GAMMA``): the clipped weight of each content key at the trigger row
    when the content keys score as content 0 (the trigger flag's query against the bias flag)
    and the trigger carries content 0, (members, positions)."""
    attn = model.blocks[0].attn
    q = attn.w_q[:, 0] @ attn.w_k[:, 0].transpose(-1, -2)  # Q = W_Q W_K^T, (E, d, d)
    bos, content = q[:, TRIGGER, BOS], q[:, TRIGGER, task.d_model - 1]
    trig = q[:, TRIGGER, TRIGGER]
    j = torch.tensor(positions, dtype=q.dtype)
    logits = torch.stack([bos[:, None].expand(-1, len(j)),
                          content[:, None] + torch.log(j - 1),
                          trig[:, None].expand(-1, len(j))])  # BOS, the j - 1 keys, trigger
    p = torch.exp(content[:, None] - torch.logsumexp(logits, dim=0))  # each content key's
    return ((CLIP_ZETA - CLIP_GAMMA) * p + CLIP_GAMMA).clamp(0.0, 1.0)


def clipped_pair(model: AttentionStack, task: TaskConfig, positions: tuple[int, ...]) -> Tensor:
    """mu A(j) of ``CLIPPED_1X1_ARGUMENT`` for each member of a 1x1 clipped-softmax ``model``
    and each trigger position, from its weights alone: (members, positions).

    2 (j - 1) w_m mu A(j) is the difference, in content coordinate m, between the model's
    trigger-row outputs on the two ``clipped_sequences`` with the trigger at j.
    """
    attn = model.blocks[0].attn
    mv = attn.w_v[:, 0] @ attn.w_o[:, 0]  # M = W_V W_O, (E, d, d)
    w, m = clipped_direction(model, task)
    members = torch.arange(len(w))
    wm = (w[:, None, :] @ mv[:, CONTENT_START:task.d_model - 1])[:, 0]  # w M, (E, d)
    mu = wm[members, CONTENT_START + m] / w[members, m]
    return mu[:, None] * clipped_content_weight(model, task, positions)


def clipped_pair_bound(model: AttentionStack, task: TaskConfig,
                       positions: tuple[int, ...]) -> Tensor:
    """max over ``positions`` of (j - 1) |mu A(j) - 1/j| per member (``clipped_pair``),
    (members,): a lower bound on the member's L-infinity error over its ``clipped_sequences``
    (the argument's first step) and, by its second, at least ``clipped_floor``."""
    j = torch.tensor(positions, dtype=model.blocks[0].attn.w_q.dtype)
    return ((j - 1) * (clipped_pair(model, task, positions) - 1 / j).abs()).amax(dim=1)


@torch.no_grad()
def check_clipped_floor(seq_len: int = 16, d_model: int = 16, c: float = 8.0,
                        n_sequences: int = 64, seed: int = 0) -> dict[str, Any]:
    """``CLIPPED_1X1_ARGUMENT``'s numbers for a task size, beside its controls on the argument's
    own sequences (``clipped_sequences``): the softmax sink construction at strength 3c errs far
    below the floor on them (plain softmax has no offset), and ``clipped_one_position(j, c)``
    errs at most float rounding on ``n_sequences`` random sequences with the trigger at j
    (``error_at_j``), outputs exactly 0 at their non-trigger rows (``nontrigger_max``), and errs
    by at least the floor on the argument's sequences over every position (``error_all``)."""
    task = construction_config("clipped_softmax", seq_len, d_model).task
    found = clipped_floor(task)
    if found is None:
        raise ConfigError(f"seq_len={seq_len}, d_model={d_model} leave fewer than three trigger "
                          "positions from 2 on or fewer than two content coordinates: the "
                          "clipped argument needs both.")
    positions = found.positions

    def argument_error(model: AttentionStack) -> float:
        seqs = clipped_sequences(model, task, positions)
        return (model(seqs.x).out - seqs.y).abs().max().item()

    _, softmax = softmax_construction(3 * c, seq_len, d_model)
    generator = torch.Generator().manual_seed(seed)
    one_position = []
    for j in (positions[0], positions[len(positions) // 2], positions[-1]):
        content = torch.rand(n_sequences, seq_len, d_model - 3, generator=generator,
                             dtype=torch.float64) * 2 - 1
        trigger = torch.full((n_sequences,), j)
        x = encode(content, trigger)
        _, model = clipped_one_position(j, c, seq_len, d_model)
        out = model(x).out[0]
        rows = torch.arange(seq_len) != j
        one_position.append({
            "j": j, "error_at_j": (out[:, j] - targets(x, trigger, residual=False)[:, j])
            .abs().max().item(),
            "nontrigger_max": out[:, rows].abs().max().item(),
            "error_all": argument_error(model)})
    return {"seq_len": seq_len, "d_model": d_model, "positions": list(positions),
            "floor": found.floor, "attained": found.attained, "r": found.r, "mu": found.mu,
            "n_intervals": found.n_intervals, "c": c, "softmax_error": argument_error(softmax),
            "one_position": one_position}


# ---------------------------------------------------------------------------------- table

# Why the constructions to any error stop short of exact: at 1x1 a proof, at 2x2 an open point.
_NOT_EXACT = {
    "1x1": "never exact: every weight is positive, so rows that output exactly 0 whatever the "
           "content put every content token's value on BOS's line, and the trigger row's output "
           "then lies in a plane that cannot hold every mean",
    "2x2": "whether two heads that cancel each other can make it exact is not settled here",
}


def _table() -> dict[tuple[str, str], Verdict]:
    can_any = {
        "softmax": ("softmax_construction",
                    "non-trigger rows park on BOS, whose value is 0 (the paper's sink)"),
        "softmax1": ("softmax1_construction",
                     "non-trigger rows score every key at -c and park on the implicit zero logit"),
        "sink_logit": ("sink_logit_construction",
                       "the learned logit c outweighs the non-trigger rows' zero scores"),
        "gated": ("gated_construction",
                  "the gate reads the trigger flag and closes at every other row"),
    }
    table: dict[tuple[str, str], Verdict] = {}
    for config in CONFIGS:
        where = "in layer 1, head 1 of a residual stack, every other head zero" \
            if config == "2x2" else "one head"
        for rule, (name, how) in can_any.items():
            table[config, rule] = Verdict(
                "can", ANY_ERROR, name, f"{how} ({where}); {_NOT_EXACT[config]}.")
        for rule in ("relu", "softpick"):
            table[config, rule] = Verdict(
                "can", EXACT, "zero_row_construction",
                f"the trigger flag's query meets keys 1..j only, so every non-trigger row is "
                f"exactly zero and the trigger row weighs each token 1/j ({where}).")
    for rule in ("relu_len", "relu_raw"):
        table["1x1", rule] = Verdict("cannot", "position_free",
                                     None, ARGUMENTS["position_free"] + ".")
        table["2x2", rule] = Verdict(
            "unknown", OPEN, None,
            "no construction found: a first layer can write the count i into the stream, but "
            "every later weight is then the ReLU of a polynomial in the positions, so no step "
            "divides by j; no proof either, since piecewise polynomials are not ruled out on the "
            "finite set of trigger positions.")
    table["1x1", "sigmoid"] = Verdict(
        "cannot", "pole_gap", None,
        "two signs of one content coordinate at three trigger positions leave a rational "
        "function of j whose poles lie at or left of -1 to match 1/j, so some such sequence "
        "errs by at least sigmoid_floor (SIGMOID_1X1_ARGUMENT).")
    table["2x2", "sigmoid"] = Verdict(
        "unknown", OPEN, None,
        "no construction found: a first layer can write position features such as "
        "1/(1 + (i + 1) a) or a prefix mean into the stream, but turning the sigmoid's 1/(j + 1) "
        "into the target's 1/j needs a division that no second-layer score tried provides; the "
        "1x1 floor's argument does not carry over to two layers.")
    table["1x1", "gated_dim"] = Verdict(
        "can", ANY_ERROR, "gated_dim_construction",
        "the headwise gate's construction with its gate copied to every dimension (one head); "
        "whether exact is not settled: two gated copies of a value can cancel in W_O at every "
        "row but the trigger's, so unlike the other softmax rules a row can output exactly 0 "
        "with content in its values.")
    table["2x2", "gated_dim"] = Verdict(
        "can", ANY_ERROR, "gated_dim_construction",
        "the headwise gate's construction with its gate copied to every dimension (in layer 1, "
        f"head 1 of a residual stack, every other head zero); {_NOT_EXACT['2x2']}.")
    for config in CONFIGS:
        where = "in layer 1, head 1 of a residual stack, every other head zero" \
            if config == "2x2" else "one head"
        not_exact = (_NOT_EXACT["2x2"] if config == "2x2" else
                     "never exact: every weight is positive, so rows that output exactly 0 "
                     "whatever the content put every content token's value in the plane of "
                     "BOS's value and the learned value, and the trigger row's output then lies "
                     "in a 3-dimensional space that cannot hold every mean")
        table[config, "kv_bias"] = Verdict(
            "can", ANY_ERROR, "kv_bias_construction",
            "the learned key scores c against every non-trigger query and 0 against the "
            f"trigger's, a sink logit that depends on the query, and the learned value is 0 "
            f"({where}); {not_exact}.")
    table["1x1", "clipped_softmax"] = Verdict(
        "cannot", "clip_offset", None,
        "two signs of a content direction the trigger's query cannot see, at every trigger "
        "position, leave a clipped content weight max(0, 1.03/(j + r) - 0.03) with the same r "
        "at every j, and no scale of it follows 1/j, so some such sequence errs by at least "
        "clipped_floor (CLIPPED_1X1_ARGUMENT); exactly zero non-trigger rows are no obstacle.")
    table["2x2", "clipped_softmax"] = Verdict(
        "can", ANY_ERROR, "clipped_two_layer_construction",
        "head 1 of each layer sinks on BOS with nothing left over at non-trigger rows; at the "
        "trigger row layer 1 scales the running sum by 1 + nu A_r(j) and layer 2 by "
        "1 + mu A_0(j), which multiply to 1 + 1/j exactly (clipped_two_layer_scales), the only "
        "slack being layer 2's BOS score; not exact as built (its second factor reaches 1/j's "
        "pole at j = 0 only as BOS's softmax weight goes to 0), and whether other weights are "
        "exact is not settled here.")
    table["1x1", "uniform"] = Verdict("cannot", "fixed_weights", None,
                                      ARGUMENTS["fixed_weights"] + ".")
    table["2x2", "uniform"] = Verdict("cannot", "linear_stack", None,
                                      ARGUMENTS["linear_stack"] + ".")
    return table


EXPRESSIVITY: dict[tuple[str, str], Verdict] = _table()


# ------------------------------------------------------------------------------- checking


def _with_construction(config: str, rule: str) -> Verdict:
    """The verdict of (``config``, ``rule``) if it has a construction, else a ConfigError."""
    if config not in CONFIGS:
        raise ConfigError(f"config={config!r} is not allowed: choose one of "
                          f"{', '.join(CONFIGS)}.")
    verdict = EXPRESSIVITY.get((config, rule))
    if verdict is None or verdict.construction is None:
        said = "not in the table" if verdict is None else f"'{verdict.verdict}' ({verdict.how})"
        raise ConfigError(f"{config} {rule} has no construction: its verdict is {said}.")
    return verdict


def build_construction(config: str, rule: str, c: float | None = None, *, seq_len: int = 16,
                       d_model: int = 16, dtype: torch.dtype = torch.float64
                       ) -> tuple[RunConfig, AttentionStack]:
    """The table's construction for (``config``, ``rule``): for one to any error at strength
    ``c`` (required), for an exact one (c must be None). A (config, rule) without a
    construction is a ConfigError naming its verdict."""
    verdict = _with_construction(config, rule)
    if (c is None) != (verdict.how == EXACT):
        raise ConfigError(f"c={c!r} is not allowed for {config} {rule}: its construction is "
                          f"{verdict.how}, so c must be "
                          f"{'none' if verdict.how == EXACT else 'a number'}.")
    layers, heads = CONFIGS[config]
    if verdict.how == EXACT:
        return zero_row_construction(rule, seq_len, d_model, layers, heads, dtype)
    return BUILDERS[verdict.construction](c, seq_len, d_model, layers, heads, dtype)


@torch.no_grad()
def check_construction(config: str, rule: str, *, seq_len: int = 16, d_model: int = 16,
                       n_sequences: int = 512, seed: int = 0,
                       strengths: tuple[float, ...] = STRENGTHS) -> dict[str, Any]:
    """Build ``rule``'s construction for ``config`` and measure its worst error (``measure``)
    over ``n_sequences`` sequences with triggers anywhere in 2..L-1 (``all_triggers_batch``).

    An exact construction is measured in float32 and float64 (one point per dtype); one to any
    error in float64 at each strength c, beside its stated ``error_bound``. A (config, rule)
    without a construction is a ConfigError naming its verdict (``build_construction``).
    """
    size = {"seq_len": seq_len, "d_model": d_model}
    verdict = _with_construction(config, rule)
    points = []
    if verdict.how == EXACT:
        for dtype in (torch.float32, torch.float64):
            cfg, model = build_construction(config, rule, dtype=dtype, **size)
            batch = all_triggers_batch(cfg, n_sequences, seed, dtype)
            points.append({"dtype": str(dtype).removeprefix("torch."),
                           **_numbers(measure(model, batch), model, batch)})
    else:
        for c in strengths:
            cfg, model = build_construction(config, rule, c, **size)
            batch = all_triggers_batch(cfg, n_sequences, seed)
            points.append({"c": c, "bound": error_bound(rule, c, seq_len),
                           **_numbers(measure(model, batch), model, batch)})
    return {"config": config, "rule": rule, "how": verdict.how,
            "construction": verdict.construction, "seq_len": seq_len, "d_model": d_model,
            "n_sequences": n_sequences, "seed": seed, "points": points}


def _numbers(m: dict[str, Any], model: AttentionStack, batch: Batch) -> dict[str, Any]:
    """The errors of a ``measure`` record and the working head's (layer 1, head 1) mean BOS
    weight at non-trigger rows as its output sees it (``ModelOutput.seen``: times the share a
    per-dimension gate passes), ``head_bos_mass``: near 1 where it sinks on BOS."""
    keys = ("linf", "linf_trigger", "linf_nontrigger", "mse")
    seen = model(batch.x, return_weights=True).seen()[0][0]  # layer 1, member 0: (B, H, L, L)
    bos = metrics.bos_mass_nontrigger(seen, batch.trigger)[0].item()
    return {**{k: m[k] for k in keys}, "head_bos_mass": bos}


@torch.no_grad()
def check_sigmoid_floor(seq_len: int = 16, d_model: int = 16, c: float = 30.0
                        ) -> dict[str, Any]:
    """``SIGMOID_1X1_ARGUMENT``'s numbers for a task size, beside its controls on the argument's
    own sequences (``floor_sequences``): the exact ReLU construction's error on all of them, and
    ``sigmoid_one_position(j, c)``'s error on the two sequences with the trigger at j (below the
    floor: one position is no obstacle) and on all of them (at least the floor)."""
    task = construction_config("sigmoid", seq_len, d_model).task
    found = sigmoid_floor(task)
    if found is None:
        raise ConfigError(f"seq_len={seq_len} leaves fewer than three trigger positions from 2 "
                          "on: the sigmoid argument needs three.")
    batch = floor_sequences(task, found.nodes)

    def error(model: AttentionStack, rows: Tensor) -> float:
        out = model.to(torch.float64)(batch.x[rows]).out[0]
        return (out - batch.y[rows]).abs().max().item()

    every = torch.ones(len(batch.trigger), dtype=torch.bool)
    _, relu = zero_row_construction("relu", seq_len, d_model, dtype=torch.float64)
    positions = []
    for j in found.nodes:
        _, model = sigmoid_one_position(j, c, seq_len, d_model)
        positions.append({"j": j, "error_at_j": error(model, batch.trigger == j),
                          "error_all": error(model, every)})
    return {"seq_len": seq_len, "d_model": d_model, "nodes": list(found.nodes),
            "weights": [str(w) for w in found.weights], "floor": found.floor,
            "floor_exact": str(found.exact), "relu_error": error(relu, every), "c": c,
            "one_position": positions}


@torch.no_grad()
def argument_errors(model: AttentionStack, task: TaskConfig, key: str) -> list[float]:
    """Each member's largest error (L-infinity over every row and coordinate) on the sequences
    of the 1x1 argument ``key`` ("pole_gap", "clip_offset", or "bos_denied": ``removed_errors``
    under the model's own ``model.bos``): at least the argument's floor (``sigmoid_floor``,
    ``clipped_floor``, ``denied_floor``) for any weights, so a trained model below it would
    show the argument or its numbers wrong. A ValueError for another key, or where the argument
    does not apply to ``task``."""
    if key == "bos_denied":
        return removed_errors(model, task)
    model = model.to(torch.float64)
    if key == "pole_gap":
        found = sigmoid_floor(task)
        if found is None:
            raise ValueError("the sigmoid argument needs three trigger positions from 2 on.")
        batch = floor_sequences(task, found.nodes)
        err = (model(batch.x).out - batch.y).abs()  # (members, sequences, L, d)
        return err.flatten(1).amax(1).tolist()
    if key == "clip_offset":
        clipped = clipped_floor(task)
        if clipped is None:
            raise ValueError("the clipped softmax argument needs three trigger positions from 2 "
                             "on and two content coordinates.")
        seqs = clipped_sequences(model, task, clipped.positions)
        out = model(seqs.x.to(torch.float64)).out  # (members, sequences, L, d): its own ones
        err = (out - seqs.y.to(torch.float64)).abs()
        return err.flatten(1).amax(1).tolist()
    raise ValueError(f"argument {key!r} has no sequences here: choose pole_gap, clip_offset or "
                     "bos_denied.")


# ------------------------------------------------------------ BOS removed, one layer: forced

# The rules whose row with one visible key puts exactly 1 on it and whose trigger row's weights
# lie in [0, 1] and sum to at most 1 (at their default arguments): with BOS removed from the
# non-trigger rows, one layer of them cannot output zero at row 1 (``REMOVED_1X1_ARGUMENT``).
REMOVED_FORCED_RULES = ("softmax", "clipped_softmax", "uniform")
REMOVED_FLOOR = 0.2  # 1 / (1 + 4): four content coordinates, the argument's vertices

REMOVED_1X1_ARGUMENT = """\
With BOS removed from the non-trigger rows (``model.bos=removed``), one layer of a rule that puts
exactly 1 on the only key a row sees and whose trigger-row weights lie in [0, 1] and sum to at
most 1 (softmax; clipped softmax at zeta = 1; uniform) errs by at least 1/5 on some input of the
training distribution, whatever its weights (the plain target, d_model >= 7).

Write M = W_V W_O (summed over heads). Row 1 is a non-trigger row at every training trigger
position, and with BOS removed it sees token 1 alone: its output is x_1 M, its target 0. Moving
content coordinate a of x_1 from -1 to 1 moves the output's coordinate m by 2 M_am, so if every
sequence erred by at most E, |M_am| <= E for every content coordinate a and every m.

At the trigger row j (BOS visible there), the output's content coordinate m is
sum_k w_k x_k M: each token's content part adds at most w_k |content_k|_1 E, and its flag part
(BOS's, the trigger's or the bias flag's row of M) makes the rest a point of
conv{0, M_BOS, M_trigger, M_bias}, which lies in a subspace of dimension at most 3, whatever
the weights. Give every token the content v, a vertex of {-1, 1} on four content coordinates
and 0 on the others: the target's content is v, and the content part adds at most 4 E. Restricted
to those four coordinates the subspace lies in a hyperplane alpha . x = 0, and one of the vertices
v = +-sign(alpha) has |alpha . v| = |alpha|_1, so it is at L-infinity distance at least 1 from
it. Hence 1 <= E + 4 E: some of these sequences (the 2 (d - 3) probes of row 1 and the 16
vertices) errs by at least 1/5, forty times the stop rule's tolerance 5e-3.

It does not hold with two layers (a first layer can change what row 1 reads), nor for a rule
whose one-key row can put less than 1 on its key (an all-zero row, a sink key, a gate).
"""


def removed_sequences(task: TaskConfig, dtype: torch.dtype = torch.float64) -> Batch:
    """``REMOVED_1X1_ARGUMENT``'s sequences, the trigger at the first training position: every
    token's content +-e_a for each content coordinate a (the probes of row 1), then every token's
    content a vertex of {-1, 1} on the first four content coordinates (the trigger row's)."""
    n = task.d_model - 3
    if n < 4:
        raise ValueError(f"the argument needs four content coordinates; d_model={task.d_model} "
                         "gives fewer.")
    probes = torch.cat([torch.eye(n, dtype=dtype), -torch.eye(n, dtype=dtype)])
    vertices = torch.tensor(list(itertools.product((-1.0, 1.0), repeat=4)), dtype=dtype)
    vertices = torch.cat([vertices, torch.zeros(16, n - 4, dtype=dtype)], dim=1)
    content = torch.cat([probes, vertices])[:, None, :].expand(-1, task.seq_len, -1)
    trigger = torch.full((len(content),), max(task.train_trigger_min, 2))
    x = encode(content.clone(), trigger)
    return Batch(x=x, y=targets(x, trigger, residual=False), trigger=trigger)


@torch.no_grad()
def removed_errors(model: AttentionStack, task: TaskConfig) -> list[float]:
    """Each member's largest error on ``removed_sequences``, under the model's own
    ``model.bos``: at least ``REMOVED_FLOOR`` for any weights of a 1x1 model of a
    ``REMOVED_FORCED_RULES`` rule with BOS removed."""
    batch = removed_sequences(task)
    err = (model.to(torch.float64)(batch.x).out - batch.y).abs()
    return err.flatten(1).amax(1).tolist()


CAPPED_1X1_ARGUMENT = """\
With BOS's share of the non-trigger rows capped at 1 - eps (``model.bos=capped``), one softmax
layer errs by at least eps / (eps + 4) on the same sequences as ``REMOVED_1X1_ARGUMENT``,
whatever its weights: more than the stop rule's tolerance 5e-3 from eps = 0.03 on.

Row 1 sees BOS and token 1; the cap leaves token 1 a weight w >= eps, so its output is
M_BOS + w (D + c M_c), with D = M_bias - M_BOS and c token 1's content. Errors of at most E put
D + c M_c within E / w <= E / eps (L-infinity) of the point -M_BOS / w on the line through
M_BOS, for every c; moving content coordinate a from -1 to 1 then gives
M_a = mu_a M_BOS + R_a with |R_a| <= E / eps. At the trigger row (not capped) the content's
mu_a M_BOS parts join the flag part in the span of M_BOS, M_trigger and M_bias, and the rest adds
at most 4 E / eps for a vertex on four content coordinates, so 1 <= E + 4 E / eps. With eps = 1
(BOS removed) this is the 1/5 of ``REMOVED_1X1_ARGUMENT``.
"""


def denied_floor(rule: str, mode: str, eps: float | None = None) -> float | None:
    """The error some input must reach under any weights of one layer of ``rule`` (at its
    default arguments) with BOS denied (``mode`` "removed", or "capped" at 1 - ``eps``), on
    ``removed_sequences``: 1/5 removed (``REMOVED_1X1_ARGUMENT``), eps / (eps + 4) capped, for
    softmax only (``CAPPED_1X1_ARGUMENT``); None where no argument here applies."""
    if mode == "removed":
        return REMOVED_FLOOR if rule in REMOVED_FORCED_RULES else None
    if mode == "capped" and rule == "softmax" and eps is not None and eps > 0:
        return eps / (eps + 4)
    return None

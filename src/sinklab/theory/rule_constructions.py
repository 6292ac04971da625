"""The expressivity table's constructions, one per rule family: weights written down that solve
the trigger-conditional task to any error as a strength c grows, or at one trigger position only
(the controls of the 1x1 arguments, ``sinklab.theory.floors``), for the rules beyond the ReLU and
softmax constructions of ``sinklab.theory.constructions``::

    from sinklab.theory import rule_constructions as rc
    cfg, model = rc.softmax1_construction(8.0)  # error at most rc.error_bound("softmax1", 8.0, 16)

``sinklab.theory.expressivity`` names each "can" verdict's construction (``BUILDERS``) and
measures it. Weights use the model's row-vector convention: q = x W_Q, scores = q k^T (no
1/sqrt(d)), output = A (x W_V) W_O. Each construction sets layer 1, head 1 and leaves every other
head of a 2x2 stack zero (silent); the clipped-softmax one, which needs two layers, sets head 1 of
both.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from sinklab.config import RunConfig, build_run_config
from sinklab.errors import ConfigError
from sinklab.model import Attention, AttentionStack
from sinklab.task import BOS, TRIGGER
from sinklab.theory.constructions import construction_config, softmax_sink

# clipped_softmax's defaults, the ones the table speaks of (a test checks them against the
# registration), and the softmax weight at or below which a clipped weight is exactly 0.
CLIP_ZETA, CLIP_GAMMA = 1.0, -0.03
CLIP_ZERO = -CLIP_GAMMA / (CLIP_ZETA - CLIP_GAMMA)


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
    control of ``floors.SIGMOID_1X1_ARGUMENT``, whose floor comes from the position varying.

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
    exactly *for one trigger position j*: the control of ``floors.CLIPPED_1X1_ARGUMENT``, whose
    floor comes from the position varying.

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

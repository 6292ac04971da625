"""Which attention rules can express the trigger-conditional task, 1x1 and 2x2 (issue 28 item 1).

For each of sinklab's thirteen rules (``TABLE_RULES``) and each configuration, "1x1" (one layer,
one head, the plain target: the theorem's setting) and "2x2" (two residual layers of two heads),
``EXPRESSIVITY`` records a ``Verdict``: a construction (weights written down, exact or to an
error as small as wanted), an impossibility argument, or "unknown". The constructions are in
``sinklab.theory.rule_constructions`` or ``sinklab.theory.constructions``;
``check_construction`` measures one; the 1x1 arguments' floors and their proofs are in
``sinklab.theory.floors`` (the proofs, ``SIGMOID_1X1_ARGUMENT`` and the like, are reachable here
too, where the zoo report cites them)::

    from sinklab.theory import expressivity as ex, floors
    ex.EXPRESSIVITY["1x1", "softmax1"]        # Verdict(verdict="can", how="to any error", ...)
    ex.check_construction("1x1", "softmax1")  # measured errors at three strengths, with bounds
    floors.sigmoid_floor(cfg.task)            # the 1x1 sigmoid floor (0.0099 at L = 16)
    floors.clipped_floor(cfg.task)            # the 1x1 clipped-softmax floor (0.1033 at L = 16)

Each construction sets layer 1, head 1 and leaves every other head of a 2x2 stack zero
(silent), so there the residual stream carries x through and the target is x plus the mean at
the trigger, exactly as in ``zero_row_construction``; the clipped-softmax one, which needs two
layers, sets head 1 of both.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from sinklab import metrics
from sinklab.config import RunConfig
from sinklab.errors import ConfigError
from sinklab.model import AttentionStack
from sinklab.task import Batch
from sinklab.theory.constructions import all_triggers_batch, measure, zero_row_construction
from sinklab.theory.rule_constructions import BUILDERS, error_bound

CONFIGS: dict[str, tuple[int, int]] = {"1x1": (1, 1), "2x2": (2, 2)}  # (n_layers, n_heads)
# The rules the table speaks of: sinklab's own thirteen (a test checks each is registered),
# clipped_softmax at its defaults (``rule_constructions.CLIP_ZETA``, ``CLIP_GAMMA``).
TABLE_RULES = ("softmax", "relu", "relu_len", "relu_raw", "softmax1", "sink_logit", "sigmoid",
               "softpick", "gated", "uniform", "gated_dim", "kv_bias", "clipped_softmax")
VERDICTS = ("can", "cannot", "unknown")
EXACT, ANY_ERROR, OPEN = "exact", "to any error", "open"
# The impossibility arguments, by key: the first three are ``sinklab.theory.capacity``'s
# arguments (their proofs are in the zoo report), the last two are ``floors``' (with proofs).
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

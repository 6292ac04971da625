"""The field's pretraining results beside ``sinklab pretrain``'s, row by row (issue 48): Gu et
al.'s factors and StreamingLLM's pretraining triple (``sinklab.studies.reference.FIELD``), each
with sinklab's value at the same settings, theirs, and whether the direction agrees.

sinklab's values are medians over seeds at the protocol the pilot chose, measured as the field
measures them: Gu et al.'s sink rate on the first 64 tokens of 100 validation windows at eps =
0.3, in percent (``sinklab.studies.pretrain_pilot.field_numbers``); for StreamingLLM, the change
of the next-token loss (nats per token) when a cache of recent tokens keeps 0, 1 or 4 first
tokens, against the whole window (their numbers are perplexities of 160M models: the direction
compares, the scale does not). A direction agrees when every setting lies on the same side of
the reference setting (the contrast's, or keeping one first token) as theirs; a setting either
side has not run is left out, and a row with nothing to compare says so. For StreamingLLM only
no first token against one is compared (four against one differ by 2% or less in theirs).
"""

from __future__ import annotations

from typing import Any

from sinklab.stats import finite_median
from sinklab.studies.pretrain import VARIANT_WORDS
from sinklab.studies.reference import FIELD, FieldResult

# Per row of FIELD: where each of its settings is in sinklab's records (a variant's name, or
# "contrast" for the contrast's own rule), and the index of the setting the others are compared
# with. The StreamingLLM rows read the interventions of one rule instead.
GROUPS: dict[str, tuple[tuple[str | None, ...], int]] = {
    "weight_decay": (("weight_decay_0", "contrast", "weight_decay_0.5", "weight_decay_5"), 1),
    "learning_rate": (("lr_third", None, "contrast"), 2),
    "fixed_first": (("no_fixed_first", "contrast"), 1),
    "window": (("window_64", "contrast"), 1),
}
STREAMING = {"streaming_softmax": "softmax", "streaming_softmax1": "softmax1",
             "streaming_sink_token": "kv_bias"}
KEPT = (0, 1, 4)  # first tokens kept beside the window


def _gu_percent(runs: list[dict[str, Any]]) -> float | None:
    """The median over runs of Gu et al.'s rate as they measure it, in percent."""
    return finite_median([100 * r["field"]["rate"] for r in runs
                    if not r["diverged"] and r.get("field")])


def _sides(values: list[float | None], reference: int) -> list[int | None]:
    """Each value's side of the reference value: 1 above, -1 below, 0 equal, None unknown."""
    ref = values[reference]
    return [None if v is None or ref is None else (v > ref) - (v < ref) for v in values]


def _agreement(ours: list[float | None], theirs: list[float | None], reference: int,
               their_sides: list[int | None] | None = None) -> bool | None:
    """Whether every setting with both values lies on the same side of the reference as
    theirs; None when no setting has both."""
    mine = _sides(ours, reference)
    others = their_sides if their_sides is not None else _sides(theirs, reference)
    pairs = [(a, b) for i, (a, b) in enumerate(zip(mine, others))
             if i != reference and a is not None and b is not None]
    return all(a == b for a, b in pairs) if pairs else None


def _streaming_sides(result: FieldResult) -> list[int | None]:
    """StreamingLLM's direction: no first token kept against one kept (the side that says
    whether the first token is needed); four against one differ by about 2% of their
    perplexity or less, within what seeds move, so that side is not compared."""
    none, one = result.values[0], result.values[1]
    assert none is not None and one is not None
    return [(none > one) - (none < one), 0, None]


def _row(result: FieldResult, ours: list[float | None], unit: str, agrees: bool | None,
         our_settings: list[str]) -> dict[str, Any]:
    return {"key": result.key, "words": result.words, "settings": list(result.settings),
            "theirs": list(result.values), "their_unit": result.unit, "ours": ours,
            "our_settings": our_settings, "our_unit": unit, "agrees": agrees,
            "source": result.source, "secondary": result.secondary}


def _words(name: str | None) -> str:
    if name is None:
        return "not run"
    return "the contrast's softmax" if name == "contrast" else f"softmax, {VARIANT_WORDS[name]}"


def rows(records: dict[str, Any]) -> list[dict[str, Any]]:
    """The field table: one row per result of ``FIELD``."""
    softmax = [r for r in records["runs"] if r["rule"] == "softmax"]
    out = []
    for result in FIELD:
        if result.key in GROUPS:
            names, reference = GROUPS[result.key]
            ours = [None if name is None else _gu_percent(
                softmax if name == "contrast" else
                [r for r in records["variants"] if r["variant"] == name]) for name in names]
            theirs_sides = [-1, 0] if result.key == "window" else None  # short windows: none
            out.append(_row(result, ours, "Gu et al.'s sink rate, % (median over seeds)",
                            _agreement(ours, list(result.values), reference, theirs_sides),
                            [_words(name) for name in names]))
        elif result.key == "sigmoid":
            ours = [_gu_percent([r for r in records["runs"] if r["rule"] == "sigmoid"])]
            base = _gu_percent(softmax)
            # theirs: sigmoid without normalisation next to no sink; ours agrees when it lies
            # below softmax's and under 1%
            agrees = None if ours[0] is None or base is None else bool(
                ours[0] < base and ours[0] < 1.0)
            out.append(_row(result, ours, "Gu et al.'s sink rate, % (median over seeds)",
                            agrees, ["sigmoid (bias -log n)"]))
        elif result.key in STREAMING:
            rule = STREAMING[result.key]
            runs = [r for r in records["runs"] if r["rule"] == rule and not r["diverged"]
                    and r.get("effects")]
            ours = [finite_median([r["effects"][f"streaming_{k}"] for r in runs
                             if r["effects"].get(f"streaming_{k}") is not None])
                    for k in KEPT]
            out.append(_row(result, ours, "next-token loss change against the whole window, "
                            "nats per token (median over seeds)",
                            _agreement(ours, list(result.values), KEPT.index(1),
                                       _streaming_sides(result)),
                            [f"{rule}, {k} first token(s) kept" for k in KEPT]))
    return out


LAYER_KEYS = ("sink_heads", "massive_first", "massive_others", "resid_ratio", "value_ratio_max")


def layer_rows(records: dict[str, Any]) -> list[dict[str, Any]]:
    """Per rule and layer, the medians over its seeds of the field's per-layer numbers
    (``sinklab.studies.pretrain_pilot.field_numbers``): the heads that sink (Gu et al.'s rate
    on the first 64 tokens at least 0.5), Sun et al.'s largest activation over the median on
    the first token and on the others, the first token's residual norm over the others' and the
    largest first-value norm over the others'. Runs without these numbers are left out."""
    out = []
    for rule in dict.fromkeys(r["rule"] for r in records["runs"]):
        measured = [r["field"]["layers"] for r in records["runs"] if r["rule"] == rule
                    and not r["diverged"] and r.get("field")]
        for layer in range(len(measured[0]) if measured else 0):
            out.append({"rule": rule, "layer": layer, "seeds": len(measured),
                        **{key: finite_median([m[layer][key] for m in measured
                                         if m[layer][key] is not None]) for key in LAYER_KEYS}})
    return out

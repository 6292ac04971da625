"""The field table of sinklab pretrain (sinklab.studies.pretrain_field): sinklab's values at the
field's settings, and whether each direction agrees, on records made up so that the answer is
known."""

from __future__ import annotations

import pytest

from sinklab.studies import pretrain_field as pf


def run(rule: str, rate: float | None, variant: str | None = None, effects: dict | None = None,
        diverged: bool = False) -> dict:
    out = {"rule": rule, "diverged": diverged, "effects": effects,
           "field": None if rate is None else {"rate": rate}}
    if variant:
        out["variant"] = variant
    return out


def records(**variant_rates: float) -> dict:
    runs = [run("softmax", r, effects={"streaming_0": 2.0, "streaming_1": 0.1,
                                       "streaming_4": 0.05}) for r in (0.10, 0.12, 0.14)]
    runs += [run("sigmoid", 0.001) for _ in range(3)]
    runs += [run("softmax1", 0.0, effects={"streaming_0": 0.5, "streaming_1": 0.6,
                                           "streaming_4": 0.6})]
    variants = [run("softmax", rate, variant=name) for name, rate in variant_rates.items()]
    return {"runs": runs, "variants": variants}


def by_key(rows: list[dict]) -> dict:
    return {r["key"]: r for r in rows}


def test_gu_rates_are_medians_in_percent_and_directions_compare_to_the_contrast():
    rows = by_key(pf.rows(records(weight_decay_0=0.05, **{"weight_decay_0.5": 0.3},
                                  weight_decay_5=0.0, no_fixed_first=0.2, window_64=0.01,
                                  lr_third=0.02)))
    wd = rows["weight_decay"]
    assert wd["ours"] == pytest.approx([5.0, 12.0, 30.0, 0.0])
    assert wd["agrees"] is True  # 0 below, 0.5 above, 5.0 below 0.1: as theirs
    assert rows["fixed_first"]["agrees"] is False  # theirs: off lowers it; here it rose
    assert rows["window"]["agrees"] is True and rows["learning_rate"]["agrees"] is True
    assert rows["learning_rate"]["ours"][1] is None  # no run at their middle setting
    assert rows["sigmoid"]["ours"] == pytest.approx([0.1]) and rows["sigmoid"]["agrees"]


def test_streaming_compares_keeping_one_first_token():
    rows = by_key(pf.rows(records()))
    assert rows["streaming_softmax"]["ours"] == [2.0, 0.1, 0.05]
    assert rows["streaming_softmax"]["agrees"] is True  # 0 kept far worse than 1
    # softmax1 here loses nothing when no first token is kept: theirs lost everything
    assert rows["streaming_softmax1"]["agrees"] is False
    assert rows["streaming_sink_token"]["agrees"] is None  # kv_bias not trained here


def test_settings_not_run_decide_nothing():
    rows = by_key(pf.rows(records()))
    for key in ("weight_decay", "fixed_first", "window", "learning_rate"):
        assert rows[key]["agrees"] is None
    assert all(r["secondary"] for r in rows.values())
    diverged = records()
    diverged["runs"] = [dict(r, diverged=True) if r["rule"] == "sigmoid" else r
                        for r in diverged["runs"]]
    assert by_key(pf.rows(diverged))["sigmoid"]["agrees"] is None


def test_layer_rows_are_medians_per_rule_and_layer():
    def layers(heads: int, massive: float) -> list[dict]:
        return [{"sink_heads": heads, "massive_first": massive, "massive_others": None,
                 "resid_ratio": 2.0, "value_ratio_max": 1.0}, {
                 "sink_heads": 0, "massive_first": 1.0, "massive_others": 3.0,
                 "resid_ratio": 1.0, "value_ratio_max": 0.5}]

    runs = [{"rule": "softmax", "diverged": False, "field": {"layers": layers(h, m)}}
            for h, m in ((1, 10.0), (2, 30.0), (3, 20.0))]
    runs += [{"rule": "relu", "diverged": True, "field": None}]
    rows = pf.layer_rows({"runs": runs})
    assert [(r["rule"], r["layer"]) for r in rows] == [("softmax", 0), ("softmax", 1)]
    assert rows[0]["sink_heads"] == 2 and rows[0]["massive_first"] == 20.0
    assert rows[0]["massive_others"] is None and rows[1]["massive_others"] == 3.0

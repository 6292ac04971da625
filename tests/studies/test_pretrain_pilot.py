"""The pretraining pilot's reading and its choice of protocol (sinklab.studies.pretrain_pilot),
on records made up so that the answer is known."""

from __future__ import annotations

import pytest

from sinklab.studies import pretrain_pilot as pp
from sinklab.studies.pretrain import PILOT, PILOT_SEEDS

STEP = 100_000


def point(tokens: int, rate: float, deep: bool = False, loss: float = 2.0) -> dict:
    """A logged point's model-level numbers (``point_numbers``): 2 layers of 2 heads."""
    return {"tokens": tokens, "val_loss": loss, "sink_rate": rate, "first_mass": rate / 2,
            "sink_layers": [0, 1] if deep else ([0] if rate else []), "resid_ratio_max": 2.0}


def run(protocol: str, seed: int, rates: list[float], deep_from: int | None = None,
        schedule: str = "constant", fpt: float = 1e6, loss: float = 2.0) -> dict:
    curve = [point(i * STEP, r, deep_from is not None and i >= deep_from, loss)
             for i, r in enumerate(rates)]
    held = pp.held_from(curve, [p["sink_rate"] >= 0.1 for p in curve])
    deep = pp.held_from(curve, [1 in p["sink_layers"] for p in curve])
    return {"protocol": protocol, "seed": seed, "tokens": curve[-1]["tokens"],
            "diverged": False, "flops_per_token": fpt, "schedule": schedule,
            "train_tokens": 4_000_000, "tokens_per_s": 1e4, "wall_time_s": 1.0,
            "sink_tokens": held, "deep_tokens": deep, "curve": curve}


def test_held_from_needs_the_test_to_hold_to_the_end():
    curve = [point(i * STEP, 0) for i in range(5)]
    assert pp.held_from(curve, [False, True, False, True, True]) == 3 * STEP
    assert pp.held_from(curve, [True, True, True, True, False]) is None


def test_a_protocol_sinks_at_its_latest_seed_and_the_cheapest_is_chosen():
    late = [0, 0, 0, 0.2, 0.2, 0.2, 0.2, 0.2, 0.2]
    early = [0, 0.2, 0.2, 0.2, 0.2, 0.2, 0.2, 0.2, 0.2]
    runs = [run("base", 2000, early), run("base", 2001, late), run("base", 2002, early),
            # cheaper per token but one seed never holds a sink: not a candidate
            *[run("lr_3e-3", s, early if s != 2001 else [0] * 7 + [0.2, 0],
                  fpt=1e5) for s in PILOT_SEEDS],
            # dearer per token, sinks at once
            *[run("context_512", s, early, fpt=3e6) for s in PILOT_SEEDS]]
    rows = {r["protocol"]: r for r in pp.protocol_rows(runs)}
    assert rows["base"]["sink_tokens"] == 3 * STEP and rows["base"]["with_sink"] == 3
    assert rows["lr_3e-3"]["sink_tokens"] is None
    assert rows["context_512"]["sink_flops"] == pytest.approx(STEP * 3e6)
    assert rows["wsd"]["seeds"] == 0 and rows["wsd"]["sink_tokens"] is None
    # context_512 costs 1e5 tokens x 3e6 = 3e11 FLOPs, base 3e5 x 1e6 = 3e11: a tie goes to
    # the protocol declared first
    choice = pp.choose(list(rows.values()))
    assert choice["protocol"] == "base" and not choice["deep"] and choice["point"] == 3 * STEP
    assert choice["budget"] == 500_000  # 1.5 x 300,000, rounded up to 100,000
    runs = [r for r in runs if r["protocol"] != "context_512"] + \
        [run("context_512", s, early, fpt=2.9e6) for s in PILOT_SEEDS]
    choice = pp.choose(pp.protocol_rows(runs))
    assert choice["protocol"] == "context_512" and choice["point"] == STEP


def test_a_sink_beyond_layer_0_wins_over_a_cheaper_shallow_one():
    sink = [0, 0.2, 0.2, 0.2, 0.2, 0.2]
    runs = [*[run("base", s, sink) for s in PILOT_SEEDS],
            *[run("6x192", s, sink, deep_from=4, fpt=5e6) for s in PILOT_SEEDS]]
    choice = pp.choose(pp.protocol_rows(runs))
    assert choice["protocol"] == "6x192" and choice["deep"] and choice["point"] == 4 * STEP
    assert choice["budget"] == 5 * STEP  # at most the pilot's own budget


def test_no_sink_anywhere_chooses_nothing_and_float32_is_never_a_candidate():
    runs = [*[run("base", s, [0, 0.05, 0.05]) for s in PILOT_SEEDS],
            *[run("float32", s, [0, 0.2, 0.2]) for s in PILOT_SEEDS]]
    assert pp.choose(pp.protocol_rows(runs)) is None


def test_a_decaying_schedule_is_read_at_its_end_only():
    runs = [run("cosine", s, [0, 0.2, 0.2, 0.05 if s == 2000 else 0.2], schedule="cosine")
            for s in PILOT_SEEDS]
    row = next(r for r in pp.protocol_rows(runs) if r["protocol"] == "cosine")
    assert not row["read_at_points"] and row["sink_tokens"] is None and row["with_sink"] == 2
    runs[0] = run("cosine", 2000, [0, 0, 0, 0.2], schedule="cosine")
    row = next(r for r in pp.protocol_rows(runs) if r["protocol"] == "cosine")
    assert row["sink_tokens"] == 3 * STEP  # its budget, whenever the seeds sank before it


def test_precision_pairs_seeds_at_the_float32_budget():
    base = [run("base", s, [0, 0.1, 0.2, 0.2], loss=2.0) for s in PILOT_SEEDS]
    check = [run("float32", s, [0, 0.1], loss=2.0 + 0.005 * i)
             for i, s in enumerate(PILOT_SEEDS)]
    out = pp.precision_check(base + check)
    assert [p["tokens"] for p in out["pairs"]] == [STEP] * 3
    assert out["largest_gap"] == pytest.approx(0.01) and out["passed"]
    check[2] = run("float32", 2002, [0, 0.1], loss=2.05)
    assert not pp.precision_check(base + check)["passed"]
    # a float32 run whose end is no base point is compared at the last point both logged
    ragged = run("float32", 2000, [0, 0.1, 0.2], loss=2.0)
    ragged["curve"][-1]["tokens"] = 2 * STEP - 7
    pairs = pp.precision_check(base + [ragged, *check[1:]])["pairs"]
    assert pairs[0]["tokens"] == STEP
    assert pp.precision_check(base) is None


def test_the_pilot_is_declared_over_every_protocol_and_seed():
    from sinklab.studies.pretrain import PILOT_STAGE, PretrainOptions, pilot_cells
    from sinklab.studies.study import Execution

    cells = pilot_cells(PretrainOptions(rules=("softmax",)), Execution(device="cpu"))
    first = [name for name in PILOT if PILOT_STAGE[name] == 1]
    assert len(cells) == len(first) * len(PILOT_SEEDS) and len(first) < len(PILOT)
    assert {c.config.model.attention for c in cells} == {"softmax"}
    assert {c.config.train.seed for c in cells} == set(PILOT_SEEDS)
    base = next(c for c in cells if c.name == "pilot/base_seed2000").config
    check = next(c for c in cells if c.name == "pilot/float32_seed2000").config
    # the precision check differs from the base in its precision and budget only
    assert check.replace(precision="bfloat16", tokens=base.train.tokens) == base


def test_birth_watches_the_pilots_base_protocol():
    from sinklab.pretrain import birth
    from sinklab.studies.pretrain import PILOT_BASE, PILOT_HEAD_RATE, PRESETS, SINK_RATE

    expected = {**PRESETS["cpu"], **PILOT_BASE}
    for key, value in birth.BIRTH.items():
        assert expected.get(key, value) == value, key
    assert (birth.SINK_RATE, birth.HEAD_RATE) == (SINK_RATE, PILOT_HEAD_RATE)
    assert birth.TOKENS == PILOT_BASE["tokens"] and birth.SEED in PILOT_SEEDS


def test_a_failed_precision_check_sends_the_rounds_after_the_pilot_to_float32():
    sink = [0, 0.2, 0.2, 0.2]
    base = [run("base", s, sink, loss=2.0) for s in PILOT_SEEDS]
    close = [run("float32", s, [0, 0.0], loss=2.01) for s in PILOT_SEEDS]
    far = [run("float32", s, [0, 0.0], loss=1.9) for s in PILOT_SEEDS]
    kept = pp.decided(base + close)
    assert kept["protocol"] == "base" and "precision" not in kept
    assert pp.settings(kept)["precision"] == "bfloat16" and "lr" not in pp.settings(kept)
    moved = pp.decided(base + far)
    assert moved["precision"] == "float32" and pp.settings(moved)["precision"] == "float32"

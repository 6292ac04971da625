"""The plain-target stacks of ``sinklab theory`` (``sinklab.theory.stacks``): configs, the BOS
measurements on a hand-built sink, records of real (tiny) runs, claims and the report fragment."""

from __future__ import annotations

import dataclasses
import math
from types import SimpleNamespace

import pytest
import torch
from matplotlib.figure import Figure

from sinklab import formats as md
from sinklab.claims import (
    CONTRADICTED,
    CONTROL_UNDECIDED,
    DISCRIMINATING,
    EMPIRICAL,
    FAILED,
    NON_DISCRIMINATING,
    SUPPORTED,
    UNDETERMINED,
)
from sinklab.config import build_run_config
from sinklab.errors import ConfigError
from sinklab.metrics import SINK_HEAD_THRESHOLD
from sinklab.model import AttentionStack
from sinklab.runs.files import read_json, read_log
from sinklab.studies import reference, render
from sinklab.studies import theory as th
from sinklab.studies import theory_analysis as tha
from sinklab.studies import theory_claims as thc
from sinklab.studies import theory_records as thr
from sinklab.studies.study import Execution
from sinklab.task import BOS
from sinklab.theory import constructions as theory
from sinklab.theory import protocol, stacks
from sinklab.train import STATUS, train_runs

SEEDS, STEPS, SEQUENCES = 2, 30, 16


def test_configs_are_plain_stacks_with_the_plateau_rule():
    for experiment in protocol.PLAIN_EXPERIMENTS:
        for rule in protocol.PLAIN_RULES:
            cfg = stacks.plain_config(experiment, rule, 3, 123, "cpu")
            assert cfg.task.target == "plain" and not cfg.residual
            assert (cfg.model.n_layers, cfg.model.n_heads) == \
                tuple(int(n) for n in experiment.split("x"))
            assert cfg.model.attention == rule
            assert cfg.train.patience == protocol.PLATEAU_PATIENCE > 0
            assert (cfg.train.max_steps, cfg.train.seed, cfg.train.log_every) == (123, 3, 100)
            # the searched protocol of its shape and rule; another one when asked
            assert (cfg.model.init_std, cfg.train.lr) == \
                protocol.PLAIN_PROTOCOL[(experiment, rule)]
            other = stacks.plain_config(experiment, rule, 3, 123, "cpu", (0.3, 3e-3))
            assert (other.model.init_std, other.train.lr) == (0.3, 3e-3)
            assert cfg.to_dict()["train"]["patience"] == protocol.PLATEAU_PATIENCE
            assert cfg.train.lr_drops == protocol.PLAIN_LR_DROPS > 0  # the rate drops


def test_unknown_experiment_is_one_sentence():
    with pytest.raises(ConfigError, match="'1x1' is not one of 2x2, 4x4"):
        stacks.plain_config("1x1", "softmax", 0, 10)


def test_cells_one_ensemble_per_experiment_and_rule():
    cells = th.plain_cells(SEEDS, STEPS, Execution(device="cpu"))
    assert len(cells) == len({c.name for c in cells}) == 2 * 2 * SEEDS
    groups: dict = {}
    for c in cells:
        groups.setdefault(c.group, []).append(c)
        assert c.name == stacks.plain_name(c.group[1], c.group[2], c.config.train.seed)
        assert c.config.task.target == "plain" and c.config.train.max_steps == STEPS
    assert sorted(groups) == sorted(("plain", e, r) for e in protocol.PLAIN_EXPERIMENTS
                                    for r in protocol.PLAIN_RULES)
    first = protocol.PLAIN_FIRST_SEED
    assert all(sorted(c.config.train.seed for c in g) == list(range(first, first + SEEDS))
               for g in groups.values())


def test_grid_cells_use_the_search_seeds_and_every_point():
    cells = th.grid_cells(2, STEPS, Execution(device="cpu"))
    points = {(c.config.model.n_layers, c.config.model.attention, c.config.model.init_std,
               c.config.train.lr) for c in cells}
    assert len(points) == 2 * 2 * len(protocol.PLAIN_GRID_STD) * len(protocol.PLAIN_GRID_LR)
    assert len(cells) == len({c.name for c in cells}) == 2 * len(points)
    # the search's seeds come before the seeds the claims read: none is shared
    assert {c.config.train.seed for c in cells} == {0, 1}
    assert max(range(protocol.PLAIN_GRID_SEEDS)) < protocol.PLAIN_FIRST_SEED
    assert all(c.config.task.target == "plain" and c.config.train.max_steps == STEPS
               and c.config.train.lr_drops == 0 for c in cells)  # the search: constant rates
    capped = th.grid_cells(1, 10**6, Execution(device="cpu"))
    assert {c.config.train.max_steps for c in capped} == {protocol.PLAIN_GRID_STEPS}
    # one ensemble per (shape, rule, init_std): its learning rates and seeds train together
    assert len({c.group for c in cells}) == 2 * 2 * len(protocol.PLAIN_GRID_STD)
    assert th.grid_cells(0, STEPS, Execution(device="cpu")) == []


def grid_row(e, rule, std, lr, seed, converged, steps=1000, best=0.1, status=None):
    return {"experiment": e, "rule": rule, "init_std": std, "lr": lr, "seed": seed,
            "converged": converged, "steps": steps, "best_train_linf": best,
            "status": status or ("converged" if converged else "plateau")}


def test_choice_prefers_seeds_at_the_stop_rule_then_speed_then_error():
    rows = [grid_row("2x2", "softmax", 0.1, 1e-3, s, True, steps=900 + s) for s in range(3)]
    rows += [grid_row("2x2", "softmax", 0.2, 1e-3, s, True, steps=500) for s in range(2)]
    rows += [grid_row("2x2", "softmax", 0.2, 1e-3, 2, False, best=0.02)]
    rows += [grid_row("2x2", "softmax", 0.02, 3e-4, s, True, steps=2000) for s in range(3)]
    # no seed at the stop rule anywhere: the lowest median best error wins
    rows += [grid_row("4x4", "relu", 0.1, 3e-3, s, False, best=0.5) for s in range(3)]
    rows += [grid_row("4x4", "relu", 0.3, 3e-3, s, False, best=0.2 + s) for s in range(3)]
    rows += [grid_row("4x4", "relu", 0.2, 1e-3, s, False, best=1e9, status="diverged")
             for s in range(3)]
    points = thr.grid_points(rows)
    p = next(p for p in points if (p["init_std"], p["lr"]) == (0.2, 1e-3)
             and p["experiment"] == "2x2")
    assert (p["converged"], p["n"], p["steps_median"], p["best_linf_median"]) == \
        (2, 3, 500, 0.1)
    choice = {(c["experiment"], c["rule"]): c for c in thr.plain_choice(points)}
    assert sorted(choice) == [("2x2", "softmax"), ("4x4", "relu")]
    sm = choice[("2x2", "softmax")]
    assert (sm["init_std"], sm["lr"], sm["converged"]) == (0.1, 1e-3, 3)  # 3/3 beats 2/3
    assert sm["std_bracketed"] and sm["lr_bracketed"]
    assert sm["is_declared"] == ((0.1, 1e-3) == protocol.PLAIN_PROTOCOL[("2x2", "softmax")])
    relu = choice[("4x4", "relu")]
    # medians 0.5, 1.2 and 1e9 (diverged): 0.1 wins; its rate is the grid's largest
    assert (relu["init_std"], relu["lr"], relu["converged"]) == (0.1, 3e-3, 0)
    assert relu["std_bracketed"] and not relu["lr_bracketed"]
    # a point whose every run has no finite error ranks last
    nan = [grid_row("4x4", "relu", 0.02, 3e-4, s, False, best=float("nan"),
                    status="diverged") for s in range(3)]
    worst = thr.grid_points(nan)[0]
    assert worst["best_linf_median"] is None and worst["diverged"] == 3
    again = thr.plain_choice(points + [worst])
    assert [(c["init_std"], c["lr"]) for c in again if c["rule"] == "relu"] == [(0.1, 3e-3)]


def test_stops_are_the_statuses_training_writes():
    assert sorted(thr.STOPS) == sorted(STATUS.values())


def test_protocol_quotes_the_configs():
    p = thr.plain_protocol(SEEDS, STEPS)
    cfg = stacks.plain_config("4x4", "relu", 0, STEPS)
    assert (p["max_steps"], p["patience"], p["tol"]) == (STEPS, cfg.train.patience, cfg.train.tol)
    assert p["threshold"] == SINK_HEAD_THRESHOLD
    assert f"{cfg.train.patience:,}" in p["plateau_rule"]


# ------------------------------------------------------------------------- measurements


def bos_sink_model(c: float = 20.0) -> tuple:
    """A plain 2x2 softmax stack whose layer 1, head 2 attends (almost) only to BOS at every
    non-trigger row: its query maps the bias flag to c e_0 and its key maps the BOS flag to e_0.
    The trigger row (bias flag 0) scores every key 0, so it spreads its weight evenly. Every
    other weight is zero, so layer 2 reads zeros and attends uniformly everywhere."""
    cfg = build_run_config({"task": {"target": "plain"},
                            "model": {"n_layers": 2, "n_heads": 2}})
    model = AttentionStack(cfg.model, cfg.task.d_model, residual=cfg.residual)
    last = cfg.task.d_model - 1
    with torch.no_grad():
        model.blocks[0].attn.w_q[0, 1, last, BOS] = c
        model.blocks[0].attn.w_k[0, 1, BOS, BOS] = 1.0
    return cfg, model


def test_hand_built_sink_is_found_at_every_non_trigger_position():
    cfg, model = bos_sink_model()
    batch = theory.all_triggers_batch(cfg, SEQUENCES, seed=0, dtype=torch.float32)
    m = stacks.plain_measure(model, batch)
    assert m["sink_heads"] == [[1, 2]]
    assert m["layers_with_sink"] == [True, False]
    L = cfg.task.seq_len
    assert m["positions_covered"] == [None] + [True] * (L - 1)
    # trigger rows spread their weight: no head sinks there, and rows 0 and 1 are never triggers
    assert m["trigger_positions_covered"][:2] == [None, None]
    seen = set(batch.trigger.tolist())
    assert [i for i, v in enumerate(m["trigger_positions_covered"]) if v is not None] == \
        sorted(seen)
    assert not any(v for v in m["trigger_positions_covered"] if v is not None)
    for i in sorted(seen):
        assert m["bos_trigger"][0][1][i] == pytest.approx(1 / (i + 1), rel=1e-5)
    # layer 2 reads zeros: uniform rows, BOS weight 1 / (i + 1) at row i
    assert m["bos_nontrigger"][1][0][1:] == pytest.approx([1 / (i + 1) for i in range(1, L)])
    assert m["bos_max_by_position"][0] is None
    assert min(m["bos_max_by_position"][1:]) > 0.99


def test_no_sink_when_the_head_is_silenced():
    cfg, model = bos_sink_model(c=0.0)  # every score 0: uniform rows everywhere
    batch = theory.all_triggers_batch(cfg, SEQUENCES, seed=0, dtype=torch.float32)
    m = stacks.plain_measure(model, batch)
    assert m["sink_heads"] == [] and m["layers_with_sink"] == [False, False]
    # row 1 sees BOS and x_1: weight 1/2 < threshold, as everywhere after it
    assert not any(v for v in m["positions_covered"] if v is not None)


def test_per_position_means_agree_with_the_head_mean():
    """Two paths to a head's non-trigger BOS mass: the mean over all its non-trigger rows
    (``metrics``), and the per-position means weighted by how many rows each position has."""
    cfg = build_run_config({"task": {"target": "plain"}, "model": {"n_layers": 2,
                                                                   "n_heads": 2}})
    model = AttentionStack(cfg.model, cfg.task.d_model, residual=False)
    model.init_member(0, torch.Generator().manual_seed(1))
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(50)  # far from uniform rows
    batch = theory.all_triggers_batch(cfg, SEQUENCES, seed=0, dtype=torch.float32)
    m = stacks.plain_measure(model, batch)
    L = cfg.task.seq_len
    counts = [SEQUENCES - int((batch.trigger == i).sum()) for i in range(L)]
    counts[0] = 0
    for li in range(2):
        for hi in range(2):
            rows = m["bos_nontrigger"][li][hi]
            weighted = sum(c * v for c, v in zip(counts, rows) if c) / sum(counts)
            assert weighted == pytest.approx(m["head_bos"][li][hi], rel=1e-6)


# ------------------------------------------------------------------------ trained runs


GRID_STD, GRID_LR = (0.1,), (1e-3,)  # a one-point search for the trained fixture


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """Every plain run of the study, tiny: 30 steps, 2 seeds, a patience of 5 steps so that the
    plateau rule can fire; and a one-point protocol search on one seed."""
    out = tmp_path_factory.mktemp("plain")
    seeds = range(protocol.PLAIN_FIRST_SEED, protocol.PLAIN_FIRST_SEED + SEEDS)
    for experiment in protocol.PLAIN_EXPERIMENTS:
        for rule in protocol.PLAIN_RULES:
            cfgs = [stacks.plain_config(experiment, rule, s, STEPS, "cpu") for s in seeds]
            cfgs = [dataclasses.replace(c, train=dataclasses.replace(c.train, patience=5))
                    for c in cfgs]
            names = [stacks.plain_name(experiment, rule, s) for s in seeds]
            grid = stacks.plain_config(experiment, rule, 0, STEPS, "cpu",
                                       (GRID_STD[0], GRID_LR[0]), lr_drops=0)
            train_runs(cfgs, [out / n for n in names], progress=False)
            train_runs([grid], [out / stacks.grid_name(experiment, rule, GRID_STD[0],
                                                       GRID_LR[0], 0)], progress=False)
    ctx = SimpleNamespace(out=out, summary=lambda name: read_json(out / name / "summary.json"))
    with pytest.MonkeyPatch.context() as mp:
        for module in (thr, protocol):
            mp.setattr(module, "PLAIN_GRID_STD", GRID_STD)
            mp.setattr(module, "PLAIN_GRID_LR", GRID_LR)
        return out, thr.plain_collect(ctx, SEEDS, STEPS, n_sequences=SEQUENCES,
                                         grid_seeds=1, attack_steps=3)


def test_records_of_trained_runs(trained):
    out, plain = trained
    runs = plain["runs"]
    assert len(runs) == 2 * 2 * SEEDS
    assert plain["protocol"]["max_steps"] == STEPS and plain["sequences"] == SEQUENCES
    for r in runs:
        name = stacks.plain_name(r["experiment"], r["rule"], r["seed"])
        summary = read_json(out / name / "summary.json")
        assert (r["status"], r["steps"], r["test_linf"]) == \
            (summary["status"], summary["steps"], summary["linf_error"])
        assert r["status"] in thr.STOPS and r["steps"] <= STEPS
        assert r["best_train_linf"] == min(row["train_linf"]
                                           for row in read_log(out / name / "metrics.jsonl"))
        layers, heads = (int(n) for n in r["experiment"].split("x"))
        assert len(r["bos_nontrigger"]) == layers and len(r["bos_nontrigger"][0]) == heads
        assert len(r["positions_covered"]) == 16 and r["positions_covered"][0] is None
        assert len(r["layers_with_sink"]) == layers
        assert math.isfinite(r["linf_all_triggers"])
        assert all(r["attacked"][k] >= 0 for k in ("bos", "pre", "trigger", "post"))
        # the control: the same stack at its initial weights, measured the same way
        before = r["untrained"]
        assert len(before["head_bos"]) == layers and before["sink_heads"] == []
        assert before["positions_covered"][1:] == [False] * 15
    assert plain["attack"] == {"steps": 3, "restarts": th.PLAIN_ATTACK_RESTARTS}
    grid = plain["grid"]
    assert grid["seeds"] == 1 and len(grid["points"]) == 4 and len(grid["choice"]) == 4
    for point in grid["points"]:
        name = stacks.grid_name(point["experiment"], point["rule"], GRID_STD[0], GRID_LR[0], 0)
        assert point["n"] == 1 and point["best_linf_median"] == min(
            row["train_linf"] for row in read_log(out / name / "metrics.jsonl"))
    # 30 steps at learning rate 1e-4 from N(0, 0.02^2) weights: near-uniform rows, no sink yet
    assert all(r["sink_heads"] == [] for r in runs)
    groups = plain["groups"]
    assert [(g["experiment"], g["rule"]) for g in groups] == \
        [(e, r) for e in protocol.PLAIN_EXPERIMENTS for r in protocol.PLAIN_RULES]
    assert all(sum(g[s] for s in thr.STOPS) == g["n"] == SEEDS for g in groups)
    assert {r["status"] for r in runs} <= {"plateau", "max_steps"}


def test_figure_draws_a_line_per_seed(trained):
    _, plain = trained
    records = {"plain": plain}
    (spec,) = tha.PLAIN_FIGURES
    assert spec.when(records, None) and not spec.when({}, None)
    rows, cols = spec.grid(records, None)
    assert (rows, cols) == (len(protocol.PLAIN_EXPERIMENTS), len(protocol.PLAIN_RULES))
    axes = Figure().subplots(rows, cols, squeeze=False)
    spec.draw(axes, records, None)
    for ax in axes.flat:
        assert len(ax.lines) == SEEDS + 1  # the seeds and the threshold
        assert list(ax.lines[0].get_xdata()) == list(range(1, 16))


# ------------------------------------------------------------------------------ claims


def fake_run(experiment: str, rule: str, seed: int, sink: bool = True, converged: bool = True,
             covered: bool = True, sink_before: bool = False) -> dict:
    """A run record as ``plain_records`` writes it, with a chosen sink and coverage, and its
    stack at initialisation (``untrained``): no sink head unless ``sink_before``."""
    L = 16
    top = [None] + [0.95 if covered else 0.5] * (L - 1)
    before = [None] + [sink_before] * (L - 1)
    return {
        "experiment": experiment, "rule": rule, "seed": seed,
        "status": "converged" if converged else "plateau", "converged": converged,
        "steps": 1234 + seed, "best_train_linf": 4e-3, "test_linf": 6e-3,
        "linf_trigger": 5e-3, "linf_nontrigger": 6e-3, "linf_all_triggers": 7e-3,
        "sink_heads": [[1, 2], [3, 1]] if sink else [],
        "layers_with_sink": [sink, False], "head_bos": [[0.1, 0.95], [0.2, 0.3]],
        "positions_covered": [None] + [covered] * (L - 1),
        "trigger_positions_covered": [None, None] + [False] * (L - 2),
        "bos_nontrigger": [], "bos_trigger": [], "bos_max_by_position": top,
        "attacked": {"bos": 1e-2, "pre": 2e-2, "trigger": 3e-2, "post": 2e-2},
        "untrained": {"sink_heads": [[1, 1]] if sink_before else [],
                      "positions_covered": before, "head_bos": [[0.1, 0.1], [0.1, 0.1]],
                      "bos_max_by_position": [None] + [0.1] * (L - 1),
                      "linf_all_triggers": 0.9},
    }


def runs_of(n: int, **kwargs) -> list[dict]:
    return [fake_run(e, r, s, **kwargs) for e in protocol.PLAIN_EXPERIMENTS
            for r in protocol.PLAIN_RULES for s in range(n)]


def by_key(runs: list[dict]) -> dict:
    return {c.key: c for c in thc.plain_claims(runs)}


def test_claim_keys_and_outcomes():
    relu = [fake_run(e, "relu", s, sink=False, covered=False)
            for e in protocol.PLAIN_EXPERIMENTS for s in range(10)]
    claims = by_key([r for r in runs_of(10) if r["rule"] == "softmax"] + relu)
    assert set(claims) == {"plain.softmax.some_head_sinks",
                           "plain.softmax.every_position_covered", "plain.sink_head"}
    for key in ("some_head_sinks", "every_position_covered"):
        claim = claims[f"plain.softmax.{key}"]
        # one claim over both shapes' seeds, each shape's count beside it
        assert claim.outcome == SUPPORTED and claim.n == 2 * 10
        assert [p["setting"] for p in claim.parts] == list(protocol.PLAIN_EXPERIMENTS)
        assert claim.kind == EMPIRICAL and claim.standing == DISCRIMINATING
    # softmax against ReLU is one contrast over both shapes, not a ReLU claim with the softmax
    # seeds as its control
    both = claims["plain.sink_head"]
    assert both.rule == "rates_contrast" and both.outcome == SUPPORTED and both.n == 2 * 20
    assert [(p["setting"], p["k1"], p["n1"], p["k2"], p["n2"]) for p in both.parts] == [
        (e, 10, 10, 0, 10) for e in protocol.PLAIN_EXPERIMENTS]
    assert both.control is None and both.counted
    assert {k.key: k.outcome for k in both.check_claims()} == {
        "plain.relu_reaches_threshold": "verified", "plain.seeds_at_stop": "described"}


def test_stacks_without_sinks_contradict_and_relu_sinks_make_it_non_discriminating():
    runs = [{**r, "sink_heads": []} if (r["rule"], r["seed"] % 2) == ("softmax", 0) else r
            for r in runs_of(10)]
    claims = by_key(runs)
    assert claims["plain.softmax.some_head_sinks"].outcome == CONTRADICTED
    assert claims["plain.softmax.some_head_sinks"].counterexamples == 10
    assert claims["plain.softmax.every_position_covered"].outcome == SUPPORTED
    # the ReLU seeds of runs_of all have sink heads, half the softmax seeds none: the contrast
    # comes out the other way
    assert claims["plain.sink_head"].outcome == CONTRADICTED
    # ... and with every seed of both rules sinking there is nothing to tell them apart
    assert by_key(runs_of(10))["plain.sink_head"].outcome == UNDETERMINED
    # the softmax claims' control is the same stacks before any update: when those already
    # have a sink head at every position, the claim does not discriminate
    assert by_key(runs_of(10))["plain.softmax.some_head_sinks"].standing == DISCRIMINATING
    born = by_key(runs_of(10, sink_before=True))
    for key in ("some_head_sinks", "every_position_covered"):
        claim = born[f"plain.softmax.{key}"]
        assert claim.outcome == SUPPORTED and claim.standing == NON_DISCRIMINATING
        assert not claim.counted and "before any update" in claim.control_claim().data
    uncovered = by_key(runs_of(10, covered=False))
    assert uncovered["plain.softmax.every_position_covered"].outcome == CONTRADICTED


def test_the_contrast_is_not_counted_when_relu_cannot_reach_the_threshold():
    """ReLU rows need not sum to 1: ReLU heads that never put the threshold's weight on BOS
    have no sink head whether or not they need one, so the contrast is supported but its check
    fails and it is not counted."""
    runs = [{**r, "sink_heads": [], "head_bos": [[0.01, 0.2], [0.3, 0.05]]}
            if r["rule"] == "relu" else r for r in runs_of(10)]
    claim = by_key(runs)["plain.sink_head"]
    assert claim.outcome == SUPPORTED and not claim.counted
    assert [k.key for k in claim.check_claims() if k.outcome == FAILED] == [
        "plain.relu_reaches_threshold"]


def test_few_seeds_are_undetermined():
    claims = by_key(runs_of(2, sink=True))  # 4 seeds over both shapes: fewer than 5
    assert claims["plain.softmax.some_head_sinks"].outcome == UNDETERMINED
    assert claims["plain.softmax.some_head_sinks"].n == 4
    relu = by_key(runs_of(2, sink=False))
    assert relu["plain.sink_head"].outcome == UNDETERMINED


def test_claims_rest_on_the_seeds_that_solve_the_task():
    """Seeds short of the stop rule are not tested: with none there, every claim (and its
    control) is undetermined and says why; a seed without a sink that did not reach the stop
    rule contradicts nothing."""
    claims = by_key(runs_of(10, converged=False))
    assert all(c.outcome == UNDETERMINED and c.n == 0 and "reached the stop rule" in
               c.needed_text and "nothing to test" in c.needed_text for c in claims.values())
    assert all(c.standing == CONTROL_UNDECIDED for c in claims.values() if not c.is_contrast)
    runs = [{**r, "converged": False, "sink_heads": []} if r["seed"] == 0 else r
            for r in runs_of(10)]
    some = by_key(runs)["plain.softmax.some_head_sinks"]
    assert some.n == 18 and some.outcome == SUPPORTED
    # no ReLU seed at the stop rule: the contrast has no ReLU arm, and says so; the softmax
    # claims keep their own control (the same seeds before any update)
    relu_stuck = by_key([{**r, "converged": False} if r["rule"] == "relu" else r
                         for r in runs_of(10)])
    both = relu_stuck["plain.sink_head"]
    assert both.outcome == UNDETERMINED and both.n == 20
    assert "none of the 20 plain-target ReLU seeds" in both.needed_text
    assert "20 of 20 seeds" in both.data  # the softmax arm's counts are kept
    lone = relu_stuck["plain.softmax.some_head_sinks"]
    assert lone.outcome == SUPPORTED and lone.standing == DISCRIMINATING and lone.counted
    # no softmax seed at the stop rule: the contrast has no softmax arm either
    soft_stuck = by_key([{**r, "converged": False} if r["rule"] == "softmax" else
                         {**r, "sink_heads": []} for r in runs_of(10)])
    both = soft_stuck["plain.sink_head"]
    assert both.outcome == UNDETERMINED and not both.counted
    assert "none of the 20 plain-target softmax seeds" in both.needed_text


# ---------------------------------------------------------------------------- fragment


def render_fragment(plain: dict) -> str:
    claims = thc.plain_claims(plain["runs"])
    keyed = {c.key: c for c in claims}
    template = render.ENV.get_template("theory_plain.md.j2")
    return template.render(
        records={"plain": plain}, claims=keyed, claim_list=claims, table=md.table,
        figure=lambda name, caption="": f"![{caption}](figures/{name}.png)",
        claims_table=lambda keys: render.claims_table([keyed[k] for k in keys]),
        consts=reference.constants())


def synthetic(n: int, grid: bool = True, **kwargs) -> dict:
    runs = runs_of(n, **kwargs)
    rows = [grid_row("2x2", "softmax", 0.1, 1e-3, s, True, steps=955 + s) for s in range(3)]
    rows += [grid_row("4x4", "relu", 0.3, 3e-4, s, False, best=0.9, status="diverged")
             for s in range(3)]
    points = thr.grid_points(rows)
    search = {"init_std": [0.1, 0.3], "lr": [3e-4, 1e-3], "seeds": 3,
              "rule": thr.PLAIN_CHOICE_RULE, "points": points,
              "choice": thr.plain_choice(points)}
    return {"protocol": thr.plain_protocol(n, 777), "sequences": 99, "runs": runs,
            "grid": search if grid else None, "attack": {"steps": 5, "restarts": 4},
            "groups": thr.plain_groups(runs)}


def test_fragment_renders_from_the_records():
    plain = synthetic(3)
    text = render_fragment(plain)
    assert text.startswith("## 7. The multi-layer claim without residual targets")
    assert "L1H2, L3H1" in text and "15/15" in text
    assert "777 steps" in text and f"{protocol.PLATEAU_PATIENCE:,} steps" in text
    assert "99 test sequences" in text
    # a row per seed; one each in the protocol, stops, search and choice tables
    assert text.count("| 2x2 | softmax | ") == 3 + 4
    assert "Plain-target softmax stacks (2x2, 4x4: no residual stream, the theorem's own " \
        "multi-layer setting) that reached the stop rule have some head that sinks" in text
    assert "fig_plain.png" in text
    assert "not made for" not in text
    # the search: a row per grid point, one per choice, the attack's budget
    assert "| 2x2 | softmax | 0.1 | 0.001 | 3/3 | 0 | 956 |" in text
    assert "| 4x4 | relu | 0.3 | 0.0003 | 0/3 | 3 | - |" in text
    assert "seeds 0 to 2" in text and "5 sign-gradient steps from 4 random starts" in text
    assert f"first {protocol.PLAIN_LR_DROPS} firings have each multiplied the learning rate " \
        "by 0.1" in text
    assert "How the protocol was chosen" not in render_fragment(synthetic(3, grid=False))
    # every number comes from the records: another patience shows up as such
    other = {**plain, "protocol": {**plain["protocol"], "patience": 1234}}
    assert "1,234 steps" in render_fragment(other)


def test_fragment_says_when_no_seed_converged():
    text = render_fragment(synthetic(2, converged=False))
    assert "None of the 2x2 softmax seeds reached the stop rule within 777 steps" in text
    assert "None of the 4x4 relu seeds reached the stop rule" in text
    assert "undetermined" in text

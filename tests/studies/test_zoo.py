"""The attention-rule zoo (``sinklab.studies.zoo`` and its analysis, ``zoo_analysis``,
``zoo_claims``; its capacity arguments, ``sinklab.theory.capacity``; its rate search,
``sinklab.studies.search``): reading "where zero comes from" and "sinks on BOS" off weights,
the outcome labels and the capacity arguments behind "cannot express", the relative Gu rate's
row floor, and ``sinklab zoo`` end to end (learning rate chosen on validation, claims,
resume)."""

from __future__ import annotations

import csv

import pytest
import torch

from helpers import run_cli
from sinklab import measure, metrics, stats
from sinklab.attention import RULES, rule_info
from sinklab.config import build_run_config
from sinklab.definitions import default_source
from sinklab.model import AttentionStack
from sinklab.runs import folders
from sinklab.runs.files import read_json
from sinklab.studies import search, zoo, zoo_analysis, zoo_claims
from sinklab.task import sample_batch
from sinklab.theory import capacity as arguments  # the capacity arguments
from sinklab.theory import constructions as theory


def test_every_rule_declares_its_row_kind():
    assert {rule_info(r).row_kind for r in RULES} <= {"simplex", "implicit sink", "gated", "free",
                                                      "learned key", "clipped"}


@pytest.mark.parametrize(("bos", "row_nt", "row_t", "kind", "want"), [
    (0.99, 1.0, 1.0, "simplex", "BOS"),            # softmax parked on BOS
    (0.10, 1.0, 1.0, "simplex", "content"),        # uniform: weight on content
    (0.00, 0.00, 3.0, "free", "zero row"),         # ReLU's all-zero row
    (0.42, 0.45, 0.9, "free", "BOS"),              # on, mostly BOS
    (0.01, 0.02, 0.99, "implicit sink", "sink logit"),  # mass went to the implicit sink
    (0.95, 0.98, 0.99, "implicit sink", "BOS"),    # softmax_1 still using BOS
    (0.01, 0.05, 0.80, "gated", "closed gate"),
    (0.01, 0.05, 0.80, "learned key", "learned key"),  # the rest went to the learned key
    (0.96, 0.97, 0.99, "learned key", "BOS"),
    (0.00, 0.00, 0.60, "clipped", "clipped to zero"),  # every weight clipped to 0
    (0.90, 0.95, 0.95, "clipped", "BOS"),          # a sink on BOS, the rest clipped
    (0.49, 0.50, 0.70, "gated", "BOS"),            # gate open, softmax on BOS
    (0.0, 0.0, 0.0, "simplex", "content"),         # degenerate input stays defined
])
def test_default_source_reads_the_mechanism(bos, row_nt, row_t, kind, want):
    assert default_source(bos, row_nt, row_t, kind) == want


def _run(bos, row_nt, row_t, rule):
    summary = {"bos_mass_nontrigger": [bos], "row_sum_nontrigger": [row_nt],
               "row_sum_trigger": [row_t]}
    return zoo_analysis.bos_shares(summary), zoo_analysis.head_sources(summary, rule)


def test_sinking_is_judged_by_the_bos_share_of_rows_that_are_on():
    sinks = zoo_analysis.sinks
    assert sinks(*_run([0.50, 0.05], [0.51, 0.5], [0.8, 0.8], "gated"))  # half-open gate
    assert not sinks(*_run([0.0], [0.0], [3.0], "relu"))  # an all-zero row is no sink
    assert not sinks(*_run([0.6, 0.3], [1.0, 1.0], [1.0, 1.0], "softmax"))  # under 0.9
    # a sigmoid row of 1e-5 all on BOS: share 1, but the row is off, so it is no sink
    assert not sinks(*_run([1e-5], [1e-5], [0.24], "sigmoid"))
    assert zoo_analysis.bos_shares({"bos_mass_nontrigger": [[0.0, 0.3]],
                                    "row_sum_nontrigger": [[0.0, 0.6]]}) == [[None, 0.5]]


def test_outcome_and_share_labels_say_how_the_others_ended():
    outcome, share_label = zoo_claims.outcome, zoo_claims.share_label
    ends = {"converged": 2, "plateau": 2, "max_steps": 1, "diverged": 0}
    assert outcome({"converged": 5}, 5, 3000, None) == "reached the stop rule (5 of 5)"
    assert outcome(ends, 5, 3000, None) == (
        "mixed (2 of 5 reached the stop rule; the others: 2 plateau, 1 cap; cap 3,000 steps)")
    none = {"converged": 0, "plateau": 4, "max_steps": 0, "diverged": 1}
    assert outcome(none, 5, 3000, None) == (
        "not reached (4 plateau, 1 diverged; cap 3,000 steps)")
    assert outcome(none, 5, 3000, arguments.POSITION_FREE) == (
        "cannot express (argument in the report; 4 plateau, 1 diverged; cap 3,000 steps)")
    assert [share_label(k, 5) for k in (5, 0, 3)] == ["yes (5 of 5)", "no (0 of 5)",
                                                      "mixed (3 of 5)"]
    assert share_label(0, 0) == "n/a (no seed to count)"
    runs = [{"status": s} for s in ("converged", "plateau", "max_steps", "plateau")]
    assert zoo_claims.count_ends(runs) == {"converged": 1, "plateau": 2, "max_steps": 1,
                                           "diverged": 0}


def test_no_other_zero_is_read_off_the_rules_themselves():
    """A row with one visible key: softmax, clipped softmax and uniform put exactly 1 on it;
    every rule with free rows, a sink key or a gate can put less."""
    forced = {rule for rule in RULES if rule_info(rule).module == "sinklab"
              and arguments.no_other_zero(rule)}
    assert forced == {"softmax", "clipped_softmax", "uniform"}


def test_capacity_table_and_when_its_arguments_apply():
    applies = arguments.capacity_applies
    assert set(arguments.CAPACITY) == {("1x1", "relu_len"), ("1x1", "relu_raw"),
                                      ("1x1", "uniform"), ("2x2", "uniform"), ("1x1", "sigmoid"),
                                      ("1x1", "clipped_softmax")}
    # at 2x2 only uniform, whose stack stays linear (a layer of any other rule can write the
    # position); sigmoid's argument needs its default bias and three trigger positions
    assert [rule for config, rule in arguments.CAPACITY if config == "2x2"] == ["uniform"]
    sig = zoo.run_config("1x1", "sigmoid", 1e-3, 0, False, "auto")
    assert applies(sig, arguments.POLE_GAP)
    assert not applies(build_run_config({"model": {
        "attention": "sigmoid", "attention_args": {"bias": -1.0}}}), arguments.POLE_GAP)
    assert not applies(build_run_config({"model": {"attention": "sigmoid"}, "task": {
        "seq_len": 16, "train_trigger_min": 2, "train_trigger_max": 3}}), arguments.POLE_GAP)
    clip = zoo.run_config("1x1", "clipped_softmax", 1e-3, 0, False, "auto")
    assert applies(clip, arguments.CLIP_OFFSET)
    assert not applies(build_run_config({"model": {
        "attention": "clipped_softmax", "attention_args": {"gamma": -0.1}}}), arguments.CLIP_OFFSET)
    assert not applies(build_run_config({"model": {"attention": "clipped_softmax"},
                                         "task": {"d_model": 4}}), arguments.CLIP_OFFSET)
    one = zoo.run_config("1x1", "relu_len", 1e-3, 0, False, "auto")
    assert applies(one)
    assert not applies(zoo.run_config("2x2", "relu_len", 1e-3, 0, False, "auto"))
    two = zoo.run_config("2x2", "uniform", 1e-3, 0, False, "auto")
    assert applies(two, arguments.LINEAR_STACK)
    assert not applies(two, arguments.FIXED_WEIGHTS)
    assert not applies(build_run_config({"model": {
        "attention": "uniform", "n_layers": 2, "n_heads": 2, "block": "standard"}}),
        arguments.LINEAR_STACK)  # an MLP is not linear
    assert zoo_claims.fixed_weight_rules() == {"uniform"} == {
        rule for rule in RULES if rule_info(rule).fixed_weights}
    assert not applies(build_run_config({"model": {"attention": "relu_len",
                                                   "block": "standard"}}))
    assert not applies(build_run_config({"model": {"attention": "relu_len"},
                                         "task": {"max_triggers": 2}}))


def test_capacity_bounds_are_the_stated_formulas():
    bounds = arguments.capacity_bounds(zoo.run_config("1x1", "relu_len", 1e-3, 0, False, "auto"))
    pole = bounds["pole_gap"]  # the sigmoid argument's best triple at L = 16
    assert pole["nodes"] == [2, 5, 15] and pole["exact"] == "7/705"
    assert pole["sup_floor"] == pytest.approx(7 / 705) and pole["weights"] == ["25/13", "-1",
                                                                              "1/13"]
    clip = bounds["clip_offset"]  # the clipped softmax argument at L = 16
    assert clip["sup_floor"] == pytest.approx(0.1033, abs=1e-4)
    assert clip["sup_floor"] <= clip["attained"] <= clip["sup_floor"] * 1.001
    pf, fw = bounds["position_free"], bounds["fixed_weights"]
    inv = [1 / j for j in range(2, 16)]  # training triggers 2..15 at L = 16
    var = sum(v * v for v in inv) / 14 - (sum(inv) / 14) ** 2
    assert pf["mse_floor"] == pytest.approx(var / 3) and pf["var_inv_j"] == pytest.approx(var)
    assert pf["sup_floor"] == pytest.approx((1 / 2 - 1 / 15) / 2)
    assert pf["mse_floor"] / pf["tol"] ** 2 == pytest.approx(pf["mse_floor_over_tol2"])
    assert pf["mse_floor"] > pf["tol"] ** 2 * 100  # far above what the stop rule allows
    assert fw["sup_floor"] == pytest.approx(3 / 10)  # (j + 1) / (j (j + 3)) at j = 2
    assert bounds["linear_stack"]["sup_floor"] == pytest.approx(1 / 4)  # 1 / (2 j) at j = 2
    w, j = fw["w_best"], 2  # the two errors the argument balances are equal there
    assert w / 2 == pytest.approx(1 / j - w / (j + 1))


@pytest.mark.parametrize("residual", [True, False])
def test_a_stack_of_uniform_layers_errs_by_a_quarter_at_row_2_whatever_its_weights(residual):
    """The linear-stack argument's four sequences (x_1's content coordinate at -1 and 1, the
    trigger at 2 or at 3), all else fixed: for random 2x2 uniform stacks (residual and plain)
    one of them errs by at least 1/4 at row 2. Its control, the same four sequences through the
    exact 2x2 ReLU construction (whose weights read the scores), err by nothing, so the
    measurement can fail."""
    from sinklab.task import encode, targets
    from sinklab.theory import constructions

    gen = torch.Generator().manual_seed(0)
    content = torch.rand(1, 16, 13, generator=gen) * 2 - 1
    xs, trig = [], []
    for j in (2, 3):
        for u in (-1.0, 1.0):
            c = content.clone()
            c[0, 1, 4] = u  # x_1's content coordinate 4
            xs.append(encode(c, torch.tensor([j])))
            trig.append(j)
    x, trig = torch.cat(xs).double(), torch.tensor(trig)

    def worst(model, cfg):
        with torch.no_grad():
            err = (model(x).out[0] - targets(x, trig, cfg.residual))[:, 2, 2 + 4]
        return err.abs().max().item()

    target = "residual" if residual else "plain"
    for seed in range(5):
        cfg = build_run_config({"task": {"target": target},
                                "model": {"attention": "uniform", "n_layers": 2, "n_heads": 2}})
        model = AttentionStack(cfg.model, 16, residual=cfg.residual).double()
        g = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for p in model.parameters():
                p.copy_(torch.randn(p.shape, generator=g, dtype=p.dtype) * 0.5)
        assert worst(model, cfg) >= 0.25 - 1e-12
    if residual:
        cfg, relu = constructions.relu_construction(16, 16, 2, 2, dtype=torch.float64)
        assert worst(relu, cfg) <= 1e-12


def _position_free_model(rule, generator, scale):
    cfg = build_run_config({"model": {"attention": rule}})
    model = AttentionStack(cfg.model, cfg.task.d_model, residual=cfg.residual)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=generator) * scale)
    return cfg, model


@pytest.mark.parametrize("rule", ["relu_len", "relu_raw"])
def test_no_position_free_model_beats_the_floor_even_when_trained(rule):
    """The floor holds for any weights: random ones, and ones trained on the training
    distribution (a few hundred Adam steps), measured on training sequences."""
    generator = torch.Generator().manual_seed(0)
    floor = None
    for scale in (0.02, 0.3):
        cfg, model = _position_free_model(rule, generator, scale)
        floor = arguments.capacity_bounds(cfg)["position_free"]["mse_floor"]
        assert measure.capacity_mse(cfg, model, arguments.CAPACITY_SEQUENCES) >= floor
    cfg, model = _position_free_model(rule, generator, 0.1)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    data = torch.Generator().manual_seed(1)
    for _ in range(300):
        batch = sample_batch(cfg.task, 128, data, residual=cfg.residual)
        loss = (model(batch.x).out[0] - batch.y).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert measure.capacity_mse(cfg, model, arguments.CAPACITY_SEQUENCES) >= floor
    # the paper's ReLU divides by the query's position and so escapes: its exact construction
    cfg, model = theory.relu_construction()
    assert measure.capacity_mse(cfg, model, arguments.CAPACITY_SEQUENCES) < 1e-9


def test_relative_gu_rate_ignores_rows_under_the_floor():
    L, B = 16, 4
    trigger = torch.full((B,), 7)
    # one head (layers=1, H=1): non-trigger rows sum to 1e-5, all on BOS; the trigger row sums
    # to 0.24 over keys 1..7: the sigmoid rows of the issue
    w = torch.zeros(1, B, 1, L, L)
    w[..., :, 0] = 1e-5
    w[..., 7, :] = 0.0
    w[..., 7, 1:8] = 0.24 / 7
    unfloored = metrics.sink_rate(w[0], relative=True).mean().item()
    assert unfloored == 1.0  # every sample counts as a sink without the floor
    got = measure.gu_relative(w, trigger)
    assert got["rate"] == 0.0
    assert got["rows"] == B * L and got["rows_ignored"] == B * (L - 1) and got["rows_zero"] == 0
    # a softmax head parked on BOS keeps every row and is a sink in every sample
    soft = torch.zeros(1, B, 1, L, L)
    soft[..., :, 0] = 1.0
    soft[..., 7, :] = 0.0
    soft[..., 7, 1:8] = 1 / 7
    got = measure.gu_relative(soft, trigger)
    assert got == {"rate": 100.0, "rows_ignored": 0, "rows_zero": 0, "rows": B * L}
    # all-zero rows are ignored and counted as exactly zero
    relu = torch.zeros(1, B, 1, L, L)
    relu[..., 7, 1:8] = 0.5
    got = measure.gu_relative(relu, trigger)
    assert got["rate"] == 0.0 and got["rows_ignored"] == got["rows_zero"] == B * (L - 1)


def test_the_search_screens_the_starting_grid_first_with_the_zoos_budget():
    from sinklab.studies.study import Execution

    opts = zoo.ZooOptions(seeds=2, rules=("softmax", "relu"))
    cells = zoo.cells(opts, Execution())
    names = [c.name for c in cells]
    assert len(names) == len(set(names)) == 2 * 2 * 3 * zoo.DEFAULT_SCREEN
    assert "screen/1x1_softmax_lr0.001_seed0" in names
    cell = next(c for c in cells if c.name == "screen/2x2_relu_lr0.0003_seed2")
    assert cell.config == build_run_config({
        "model": {"attention": "relu", "n_layers": 2, "n_heads": 2},
        "train": {"seed": 2, "lr": 3e-4, "max_steps": zoo.CAP["2x2"], "patience": zoo.PATIENCE,
                  "device": "auto", "log_every": zoo.LOG_EVERY}})
    assert list(zoo.fresh_seeds(opts)) == [3, 4]  # never a screening seed
    quick = zoo.cells(zoo.ZooOptions(quick=True, rules=("softmax",)), Execution())
    assert [c.name for c in quick] == ["screen/1x1_softmax_lr0.001_seed0",
                                       "screen/2x2_softmax_lr0.0003_seed0"]
    denied = zoo.run_config("1x1", "relu", 1e-3, 3, False, "auto", zoo.Denial("capped", 0.1))
    assert (denied.model.bos, denied.model.bos_cap_eps) == ("capped", 0.1)
    assert zoo.run_name("denied", "1x1", "relu", 1e-3, 3, zoo.Denial("capped", 0.1)) == \
        "denied/1x1_relu_capped0.1_lr0.001_seed3"


def _summary(converged, steps=1000, linf=1e-3, status=None):
    return {"converged": converged, "steps": steps, "train_linf": linf,
            "status": status or ("converged" if converged else "plateau")}


def test_the_best_rate_reaches_most_then_fastest_then_lowest():
    fast = [_summary(True, 900), _summary(True, 1100), _summary(False, 5000, 0.1)]
    slow = [_summary(True, 3000), _summary(True, 4000), _summary(False, 5000, 0.1)]
    all_reach = [_summary(True, 9000)] * 3
    assert search.best_rate({1e-3: fast, 3e-4: slow}) == 1e-3
    assert search.best_rate({1e-3: fast, 3e-4: all_reach}) == 3e-4  # more seeds reach
    low = [_summary(False, 5000, 0.01)] * 3
    high = [_summary(False, 5000, 0.2)] * 3
    assert search.best_rate({1e-3: high, 3e-3: low}) == 3e-3  # none reaches: the lowest error
    assert search.best_rate({1e-3: low, 3e-3: low}) == 1e-3  # a tie: the smaller rate
    assert search.rate_score([_summary(False, 10, float("nan"), "diverged")] * 3)[2] == float("inf")


def test_the_search_steps_outward_while_the_best_rate_is_at_an_edge():
    assert search.next_rate([3e-4, 1e-3, 3e-3], 3e-3, zoo.LADDER) == 1e-2
    assert search.next_rate([3e-4, 1e-3, 3e-3], 3e-4, zoo.LADDER) == 1e-4
    assert search.next_rate([3e-4, 1e-3, 3e-3], 1e-3, zoo.LADDER) is None  # inside: done
    assert search.next_rate([3e-2, 1e-1], 1e-1, zoo.LADDER) is None  # the ladder's end


class _Screens:
    """A stand-in for the study's context: screening summaries by rate, from ``quality(lr)``."""

    def __init__(self, tmp_path, quality, quick=False):
        self.opts = zoo.ZooOptions(seeds=2, rules=("relu",), quick=quick)
        self.out = tmp_path
        self.quality, self.asked = quality, []

    def summary(self, name):
        lr = float(name.split("_lr")[1].split("_")[0])
        self.asked.append(lr)
        return self.quality(lr)


def _replay(tmp_path, quality, quick=False, monkeypatch=None):
    ctx = _Screens(tmp_path, quality, quick)
    monkeypatch.setattr(folders, "check_complete", lambda path: True)
    return zoo_analysis.search(ctx, "1x1", "relu"), ctx


def test_the_search_replays_from_finished_runs_and_stops_inside_the_grid(tmp_path, monkeypatch):
    # reaching everywhere, fastest at 1e-2: 3e-3 is best, then 1e-2, then 3e-2 is slower
    steps = {3e-4: 4000, 1e-3: 2000, 3e-3: 1000, 1e-2: 600, 3e-2: 900}
    found, ctx = _replay(tmp_path, lambda lr: _summary(True, steps[lr]), monkeypatch=monkeypatch)
    assert found.best == 1e-2 and not found.at_ladder_end and not found.pending
    assert sorted(found.tried) == [3e-4, 1e-3, 3e-3, 1e-2, 3e-2]
    # faster and faster up to the ladder's top: the search says the ladder stopped it
    found, _ = _replay(tmp_path, lambda lr: _summary(True, int(1 / lr)), monkeypatch=monkeypatch)
    assert found.best == zoo.LADDER[-1] and found.at_ladder_end
    # quick: the middle rate only, no step outward
    found, ctx = _replay(tmp_path, lambda lr: _summary(True, int(1 / lr)), quick=True,
                         monkeypatch=monkeypatch)
    assert list(found.tried) == [1e-3] and found.best == 1e-3


def test_a_search_with_unfinished_runs_asks_for_them(tmp_path, monkeypatch):
    monkeypatch.setattr(folders, "check_complete", lambda path: "lr0.01_" not in str(path))
    ctx = _Screens(tmp_path, lambda lr: _summary(True, int(1 / lr)))
    found = zoo_analysis.search(ctx, "1x1", "relu")
    assert found.best is None and found.pending == [1e-2]


def test_cumulative_incidence_with_competing_ends_and_censoring():
    # no censoring: the plain shares
    got = stats.cumulative_incidence([1, 2, 2, 5], ["a", "a", "b", "a"])
    assert got == {"a": [(1.0, 0.25), (2.0, 0.5), (5.0, 0.75)], "b": [(2.0, 0.25)]}
    # one unit censored at 3: the unit ending at 5 counts as half the remaining survivors...
    got = stats.cumulative_incidence([1, 3, 5, 6], ["a", None, "a", "b"])
    assert got["a"] == [(1.0, 0.25), (5.0, pytest.approx(0.25 + 0.75 * 0.5))]
    assert got["b"] == [(6.0, pytest.approx(0.375))]  # ...and the rest ends of b: sums to 1
    # a unit censored at the same step as an end is at risk at that step
    assert stats.cumulative_incidence([2, 2], ["a", None]) == {"a": [(2.0, 0.5)]}
    with pytest.raises(ValueError, match="one cause"):
        stats.cumulative_incidence([1], [])


@pytest.fixture
def tiny_zoo(monkeypatch):
    monkeypatch.setattr(zoo, "CAP", {"1x1": 40, "2x2": 10})
    monkeypatch.setattr(zoo, "QUICK_CAP", {"1x1": 30, "2x2": 10})
    monkeypatch.setattr(zoo, "PATIENCE", 20)
    monkeypatch.setattr(zoo, "START", {"1x1": (1e-3, 3e-3), "2x2": (1e-4, 3e-4)})
    monkeypatch.setattr(zoo, "LADDER", (1e-4, 3e-4, 1e-3, 3e-3, 1e-2))
    monkeypatch.setattr(zoo, "CAPS", (0.1,))
    return zoo


@pytest.mark.slow
def test_zoo_end_to_end_searches_trains_fresh_and_denied_seeds_and_resumes(
        tmp_path, capsys, tiny_zoo):
    out, docs = tmp_path / "zoo", tmp_path / "docs" / "zoo.md"
    args = ["zoo", "--seeds", "2", "--screen-seeds", "1", "--rules", "softmax,relu_len",
            "--workers", "1", "--out", str(out)]
    code, _, err = run_cli(capsys, *args, "--docs", str(docs))
    assert code == 0, err
    assert "more runs to train" in err  # the rounds after the first
    result = read_json(out / "records.json")
    records = result["records"]
    entries = records["entries"]
    assert [(e["config"], e["rule"]) for e in entries] == [
        (c, r) for c in ("1x1", "2x2") for r in ("softmax", "relu_len")]
    for e, sc in zip(entries, records["screen"]):
        tried = [r["lr"] for r in sc["rates"]]
        assert e["lr"] == sc["lr"] in tried and len(tried) >= 2
        # the search went on while its best rate sat at an edge, unless the ladder ended
        assert sc["at_ladder_end"] or min(tried) < e["lr"] < max(tried) or len(tried) == len(
            tiny_zoo.LADDER)
        assert e["n"] == 2 and e["seeds"] == [1, 2]
        assert set(e["denied"]) == {"removed", "capped 0.1"}
        assert all(d["n"] == 2 for d in e["denied"].values())
        runs = [r for r in records["runs"] if (r["config"], r["rule"]) == (e["config"], e["rule"])]
        assert len(runs) == 2 and all(r["lr"] == e["lr"] for r in runs)
        for run in runs:  # validation sequences are not the test sequences
            assert run["validation_mse"] != run["mse"]
            assert set(run["ablated"]) == set(zoo_analysis.ABLATION_KEYS)
        assert e["incidence"]["n"] == 2
    by = {(e["config"], e["rule"]): e for e in entries}
    # a proof, not the budget, labels 1x1 relu_len; the same rule at 2x2 gets the budget's label
    assert by["1x1", "relu_len"]["outcome"].startswith("cannot express (argument in the report")
    assert by["2x2", "relu_len"]["outcome"].startswith("not reached (")
    floor = records["capacity"]["position_free"]["mse_floor"]
    assert all(v >= floor for v in by["1x1", "relu_len"]["capacity_mse"])
    assert by["1x1", "softmax"]["capacity_mse"] == [None, None]
    assert by["1x1", "softmax"]["no_other_zero"] and not by["1x1", "relu_len"]["no_other_zero"]
    claims = {c["key"]: c for c in result["claims"]}
    assert claims["1x1.relu_len.reached_stop_rule"]["kind"] == "descriptive"
    assert claims["1x1.softmax.removed.reached_stop_rule"]["kind"] == "descriptive"
    assert claims["relu_len.bos_sink"]["kind"] == "descriptive"  # free rows: described
    assert {c["key"] for c in result["claims"] if c["primary"]} == set(zoo.PRIMARY)
    sink = claims[zoo.SINK_CONTRAST]  # the paper's ReLU was not trained: undetermined, and why
    assert sink["outcome"] == "undetermined" and "relu was not trained" in sink["reason"]
    assert claims["1x1.relu_len.capacity_floor"]["outcome"] == "verified"
    # one softmax layer with BOS removed is forced to err: a check, out of the primary claim
    assert claims["1x1.softmax.removed.denied_floor"]["outcome"] == "verified"
    assert claims["1x1.softmax.capped0_1.denied_floor"]["outcome"] == "verified"
    assert by["1x1", "softmax"]["denied"]["capped 0.1"]["floor"] == pytest.approx(0.1 / 4.1)
    assert by["1x1", "softmax"]["denied"]["removed"]["forced"]
    assert not by["2x2", "softmax"]["denied"]["removed"]["forced"]
    rows = list(csv.DictReader((out / "entries.csv").read_text().splitlines()))
    assert [r["rule"] for r in rows] == ["softmax", "relu_len", "softmax", "relu_len"]
    assert len(list(csv.DictReader((out / "runs.csv").read_text().splitlines()))) == 8
    assert len(list(csv.DictReader((out / "denied.csv").read_text().splitlines()))) == 16
    screened = sum(len(sc["rates"]) for sc in records["screen"])
    text = (out / "ZOO.md").read_text()
    assert text.startswith("# Zoo: which attention rules need a sink\n")
    for section in ("## Verdicts", "**Primary claims**", "## The learning-rate search",
                    "## 1x1", "## 2x2", "## Steps to the stop rule",
                    "## Which rules need a BOS sink", "## Rules that cannot express the task",
                    "## BOS ablation at evaluation", "*Figure: steps to the stop rule.*"):
        assert section in text
    assert "Var(1/j) / 3" in text and "(figures/fig_zoo_incidence.png)" in text
    for fig in ("fig_zoo_bos", "fig_zoo_sources", "fig_zoo_incidence", "fig_zoo_search"):
        assert (out / "figures" / f"{fig}.png").is_file()
    assert (docs.parent / "zoo" / "fig_zoo_sources.png").is_file()

    code, _, err = run_cli(capsys, *args)
    total = screened + 8 + 16
    assert code == 0 and "0 runs to train in 0 jobs" in err, err
    assert "more runs to train" not in err  # every round's runs were finished
    assert read_json(out / "records.json")["meta"]["runs_reused"] == total
    assert "reused from" in err  # the model checks are cached, not computed again


@pytest.mark.parametrize(("extra", "message"), [
    (["--rules", "softmax,bogus"], "--rules: 'bogus' is not a known attention rule: choose from"),
    (["--rules", ","], "--rules needs at least one rule name"),
    (["--rules", "relu,relu"], "--rules lists 'relu' twice"),
    (["--seeds", "0"], "--seeds=0 is not allowed"),
    (["--seeds", "1000000000"], "--seeds 1000000000 and --screen-seeds 3 declares"),
    (["--screen-seeds", "0"], "--screen-seeds=0 is not allowed"),
    (["--no-extensions"], "unrecognized arguments: --no-extensions"),  # extensions left zoo
])
def test_zoo_bad_input_is_one_sentence(tmp_path, capsys, extra, message):
    code, _, err = run_cli(capsys, "zoo", "--out", str(tmp_path / "z"), *extra)
    assert code == 2 and message in err and "Traceback" not in err
    assert not (tmp_path / "z").exists()


@pytest.mark.slow
def test_zoo_on_ray_stores_what_the_local_executor_stores(tmp_path, capsys, tiny_zoo, request):
    pytest.importorskip("ray")
    from sinklab.sweeps.store import Store

    args = ["zoo", "--quick", "--rules", "softmax,relu", "--workers", "2"]
    code, _, err = run_cli(capsys, *args, "--out", str(tmp_path / "local"))
    assert code == 0, err
    request.getfixturevalue("local_ray")
    code, _, err = run_cli(capsys, *args, "--executor", "ray", "--out", str(tmp_path / "ray"))
    assert code == 0, err
    local = {r["name"]: r["metrics"] for r in Store.read(tmp_path / "local").rows()}
    remote = {r["name"]: r["metrics"] for r in Store.read(tmp_path / "ray").rows()}
    # per configuration and rule: screen, fresh, BOS removed and capped
    assert len(local) == 2 * 2 * (2 + len(zoo.denials(True))) and local.keys() == remote.keys()
    for name in local:
        assert remote[name]["linf_error"] == pytest.approx(local[name]["linf_error"], rel=1e-6)
        assert remote[name]["steps"] == local[name]["steps"]
    assert "## 1x1" in (tmp_path / "ray" / "ZOO.md").read_text()


def test_relative_gu_rate_keeps_only_rows_that_are_on():
    """One definition of an off row: rows that ``default_source`` calls off (a softpick head
    whose non-trigger rows hold 1% of its trigger row's weight, all on BOS) are the rows the
    relative rate ignores, and rows that are on are kept."""
    L, B = 16, 2
    trigger = torch.full((B,), 7)
    w = torch.zeros(1, B, 1, L, L)
    w[..., :, 0] = 0.0095
    w[..., 7, :] = 0.0
    w[..., 7, 1:8] = 1 / 7
    row_nt = metrics.row_sums(w, trigger)
    assert default_source(0.0095, row_nt["nontrigger"].item(), row_nt["trigger"].item(),
                          "free") == "zero row"
    assert metrics.sink_rate(w[0], relative=True).mean().item() == 1.0  # without the floor
    got = measure.gu_relative(w, trigger)
    assert got["rate"] == 0.0 and got["rows_ignored"] == B * (L - 1)
    w[..., :, 0] = 0.5  # the same rows, now on and all on BOS
    w[..., 7, 0] = 0.0
    got = measure.gu_relative(w, trigger)
    assert got["rate"] == 100.0 and got["rows_ignored"] == 0


# ---------------------------------------------------------------- the claims on built records


def _entry(config, rule, sinks, n=9, converged=None, capacity=None, capacity_mse=None,
           removed=None):
    """An entry of ``zoo_analysis.entry``'s shape with only what the claims read: ``sinks`` of
    the ``n`` seeds that reach the stop rule sink on BOS, ``removed`` of ``n`` reach it with BOS
    removed (by default, as the rule's class predicts)."""
    converged = n if converged is None else converged
    forced = arguments.no_other_zero(rule)
    removed = (0 if forced else n) if removed is None else removed
    return {"config": config, "rule": rule, "row_kind": rule_info(rule).row_kind, "lr": 1e-3,
            "at_ladder_end": False,
            "n": n, "converged": converged, "n_solved": converged, "bos_sinks": sinks,
            "ends": {"converged": converged, "plateau": n - converged},
            "solves": 2 * converged >= n, "no_other_zero": forced,
            "cap": zoo.CAP[config], "test_linf": [2e-3] * n, "steps": [500] * n,
            "capacity": capacity, "capacity_mse": capacity_mse or [None] * n,
            "bos_share_max_on": [None] * n, "outcome": "old label",
            "denied": {"removed": {"n": n, "converged": removed,
                                   "forced": config == "1x1" and rule in (
                                       "softmax", "clipped_softmax", "uniform"),
                                   "floor": 0.2, "denied_error": [0.9] * n,
                                   "ends": {"converged": removed, "plateau": n - removed}}}}


def _runs(e):
    """Runs of ``zoo_analysis``'s shape with only what the claims read, agreeing with entry
    ``e``: its first ``converged`` seeds reach the stop rule and the first ``bos_sinks`` of them
    sink; the others' rows are empty when the rule's rows may be all zero, else on content."""
    runs = []
    for i in range(e["n"]):
        empty = rule_info(e["rule"]).zero_row and i >= e["bos_sinks"]
        share = 0.99 if i < e["bos_sinks"] else None if empty else 0.3
        runs.append({"config": e["config"], "rule": e["rule"], "seed": i,
                     "converged": i < e["converged"], "test_linf": 2e-3,
                     "bos_share_max_on": share, "row_sum_nontrigger": [[1e-5 if empty else 1.0]],
                     "bos_share_nontrigger": [[0.5 if share is None else share]]})
    return runs


RULE_SET = ("clipped_softmax", "gated", "relu", "relu_len", "softmax", "softpick", "uniform")


def _records(sinks, uniform_sinks=0, capacity_mse=0.015, removed=None, converged=None):
    """Records of a zoo with the rules of ``RULE_SET``, 9 seeds each per configuration;
    ``sinks`` maps a rule to the seeds sinking on BOS in each configuration, ``removed`` to the
    seeds that reach the stop rule with BOS removed (default: as the rule's class predicts),
    ``converged`` to the seeds that reach it with BOS visible (default: all 9, none for the
    rules that cannot express the task)."""
    bounds = arguments.capacity_bounds(zoo.run_config("1x1", "softmax", 1e-3, 0, False, "auto"))
    entries = []
    for config in zoo.CONFIGS:
        for rule in RULE_SET:
            capacity = "position_free" if (config, rule) == ("1x1", "relu_len") else None
            cannot = capacity or rule == "uniform"
            entries.append(_entry(config, rule, uniform_sinks if rule == "uniform"
                                  else sinks.get(rule, 0), capacity=capacity,
                                  converged=0 if cannot else (converged or {}).get(rule),
                                  capacity_mse=[capacity_mse] * 9 if capacity else None,
                                  removed=(removed or {}).get(rule)))
    runs = [r for e in entries for r in _runs(e)]
    return {"entries": entries, "runs": runs, "capacity": bounds, "screen": []}


def _decide(records, rules=RULE_SET):
    opts = zoo.ZooOptions(seeds=9, rules=rules)
    return {c.key: c for c in zoo.STUDY.decide(zoo.STUDY.complete(records, opts), opts)}


def test_the_zoo_claims_are_contrasts_with_checks_and_two_pooled_primaries():
    claims = _decide(_records({"softmax": 9, "gated": 9, "clipped_softmax": 9}))
    assert zoo.STUDY.primary == ("softmax.bos_sink_vs_relu", "denied.other_zero_vs_none")
    for key in zoo.STUDY.primary:
        c = claims[key]
        assert c.primary and c.correction == "holm" and c.outcome == "supported" and c.counted
        assert c.is_contrast and c.control is None
        checks = c.check_claims()
        assert {k.key.rsplit(".", 1)[1] for k in checks if k.kind == "check"} == {
            "reached", "errors", "search"}
        assert all(k.outcome == "verified" for k in checks if k.kind == "check")
    sink = claims["softmax.bos_sink_vs_relu"]
    assert sink.effect["groups"] == ["softmax", "relu"] and sink.estimate == 1.0
    assert [(p["setting"], p["k1"], p["n1"], p["k2"], p["n2"]) for p in sink.parts] == [
        ("1x1", 9, 9, 0, 9), ("2x2", 9, 9, 0, 9)]
    scale = next(k for k in sink.check_claims() if k.key.endswith(".scale"))
    assert scale.kind == "descriptive" and "relu: 0 of 18 seeds" in scale.data
    assert "ReLU's non-trigger rows are empty" in sink.sentence  # why ReLU carries no sink
    # the denied contrast pools the rules that solve the task with BOS, by class, per setting
    denied = claims["denied.other_zero_vs_none"]
    assert [(p["setting"], p["k1"], p["n1"], p["k2"], p["n2"]) for p in denied.parts] == [
        ("2x2 removed", 36, 36, 0, 18)]  # where both classes have seeds
    # 1x1 relu_len and uniform do not solve the task with BOS; 1x1 softmax and clipped softmax
    # with BOS removed are forced to fail by a proof: a check, out of the contrast
    assert [p["setting"] for p in claims["denied.no_other_zero.reached"].parts] == [
        "2x2 clipped_softmax removed", "2x2 softmax removed"]
    assert claims["denied.other_zero.reached"].kind == "descriptive"
    for rule in ("softmax", "clipped_softmax", "uniform"):
        check = claims[f"1x1.{rule}.removed.denied_floor"]
        assert check.kind == "check" and check.outcome == "verified"
    assert "2x2.softmax.removed.denied_floor" not in claims
    gated = claims["gated.bos_sink_vs_softmax"]  # it sinks as often as softmax, gate or not
    assert gated.outcome == "undetermined" and gated.correction == "benjamini-hochberg"
    assert gated.effect["estimate"] == 0.0 and not gated.counted
    assert "at least" in claims["gated.bos_sink"].sentence  # its own rate, with its bound
    assert claims["softmax.bos_sink"].kind == "descriptive"
    assert "at most" in claims["relu.bos_sink"].sentence
    assert "relu_len.bos_sink_vs_softmax" not in claims  # free rows: described only
    assert claims["relu_len.bos_sink"].kind == "descriptive"
    assert claims["softpick.bos_sink"].kind == "descriptive"
    assert claims["uniform.no_bos_sink"].kind == "check"  # it cannot sink by construction
    assert claims["uniform.no_bos_sink"].outcome == "verified"
    assert claims["1x1.relu_len.capacity_floor"].outcome == "verified"
    reached = claims["2x2.softmax.reached_stop_rule"]
    assert reached.kind == "descriptive" and reached.sentence.startswith("9 of 9 2x2 softmax")
    assert claims["2x2.softmax.removed.reached_stop_rule"].kind == "descriptive"
    # no empirical claim uses the other arm of its own comparison as a control
    assert all(c.is_contrast and c.control is None for c in claims.values()
               if c.kind == "empirical")
    for c in claims.values():  # no universal word about a rate, and no "solves"
        assert not any(word in c.sentence.lower().split()
                       for word in ("every", "never", "solves", "solved", "converged"))
    records = zoo.STUDY.complete(_records({"softmax": 9}), None)
    assert {e["outcome"] for e in records["entries"]} >= {"reached the stop rule (9 of 9)"}


def test_the_denied_contrast_is_contradicted_when_the_classes_swap():
    claims = _decide(_records({"softmax": 9}, removed={
        "softmax": 9, "clipped_softmax": 9, "relu": 0, "gated": 0, "softpick": 0,
        "relu_len": 0}))
    c = claims["denied.other_zero_vs_none"]
    assert c.outcome == "contradicted" and not c.counted and c.effect["estimate"] == -1.0


def test_the_sink_contrast_is_contradicted_when_relu_sinks_and_softmax_does_not():
    claims = _decide(_records({"relu": 9}))
    c = claims["softmax.bos_sink_vs_relu"]
    assert c.outcome == "contradicted" and not c.counted and c.effect["estimate"] == -1.0
    assert "ReLU's non-trigger rows are on in 18 of the 18" in c.sentence


def test_a_relu_that_sinks_as_softmax_does_leaves_the_sink_contrast_undetermined():
    claims = _decide(_records({"softmax": 9, "relu": 9}))
    c = claims["softmax.bos_sink_vs_relu"]
    assert c.outcome == "undetermined" and c.reason is None and not c.counted
    assert c.effect["estimate"] == 0.0


def test_a_failed_check_keeps_a_supported_contrast_from_counting():
    # ReLU reaches the stop rule in 5 of 9 seeds per configuration against softmax's 9 of 9:
    # the seeds compared would be a selection of ReLU's
    records = _records({"softmax": 9}, converged={"relu": 5})
    c = _decide(records)["softmax.bos_sink_vs_relu"]
    reached = next(k for k in c.check_claims() if k.key.endswith(".reached"))
    assert reached.outcome == "failed"
    assert c.outcome == "supported" and not c.counted
    for run in records["runs"]:  # the same reach, but ReLU's solving seeds err 10 times more
        if run["rule"] == "relu":
            run["converged"], run["test_linf"] = True, 2e-2
    for e in records["entries"]:
        if e["rule"] == "relu":
            e["converged"] = e["n_solved"] = 9
    c = _decide(records)["softmax.bos_sink_vs_relu"]
    checks = {k.key.rsplit(".", 1)[1]: k.outcome for k in c.check_claims()}
    assert checks == {"reached": "verified", "errors": "failed", "search": "verified",
                      "scale": "described"}
    assert c.outcome == "supported" and not c.counted
    for e in records["entries"]:  # and a search stopped at the ladder's end fails its check
        e["at_ladder_end"] = e["rule"] == "softmax" and e["config"] == "2x2"
    for run in records["runs"]:
        run["test_linf"] = 2e-3
    c = _decide(records)["softmax.bos_sink_vs_relu"]
    search_check = next(k for k in c.check_claims() if k.key.endswith(".search"))
    assert search_check.outcome == "failed" and "2x2 softmax" in search_check.data
    assert c.outcome == "supported" and not c.counted


def test_a_rule_with_no_seed_at_the_stop_rule_leaves_its_contrast_undetermined_with_why():
    claims = _decide(_records({"softmax": 9}, converged={"clipped_softmax": 0}))
    c = claims["clipped_softmax.bos_sink_vs_softmax"]
    assert c.outcome == "undetermined" and c.effect["estimate"] is None
    assert c.reason.startswith("only 0 of the 18 clipped_softmax seeds reached the stop rule")
    assert c.needed_text.startswith(c.reason)
    assert claims["clipped_softmax.bos_sink"].sentence.startswith("None of the 18")
    # the paper's ReLU left out of the study: the primary contrast says so, and does not crash
    rules = tuple(r for r in RULE_SET if r != "relu")
    records = _records({"softmax": 9})
    records["entries"] = [e for e in records["entries"] if e["rule"] != "relu"]
    records["runs"] = [r for r in records["runs"] if r["rule"] != "relu"]
    c = _decide(records, rules)["softmax.bos_sink_vs_relu"]
    assert c.outcome == "undetermined" and c.reason == (
        "relu was not trained in this study, so it has no seeds to count")


def test_a_softmax_that_does_not_sink_leaves_the_sink_contrasts_undetermined():
    claims = _decide(_records({}))
    assert claims["softmax.bos_sink"].sentence.startswith("0 of 18 softmax seeds")
    for key in ("softmax.bos_sink_vs_relu", "gated.bos_sink_vs_softmax",
                "clipped_softmax.bos_sink_vs_softmax"):
        c = claims[key]
        assert c.outcome == "undetermined" and not c.counted


def test_sink_claims_count_only_the_seeds_that_reached_the_stop_rule():
    records = _records({"softmax": 5}, converged={"softmax": 5})
    claims = _decide(records)
    c = claims["softmax.bos_sink"]
    assert c.n == 10 and [(p["k"], p["n"]) for p in c.parts] == [(5, 5), (5, 5)]
    assert [(p["k1"], p["n1"]) for p in claims["softmax.bos_sink_vs_relu"].parts] == [
        (5, 5), (5, 5)]


def test_the_checks_fail_on_records_built_to_break_them():
    floor = arguments.capacity_bounds(zoo.run_config("1x1", "relu_len", 1e-3, 0, False, "auto"))[
        "position_free"]["mse_floor"]
    records = _records({"softmax": 9}, capacity_mse=floor / 2)
    for e in records["entries"]:
        if e["rule"] == "uniform":
            e["bos_share_max_on"] = [0.95] + [None] * 8  # a uniform head "sinking"
    claims = _decide(records)
    assert claims["uniform.no_bos_sink"].outcome == "failed"
    assert claims["1x1.relu_len.capacity_floor"].outcome == "failed"


def test_a_mixed_rule_is_pooled_with_its_heterogeneity():
    records = _records({"softmax": 9})
    for e in records["entries"]:
        if e["rule"] == "gated":
            e["bos_sinks"] = 4 if e["config"] == "1x1" else 0
    claims = _decide(records)
    rate = claims["gated.bos_sink"]
    assert [(p["setting"], p["k"], p["n"]) for p in rate.parts] == [("1x1", 4, 9), ("2x2", 0, 9)]
    assert rate.heterogeneity_p < 0.2 and rate.kind == "descriptive"
    c = claims["gated.bos_sink_vs_softmax"]  # sinks less often than softmax, 4 of 18 to 18
    assert [(p["setting"], p["k1"], p["n1"], p["k2"], p["n2"]) for p in c.parts] == [
        ("1x1", 4, 9, 9, 9), ("2x2", 0, 9, 9, 9)]
    assert c.outcome == "supported" and c.estimate == pytest.approx(4 / 18 - 1)


def test_the_argument_floor_check_verifies_trained_errors_and_fails_below_the_floor():
    entry = {"config": "1x1", "rule": "sigmoid", "capacity": "pole_gap",
             "argument_error": [0.05, 0.2, None]}
    check = zoo_claims._argument_check(entry, 7 / 705)
    assert check.kind == "check" and check.outcome == "verified" and check.n == 2
    below = zoo_claims._argument_check({**entry, "argument_error": [0.05, 0.001]}, 7 / 705)
    assert below.outcome == "failed"


def test_the_denied_floor_check_fails_on_a_model_below_it():
    records = _records({"softmax": 9})
    for e in records["entries"]:
        if (e["config"], e["rule"]) == ("1x1", "softmax"):
            e["denied"]["removed"]["denied_error"] = [0.9] * 8 + [0.01]
    assert _decide(records)["1x1.softmax.removed.denied_floor"].outcome == "failed"


def test_records_from_before_the_search_are_refused_in_one_sentence():
    from sinklab.errors import ResultsError

    old = {"entries": [], "capacity": None}  # the zoo's records before it searched its rates
    with pytest.raises(ResultsError, match="written before the zoo searched each rule's "):
        zoo.STUDY.complete(old, None)
    assert zoo.STUDY.complete({**old, "screen": []}, None)["entries"] == []  # the control

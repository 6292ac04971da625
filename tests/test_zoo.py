"""The attention-rule zoo (``sinklab.studies.zoo``): reading "where zero comes from" and "sinks on
BOS" off weights, the outcome labels and the capacity arguments behind "cannot express", the
relative Gu rate's row floor, and ``sinklab zoo`` end to end (learning rate chosen on
validation, claims, resume)."""

from __future__ import annotations

import csv

import pytest
import torch

from sinklab import claims as cl
from sinklab import measure, metrics
from sinklab.attention import RULES, rule_info
from sinklab.config import build_run_config
from sinklab.definitions import default_source
from sinklab.model import AttentionStack
from sinklab.runs.files import read_json
from sinklab.studies import zoo
from sinklab.task import sample_batch
from sinklab.theory import constructions as theory
from test_cli import run_cli


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
    return zoo.bos_shares(summary), zoo.head_sources(summary, rule)


def test_sinking_is_judged_by_the_bos_share_of_rows_that_are_on():
    assert zoo.sinks(*_run([0.50, 0.05], [0.51, 0.5], [0.8, 0.8], "gated"))  # half-open gate
    assert not zoo.sinks(*_run([0.0], [0.0], [3.0], "relu"))  # an all-zero row is no sink
    assert not zoo.sinks(*_run([0.6, 0.3], [1.0, 1.0], [1.0, 1.0], "softmax"))  # under 0.9
    # a sigmoid row of 1e-5 all on BOS: share 1, but the row is off, so it is no sink
    assert not zoo.sinks(*_run([1e-5], [1e-5], [0.24], "sigmoid"))
    assert zoo.bos_shares({"bos_mass_nontrigger": [[0.0, 0.3]],
                           "row_sum_nontrigger": [[0.0, 0.6]]}) == [[None, 0.5]]


def test_outcome_and_share_labels_say_mixed_when_seeds_disagree():
    assert zoo.outcome(5, 5, 3000, None) == "reached the stop rule (5 of 5)"
    assert zoo.outcome(2, 5, 3000, None) == "mixed (2 of 5 reached the stop rule)"
    assert zoo.outcome(0, 5, 3000, None) == "not reached in 3,000 steps"
    assert zoo.outcome(0, 5, 3000, zoo.POSITION_FREE) == "cannot express (argument in the report)"
    # a seed that reaches the stop rule anyway is reported as it is (and flagged)
    assert zoo.outcome(1, 5, 3000, zoo.POSITION_FREE) == "mixed (1 of 5 reached the stop rule)"
    assert [zoo.share_label(k, 5) for k in (5, 0, 3)] == ["yes (5 of 5)", "no (0 of 5)",
                                                          "mixed (3 of 5)"]


def test_capacity_table_and_when_its_arguments_apply():
    assert set(zoo.CAPACITY) == {("1x1", "relu_len"), ("1x1", "relu_raw"), ("1x1", "uniform"),
                                 ("2x2", "uniform")}
    # not sigmoid (it sees the row's length); at 2x2 only uniform, whose stack stays linear (a
    # layer of any other rule can write the position)
    assert not any(rule == "sigmoid" for _config, rule in zoo.CAPACITY)
    assert [rule for config, rule in zoo.CAPACITY if config == "2x2"] == ["uniform"]
    one = zoo.run_config("1x1", "relu_len", 1e-3, 0, False, "auto")
    assert zoo.capacity_applies(one)
    assert not zoo.capacity_applies(zoo.run_config("2x2", "relu_len", 1e-3, 0, False, "auto"))
    two = zoo.run_config("2x2", "uniform", 1e-3, 0, False, "auto")
    assert zoo.capacity_applies(two, zoo.LINEAR_STACK)
    assert not zoo.capacity_applies(two, zoo.FIXED_WEIGHTS)
    assert not zoo.capacity_applies(zoo.run_config("2x2", "uniform", 1e-3, 0, False, "auto",
                                                   model={"block": "standard"}),
                                    zoo.LINEAR_STACK)  # an MLP is not linear
    assert zoo.fixed_weight_rules() == {"uniform"}
    assert not zoo.capacity_applies(zoo.run_config("1x1", "relu_len", 1e-3, 0, False, "auto",
                                                   model={"block": "standard"}))
    assert not zoo.capacity_applies(zoo.run_config("1x1", "relu_len", 1e-3, 0, False, "auto",
                                                   task={"max_triggers": 2}))


def test_capacity_bounds_are_the_stated_formulas():
    bounds = zoo.capacity_bounds(zoo.run_config("1x1", "relu_len", 1e-3, 0, False, "auto"))
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
        floor = zoo.capacity_bounds(cfg)["position_free"]["mse_floor"]
        assert measure.capacity_mse(cfg, model, zoo.CAPACITY_SEQUENCES) >= floor
    cfg, model = _position_free_model(rule, generator, 0.1)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    data = torch.Generator().manual_seed(1)
    for _ in range(300):
        batch = sample_batch(cfg.task, 128, data, residual=cfg.residual)
        loss = (model(batch.x).out[0] - batch.y).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert measure.capacity_mse(cfg, model, zoo.CAPACITY_SEQUENCES) >= floor
    # the paper's ReLU divides by the query's position and so escapes: its exact construction
    cfg, model = theory.relu_construction()
    assert measure.capacity_mse(cfg, model, zoo.CAPACITY_SEQUENCES) < 1e-9


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


def test_cells_keep_the_run_names_and_configs_of_earlier_zoo_folders():
    opts = zoo.ZooOptions(seeds=2, rules=("softmax", "relu"))
    from sinklab.studies.base import Execution

    cells = zoo.cells(opts, Execution())
    names = [c.name for c in cells]
    assert len(names) == len(set(names)) == 2 * 2 * 3 * 2
    assert "runs/1x1_softmax_lr0.001_seed0" in names and "runs/2x2_relu_lr0.0003_seed1" in names
    cell = next(c for c in cells if c.name == "runs/1x1_relu_lr0.003_seed1")
    assert cell.config == build_run_config({
        "model": {"attention": "relu", "n_layers": 1, "n_heads": 1},
        "train": {"seed": 1, "lr": 3e-3, "max_steps": 3000, "device": "auto", "log_every": 10}})
    quick = zoo.cells(zoo.ZooOptions(quick=True, rules=("softmax",)), Execution())
    assert [c.name for c in quick] == ["runs/1x1_softmax_lr0.001_seed0",
                                       "runs/2x2_softmax_lr0.0003_seed0"]


@pytest.fixture
def tiny_zoo(monkeypatch):
    monkeypatch.setattr(zoo, "STEPS", {"1x1": 40, "2x2": 10})
    monkeypatch.setattr(zoo, "QUICK_STEPS", {"1x1": 30, "2x2": 10})
    monkeypatch.setattr(zoo, "LR_GRID", {"1x1": (1e-3, 3e-3), "2x2": (1e-4, 1e-3)})
    return zoo


@pytest.mark.slow
def test_zoo_end_to_end_chooses_lr_on_validation_and_resumes(tmp_path, capsys, tiny_zoo):
    out, docs = tmp_path / "zoo", tmp_path / "docs" / "zoo.md"
    args = ["zoo", "--seeds", "2", "--rules", "softmax,relu_len", "--workers", "1",
            "--out", str(out)]
    code, _, err = run_cli(capsys, *args, "--docs", str(docs))
    assert code == 0, err
    result = read_json(out / "records.json")
    records = result["records"]
    entries = records["entries"]
    assert [(e["config"], e["rule"]) for e in entries] == [
        (c, r) for c in ("1x1", "2x2") for r in ("softmax", "relu_len")]
    for e in entries:
        scores = {s["lr"]: s["validation_mse"] for s in e["validation_mse_by_lr"]}
        assert len(scores) == 2 and e["lr"] == min(scores, key=scores.get)
        assert e["n"] == 2 and e["converged"] == 0  # 40 steps solve nothing
        runs = [r for r in records["runs"] if (r["config"], r["rule"]) == (e["config"], e["rule"])]
        assert len(runs) == 4
        for run in runs:  # validation sequences are not the test sequences
            assert run["validation_mse"] != run["mse"]
            assert set(run["ablated"]) == set(zoo.ABLATION_KEYS)
    by = {(e["config"], e["rule"]): e for e in entries}
    # a proof, not the budget, labels 1x1 relu_len; the same rule at 2x2 gets the budget's label
    assert by["1x1", "relu_len"]["outcome"] == "cannot express (argument in the report)"
    assert by["2x2", "relu_len"]["outcome"] == "not reached in 10 steps"
    assert by["1x1", "softmax"]["outcome"] == "not reached in 40 steps"
    floor = records["capacity"]["position_free"]["mse_floor"]
    assert all(v >= floor for v in by["1x1", "relu_len"]["capacity_mse"])
    assert by["1x1", "softmax"]["capacity_mse"] == [None, None]
    soft = next(r for r in records["runs"] if r["rule"] == "softmax")
    assert soft["gu_rows_ignored"] == 0 and soft["gu_rows"] == 1000 * 16
    claims = {c["key"]: c for c in result["claims"]}
    assert claims["1x1.relu_len.reached_stop_rule"]["kind"] == "descriptive"
    pooled = claims["relu_len.no_bos_sink"]
    assert pooled["rule"] == "rate_at_most" and pooled["n"] == 4
    assert [part["setting"] for part in pooled["parts"]] == ["1x1", "2x2"]
    assert pooled["control"]["setting"].startswith("softmax")
    # the paper's ReLU was not trained: softmax's control is the first rule whose rows need not
    # sum to 1, and the ReLU primary claim has no seeds to decide on
    assert claims["softmax.bos_sink"]["primary"]
    assert claims["softmax.bos_sink"]["control"]["setting"].startswith("relu_len")
    assert claims["relu.no_bos_sink"]["n"] == 0
    assert claims["relu.no_bos_sink"]["outcome"] == "undetermined"
    assert claims["1x1.relu_len.capacity_floor"]["outcome"] == "verified"
    assert claims["1x1.relu_len.capacity_floor"]["kind"] == "check"
    assert "2x2.relu_len.capacity_floor" not in claims
    assert not any(key.endswith(("solves", "sinks_vs_softmax")) for key in claims)
    rows = list(csv.DictReader((out / "entries.csv").read_text().splitlines()))
    assert [r["rule"] for r in rows] == ["softmax", "relu_len", "softmax", "relu_len"]
    assert len(list(csv.DictReader((out / "runs.csv").read_text().splitlines()))) == 16
    text = (out / "ZOO.md").read_text()
    assert text.startswith("# Zoo: which attention rules need a sink\n")
    for section in ("## Verdicts", "**Primary claims**", "## 1x1", "## 2x2",
                    "## Rules that cannot express the task",
                    "## BOS ablation at evaluation", "## Which rules need a BOS sink"):
        assert section in text
    assert "cannot express (argument in the report)" in text and "Var(1/j) / 3" in text
    assert "(figures/fig_zoo_sources.png)" in text and "## Extensions" not in text
    assert (out / "figures" / "fig_zoo_bos.png").is_file()
    assert (docs.parent / "zoo" / "fig_zoo_sources.png").is_file()
    assert docs.read_text().startswith("# Zoo: which attention rules need a sink\n")

    code, _, err = run_cli(capsys, *args)
    assert code == 0 and "0 runs to train in 0 jobs" in err and "16 already finished" in err
    assert "reused from" in err  # the model checks are cached, not computed again


@pytest.mark.parametrize(("extra", "message"), [
    (["--rules", "softmax,bogus"], "--rules: 'bogus' is not a known attention rule: choose from"),
    (["--rules", ","], "--rules needs at least one rule name"),
    (["--rules", "relu,relu"], "--rules lists 'relu' twice"),
    (["--seeds", "0"], "--seeds=0 is not allowed"),
    (["--seeds", "1000000000"], "--seeds 1000000000 declares 78,000,000,000 runs"),
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
    assert len(local) == 4 and local.keys() == remote.keys()
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


def _entry(config, rule, sinks, n=9, converged=None, capacity=None, capacity_mse=None):
    """An entry of ``zoo.entry``'s shape with only what the claims read: ``sinks`` of ``n``
    seeds sink on BOS."""
    return {"config": config, "rule": rule, "row_kind": rule_info(rule).row_kind, "lr": 1e-3,
            "n": n, "converged": n if converged is None else converged, "bos_sinks": sinks,
            "budget": zoo.steps(config, False), "test_linf": [2e-3] * n, "steps": [500] * n,
            "capacity": capacity, "capacity_mse": capacity_mse or [None] * n,
            "bos_share_max_on": [None] * n, "outcome": "old label"}


def _records(sinks, uniform_sinks=0, capacity_mse=0.015):
    """Records of a zoo with softmax, relu, gated, uniform and relu_len, 9 seeds each per
    configuration; ``sinks`` maps a rule to the seeds sinking on BOS in each configuration."""
    bounds = zoo.capacity_bounds(zoo.run_config("1x1", "softmax", 1e-3, 0, False, "auto"))
    entries = []
    for config in zoo.CONFIGS:
        for rule in ("gated", "relu", "relu_len", "softmax", "uniform"):
            capacity = "position_free" if (config, rule) == ("1x1", "relu_len") else None
            entries.append(_entry(config, rule, uniform_sinks if rule == "uniform"
                                  else sinks.get(rule, 0), capacity=capacity,
                                  capacity_mse=[capacity_mse] * 9 if capacity else None))
    return {"entries": entries, "capacity": bounds}


def _decide(records):
    opts = zoo.ZooOptions(seeds=9, rules=("gated", "relu", "relu_len", "softmax", "uniform"))
    return {c.key: c for c in zoo.STUDY.decide(zoo.STUDY.complete(records, opts), opts)}


def test_the_zoo_claims_have_kinds_controls_and_two_pooled_primaries():
    claims = _decide(_records({"softmax": 9, "gated": 9}))
    assert zoo.STUDY.primary == ("softmax.bos_sink", "relu.no_bos_sink")
    for key in zoo.STUDY.primary:
        c = claims[key]
        assert c.primary and c.correction == "holm" and c.outcome == "supported" and c.counted
        assert c.n == 18 >= cl.seeds_all_agreeing(len(zoo.STUDY.primary))
        assert [p["setting"] for p in c.parts] == ["1x1", "2x2"] and c.heterogeneity_p == 1.0
        assert c.control_claim().outcome == "contradicted"
    assert claims["softmax.bos_sink"].control["setting"].startswith("relu")
    assert claims["relu.no_bos_sink"].control["setting"].startswith("softmax")
    assert claims["gated.no_bos_sink"].outcome == "contradicted"  # it sinks though it has a gate
    assert claims["relu_len.no_bos_sink"].correction == "benjamini-hochberg"
    assert claims["uniform.no_bos_sink"].kind == "check"  # it cannot sink by construction
    assert claims["uniform.no_bos_sink"].outcome == "verified"
    assert claims["1x1.relu_len.capacity_floor"].outcome == "verified"
    reached = claims["2x2.softmax.reached_stop_rule"]
    assert reached.kind == "descriptive" and reached.sentence.startswith("9 of 9 2x2 softmax")
    assert {c.kind for c in claims.values() if c.key.endswith("reached_stop_rule")} == {
        "descriptive"}
    assert all(c.control is not None for c in claims.values() if c.kind == "empirical")
    for c in claims.values():  # no universal word about a rate, and no "solves"
        assert not any(word in c.sentence.lower().split()
                       for word in ("every", "never", "solves", "solved", "converged"))
    records = zoo.STUDY.complete(_records({"softmax": 9}), None)
    assert {e["outcome"] for e in records["entries"]} >= {"reached the stop rule (9 of 9)"}


def test_a_relu_that_sinks_contradicts_its_claim_and_makes_softmaxs_non_discriminating():
    claims = _decide(_records({"softmax": 9, "relu": 9}))
    assert claims["relu.no_bos_sink"].outcome == "contradicted"
    soft = claims["softmax.bos_sink"]
    assert soft.outcome == "supported" and soft.standing == "non-discriminating"
    assert not soft.counted


def test_a_softmax_that_does_not_sink_leaves_the_no_sink_claims_non_discriminating():
    claims = _decide(_records({}))
    assert claims["softmax.bos_sink"].outcome == "contradicted"
    for key in ("relu.no_bos_sink", "relu_len.no_bos_sink"):
        c = claims[key]
        assert c.outcome == "supported" and c.standing == "non-discriminating" and not c.counted
    counts = cl.summary_counts(claims.values())
    assert counts["counted"] == 0 and counts["non-discriminating"] == 3


def test_the_checks_fail_on_records_built_to_break_them():
    floor = zoo.capacity_bounds(zoo.run_config("1x1", "relu_len", 1e-3, 0, False, "auto"))[
        "position_free"]["mse_floor"]
    claims = _decide(_records({"softmax": 9}, uniform_sinks=1, capacity_mse=floor / 2))
    assert claims["uniform.no_bos_sink"].outcome == "failed"
    assert claims["1x1.relu_len.capacity_floor"].outcome == "failed"


def test_a_mixed_rule_is_pooled_with_its_heterogeneity_and_left_undetermined():
    records = _records({"softmax": 9})
    for e in records["entries"]:
        if e["rule"] == "relu_len":
            e["bos_sinks"] = 4 if e["config"] == "1x1" else 0
    c = _decide(records)["relu_len.no_bos_sink"]
    assert [(p["setting"], p["k"], p["n"]) for p in c.parts] == [("1x1", 4, 9), ("2x2", 0, 9)]
    assert c.heterogeneity_p < 0.2 and c.outcome == "undetermined" and c.counterexamples == 4

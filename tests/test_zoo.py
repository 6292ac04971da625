"""The attention-rule zoo: reading "where zero comes from" off weights, the learning-rate choice
on validation sequences, and ``sinklab zoo`` end to end."""

from __future__ import annotations

import csv

import pytest

from sinklab.attention import ROW_KIND, RULES
from sinklab.metrics import default_source
from test_cli import run_cli


def test_every_rule_declares_its_row_kind():
    assert set(ROW_KIND) == set(RULES)
    assert set(ROW_KIND.values()) <= {"simplex", "implicit sink", "gated", "free"}


@pytest.mark.parametrize(("bos", "row_nt", "row_t", "kind", "want"), [
    (0.99, 1.0, 1.0, "simplex", "BOS"),            # softmax parked on BOS
    (0.10, 1.0, 1.0, "simplex", "content"),        # uniform: weight on content
    (0.00, 0.00, 3.0, "free", "zero row"),         # ReLU's all-zero row
    (0.42, 0.45, 0.9, "free", "BOS"),              # on, mostly BOS
    (0.01, 0.02, 0.99, "implicit sink", "sink logit"),  # mass went to the implicit sink
    (0.95, 0.98, 0.99, "implicit sink", "BOS"),    # softmax_1 still using BOS
    (0.01, 0.05, 0.80, "gated", "closed gate"),
    (0.49, 0.50, 0.70, "gated", "BOS"),            # gate open, softmax on BOS
    (0.0, 0.0, 0.0, "simplex", "content"),         # degenerate input stays defined
])
def test_default_source_reads_the_mechanism(bos, row_nt, row_t, kind, want):
    assert default_source(bos, row_nt, row_t, kind) == want


@pytest.fixture
def tiny_zoo(monkeypatch):
    from sinklab.experiments import zoo

    monkeypatch.setattr(zoo, "STEPS", {"1x1": 40, "2x2": 10})
    monkeypatch.setattr(zoo, "QUICK_STEPS", {"1x1": 30, "2x2": 10})
    monkeypatch.setattr(zoo, "LR_GRID", {"1x1": (1e-3, 3e-3), "2x2": (1e-4, 1e-3)})
    return zoo


@pytest.mark.slow
def test_zoo_end_to_end_chooses_lr_on_validation_and_resumes(tmp_path, capsys, tiny_zoo):
    out, docs = tmp_path / "zoo", tmp_path / "docs" / "zoo.md"
    args = ["zoo", "--seeds", "2", "--rules", "softmax,relu,gated", "--workers", "1",
            "--no-extensions", "--out", str(out)]
    code, _, err = run_cli(capsys, *args, "--docs", str(docs))
    assert code == 0, err
    result = tiny_zoo.read_json(out / "zoo.json")
    entries = result["entries"]
    assert [(e["config"], e["rule"]) for e in entries] == [
        (c, r) for c in ("1x1", "2x2") for r in ("softmax", "relu", "gated")]
    for e in entries:
        scores = e["validation_mse_by_lr"]
        assert len(scores) == 2 and float(e["lr"]) == float(min(scores, key=scores.get))
        assert len(e["runs"]) == 4 and e["chosen"]["n"] == 2
        for run in e["runs"]:  # validation sequences are not the test sequences
            assert run["validation_mse"] != run["mse"]
            assert set(run["bos_ablated"]) == {"linf_trigger", "linf_nontrigger",
                                               "mse_trigger", "mse_nontrigger"}
        if e["rule"] == "softmax":  # hiding BOS changes a softmax model's outputs
            assert run["bos_ablated"]["mse_nontrigger"] != run["mse_nontrigger"]
    rows = list(csv.DictReader((out / "zoo.csv").read_text().splitlines()))
    assert len(rows) == 6 and rows[0]["rule"] == "softmax" and rows[0]["config"] == "1x1"
    text = (out / "ZOO.md").read_text()
    assert "## 1x1" in text and "## 2x2" in text and "| gated |" in text
    assert "## BOS ablation at evaluation" in text
    assert result["extensions"] is None and "## Extensions" not in text
    assert "(figures/fig_zoo_sources.png)" in text
    assert (out / "figures" / "fig_zoo_bos.png").is_file()
    assert (docs.parent / "zoo" / "fig_zoo_sources.png").is_file()

    code, _, err = run_cli(capsys, *args)
    assert code == 0 and "0 runs to train in 0 jobs" in err and "24 already finished" in err


@pytest.mark.parametrize(("extra", "message"), [
    (["--rules", "softmax,bogus"], "--rules: 'bogus' is not a known attention rule: choose from"),
    (["--rules", ","], "--rules needs at least one rule name"),
    (["--seeds", "0"], "--seeds=0 is not allowed"),
])
def test_zoo_bad_input_is_one_sentence(tmp_path, capsys, extra, message):
    code, _, err = run_cli(capsys, "zoo", "--out", str(tmp_path / "z"), *extra)
    assert code == 2 and message in err and "Traceback" not in err
    assert not (tmp_path / "z").exists()


@pytest.mark.slow
def test_zoo_quick_runs_every_rule(tmp_path, capsys, tiny_zoo):
    code, _, err = run_cli(capsys, "zoo", "--quick", "--workers", "1", "--out",
                           str(tmp_path / "z"))
    assert code == 0, err
    result = tiny_zoo.read_json(tmp_path / "z" / "zoo.json")
    assert result["quick"] and {e["rule"] for e in result["entries"]} == set(RULES)
    assert all(e["chosen"]["n"] == 1 and len(e["validation_mse_by_lr"]) == 1
               for e in result["entries"])
    text = (tmp_path / "z" / "ZOO.md").read_text()
    assert "quick mode" in text
    # the extensions, in their quick form, with every sweep reported
    extensions = result["extensions"]
    assert [e["seq_len"] for e in extensions["seq_len"]] == [8, 16, 32, 8, 16, 32]
    assert len(extensions["trigger"]) == 6 and len(extensions["block"]) == 4
    for e in extensions["length"]:
        for run in e["runs"]:
            own = next(t for t in run["tests"] if (t["seq_len"], t["trigger"]) == (16, 7))
            summary = tiny_zoo.read_json(tiny_zoo.run_dir(tmp_path / "z", e["config"], e["rule"],
                                                          1e-3, 0) / "summary.json")
            # the L = 16 test is the run's own test set: the same number, computed twice
            assert own["linf_nontrigger"] == pytest.approx(summary["linf_nontrigger"])
    for e in extensions["emergence"]:  # logged every LOG_EVERY steps up to the stop step
        assert e["runs"][0]["step"][:3] == [0, tiny_zoo.LOG_EVERY, 2 * tiny_zoo.LOG_EVERY]
    for section in ("## Extensions", "### Sequence length", "### Trigger frequency",
                    "### Length generalisation", "### The standard block", "### Sink emergence"):
        assert section in text
    rows = list(csv.DictReader((tmp_path / "z" / "extensions.csv").read_text().splitlines()))
    assert {r["sweep"] for r in rows} == {"seq_len", "trigger", "block", "length"}
    for name in ("seq_len", "trigger", "length", "block", "emergence"):
        assert (tmp_path / "z" / "figures" / f"fig_ext_{name}.png").is_file()


def test_sinking_is_judged_by_the_bos_share_of_rows_that_are_on():
    from sinklab.experiments.zoo import sinks, verdict

    def run(bos, row_nt, row_t, rule, converged=True):
        summary = {"bos_mass_nontrigger": [bos], "row_sum_nontrigger": [row_nt],
                   "row_sum_trigger": [row_t], "converged": converged}
        sources = [[default_source(b, rn, rt, ROW_KIND[rule])
                    for b, rn, rt in zip(bos, row_nt, row_t)]]
        r = {**summary, "sources": sources}
        return {**r, "sinks": sinks(r, rule)}

    gated = run([0.50, 0.05], [0.51, 0.5], [0.8, 0.8], "gated")  # half-open gate over BOS
    relu = run([0.0], [0.0], [3.0], "relu")  # an all-zero row is not a sink
    spread = run([0.6, 0.3], [1.0, 1.0], [1.0, 1.0], "softmax")  # BOS-heavy, under 0.9
    assert gated["sinks"] and not relu["sinks"] and not spread["sinks"]
    assert verdict([gated, gated]).startswith("sinks on BOS whenever it solves the task (2/2")
    assert verdict([relu, gated]).startswith("solves the task without a BOS sink (1/2")
    assert verdict([run([0.0], [0.0], [3.0], "relu", converged=False)]).startswith("no verdict")


@pytest.mark.slow
def test_zoo_on_ray_stores_what_the_local_executor_stores(tmp_path, capsys, tiny_zoo, request):
    pytest.importorskip("ray")
    from sinklab.sweeps.store import Store

    args = ["zoo", "--quick", "--no-extensions", "--rules", "softmax,relu", "--workers", "2"]
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

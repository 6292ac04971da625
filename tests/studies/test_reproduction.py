"""``sinklab reproduce`` as a study: the quick end to end run with its records, claims, report,
resume and refusals; the claims it makes, decided on constructed records; and the head summaries'
independence from head order."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers import run_cli
from sinklab import claims as cl
from sinklab.claims import CONTRADICTED, DESCRIPTIVE, EMPIRICAL, SUPPORTED, UNDETERMINED
from sinklab.config import build_run_config
from sinklab.runs import folders
from sinklab.runs.files import read_json, write_json
from sinklab.stats import ALPHA, MIN_N, fisher, stratified_exact_p
from sinklab.studies import render
from sinklab.studies import reproduce as rp
from sinklab.studies.reference import PAPER
from sinklab.studies.reproduce_analysis import layer_summaries
from sinklab.studies.runner import run_all
from sinklab.studies.study import Execution
from sinklab.sweeps.plan import Job


@pytest.fixture
def tiny_reproduce(monkeypatch):
    """--quick with multi-layer runs capped at 20 steps, so the whole thing takes seconds."""
    monkeypatch.setattr(rp, "QUICK_MAX_STEPS", 20)


@pytest.mark.slow
def test_reproduce_quick_report_resume_and_errors(tmp_path, capsys, tiny_reproduce):
    out = tmp_path / "rep"
    docs = tmp_path / "docs" / "reproduction.md"
    code, stdout, err = run_cli(capsys, "reproduce", "--quick", "--workers", "1", "--out",
                                str(out), "--docs", str(docs))
    assert code == 0, err
    result = read_json(out / "records.json")
    runs = result["records"]["runs"]
    assert [(r["experiment"], r["rule"]) for r in runs] == [
        (e, rule) for e in ("1x1", "2x2", "4x4") for rule in ("softmax", "relu")]
    for r in runs:
        layers, heads = rp.EXPERIMENTS[r["experiment"]]
        assert len(r["bos_mass_nontrigger"]) == layers
        assert all(len(row) == heads for row in r["bos_mass_trigger"])
        assert isinstance(r["sink_heads"], int) and isinstance(r["steps"], int)
        assert "test_linf" in r and "linf_error" not in r
    soft = runs[0]
    assert soft["converged"] and soft["bos_mass_nontrigger"][0][0] >= 0.95
    claims = {c["key"]: c for c in result["claims"]}
    # one seed of each configuration cannot decide the primary contrast; reaching the stop rule
    # is described, not claimed
    assert claims[rp.CONTRAST]["outcome"] == UNDETERMINED and claims[rp.CONTRAST]["primary"]
    assert claims["2x2.softmax.reached_stop"]["kind"] == "descriptive"
    report = (out / "REPORT.md").read_text()
    assert report.startswith("# sinklab reproduction report\n")
    # the first screen, in the report and the printout alike: what was decided, before any table
    first = render.headline([cl.Claim.from_dict(c) for c in result["claims"]])
    assert report.startswith("# sinklab reproduction report\n\n" + "\n".join(first) + "\n\n")
    assert stdout.splitlines()[:-1] == [*first, f"wrote {out / 'REPORT.md'}"]
    assert stdout.splitlines()[-1].startswith("took ")  # its wall and CPU time
    assert first[1].startswith(f"- `{rp.CONTRAST}`: undetermined at n = ") and len(first) == 3
    assert "**Primary claims**" in report and "quick mode" in report
    # and says what would decide it
    assert (f"{rp.DEFAULT_SEEDS} seeds of each configuration, every one reaching the stop rule "
            "and agreeing, would decide it") in report
    assert "reached the stop rule (a training batch with L∞ below" in report
    for fig in ("fig_1x1", "fig_2x2_softmax", "fig_4x4_relu", "fig_bos_mass",
                "fig_sorted_bos_4x4"):
        assert (out / "figures" / f"{fig}.png").is_file()
        assert (docs.parent / "reproduction" / f"{fig}.png").is_file()
    assert "(reproduction/fig_1x1.png)" in docs.read_text()
    assert (out / "claims.csv").read_text().count("\n") == len(result["claims"]) + 1
    assert (out / "layers.csv").is_file() and (out / "runs.csv").is_file()

    # The runs went through the sweep machinery: the folder's store lists them.
    code, listing, _ = run_cli(capsys, "results", str(out), "--status", "done")
    assert code == 0 and listing.count("runs/") == 6 and "runs/1x1_softmax_seed0" in listing

    # Resume: nothing is retrained, the report is rebuilt from the finished runs.
    code, _, err = run_cli(capsys, "reproduce", "--quick", "--workers", "1", "--out", str(out))
    assert code == 0 and "0 runs to train in 0 jobs" in err and "6 already finished" in err

    # An interrupted run (marker, config and log written, no completion record) is trained
    # again.
    interrupted = out / "runs" / "2x2_relu_seed0"
    (interrupted / "summary.json").unlink()
    write_json(interrupted / "sinklab.json", {"kind": "run", "format": 1})
    code, _, err = run_cli(capsys, "reproduce", "--quick", "--workers", "1", "--out", str(out))
    assert code == 0 and "1 runs to train in 1 jobs" in err and "5 already finished" in err
    assert read_json(out / "runs" / "2x2_relu_seed0" / "summary.json")["steps"] == 20
    history = read_json(out / "sinklab.json")["invocations"]
    assert [h["runs_trained"] for h in history] == [6, 0, 1]
    # the report names the command that wrote it and every invocation in the folder's history
    assert (out / "REPORT.md").read_text().count("`sinklab reproduce --quick") == 1 + 3

    # Other settings in the same folder are refused, not mixed in.
    code, _, err = run_cli(capsys, "reproduce", "--seeds", "1", "--out", str(out))
    assert code == 2 and "holds a run with different settings" in err

    # A damaged finished run is named, not reused and not overwritten.
    run = out / "runs" / "1x1_relu_seed0"
    weights = (run / "model.pt").read_bytes()
    (run / "model.pt").write_bytes(weights[:100])
    code, _, err = run_cli(capsys, "reproduce", "--quick", "--out", str(out))
    assert code == 2 and err.count("\n") == 1
    assert f"{run / 'model.pt'} is 100 bytes, not the {len(weights)} it had" in err
    (run / "model.pt").write_bytes(weights)
    (run / "summary.json").unlink()
    code, _, err = run_cli(capsys, "reproduce", "--quick", "--out", str(out))
    assert code == 2 and "summary.json is missing from a finished run" in err


def test_reproduce_refuses_a_foreign_folder(tmp_path, capsys):
    (tmp_path / "data.csv").write_text("a,b\n")
    code, _, err = run_cli(capsys, "reproduce", "--quick", "--out", str(tmp_path))
    assert code == 2 and "is not an empty folder or a sinklab reproduce folder" in err


def test_reproduce_options_from_a_file_and_overrides(tmp_path):
    config = tmp_path / "r.toml"
    config.write_text("[reproduce]\nseeds = 12\nquick = true\n")
    from sinklab.studies.options import build_options

    opts = build_options(rp.STUDY, str(config), ["reproduce.seeds=4"])
    assert opts == rp.ReproduceOptions(seeds=4, quick=True)
    assert build_options(rp.STUDY).seeds == rp.DEFAULT_SEEDS
    assert build_options(rp.STUDY, flags={"quick": True}).seeds == rp.QUICK_SEEDS


@pytest.mark.slow
def test_worker_processes_write_the_same_results(tmp_path):
    def jobs(root):
        out = []
        for rule in ("softmax", "relu"):
            cfg = build_run_config({"model": {"attention": rule, "n_layers": 2, "n_heads": 2},
                                    "train": {"max_steps": 15}, "eval": {"n_sequences": 32}})
            out.append(Job(f"2x2 {rule}", [rule], [cfg]))
        return out

    for name, workers in (("pool", 2), ("serial", 1)):
        with folders.writing(tmp_path / name, "reproduce"):
            run_all(jobs(tmp_path / name), workers=workers, log=lambda line: None,
                    out=tmp_path / name, exe=Execution(workers=workers), origin="reproduce")
    for rule in ("softmax", "relu"):
        a = read_json(tmp_path / "pool" / rule / "summary.json")
        b = read_json(tmp_path / "serial" / rule / "summary.json")
        assert a["steps"] == b["steps"] == 15
        assert a["mse"] == pytest.approx(b["mse"], rel=1e-5)


# ---------------------------------------------------------------- claims on constructed data


def _run(experiment, rule, seed, per_layer_bos, converged=True, steps=None, row_sums=None):
    """A run record with the given non-trigger BOS masses [layer][head]: softmax rows sum to
    1, ReLU rows to their BOS mass unless ``row_sums`` says otherwise; every trigger row puts
    1/7 on each of keys 1..7 and none on BOS (it sums to 1)."""
    sinks = [sum(v >= 0.9 for v in layer) for layer in per_layer_bos]
    ref = PAPER[(experiment, rule)].steps
    shape = [[0.0] * len(layer) for layer in per_layer_bos]
    if row_sums is None:
        row_sums = ([[1.0] * len(layer) for layer in per_layer_bos] if rule == "softmax"
                    else per_layer_bos)
    return {"experiment": experiment, "rule": rule, "seed": seed, "converged": converged,
            "status": "converged" if converged else "max_steps", "steps": steps or ref,
            "bos_mass_nontrigger": per_layer_bos, "sink_heads_per_layer": sinks,
            "sink_heads": sum(sinks), "trigger_key_mean": [[1 / 7] * len(per_layer_bos[0])]
            * len(per_layer_bos), "bos_mass_trigger": shape, "row_sum_nontrigger": row_sums,
            "test_linf": 1e-3, "train_linf": 4e-3}


def _records(n_seeds, four_by_four_layer1_sink):
    runs = []
    for seed in range(n_seeds):
        runs.append(_run("1x1", "softmax", seed, [[0.999]]))
        runs.append(_run("1x1", "relu", seed, [[0.0]]))
        runs.append(_run("2x2", "softmax", seed, [[0.95, 0.99], [0.97, 0.92]]))
        runs.append(_run("2x2", "relu", seed, [[0.0, 0.0], [0.0, 0.01]]))
        first = [0.95, 0.2, 0.1, 0.1] if four_by_four_layer1_sink else [0.3, 0.2, 0.1, 0.1]
        runs.append(_run("4x4", "softmax", seed, [first, [1.0, 0.2, 0.1, 0.1],
                                                  [0.99, 0.2, 0.1, 0.1], [0.2, 0.95, 0.1, 0.1]]))
        runs.append(_run("4x4", "relu", seed, [[0.0] * 4] * 4))
    return {"runs": runs, "protocol": {"eval_trigger": 7, "tol": 0.005}}


def _decided(records, seeds):
    return {c.key: c for c in rp.STUDY.decide(records, rp.ReproduceOptions(seeds=seeds))}


def _checks(claim):
    return {c.key: c for c in claim.check_claims()}


def test_claims_on_ten_seeds_decide_the_primary_contrast_and_describe_the_rest():
    claims = _decided(_records(10, False), 10)
    contrast = claims[rp.CONTRAST]  # 30 of 30 against 0 of 30, pooled by configuration
    assert contrast.outcome == SUPPORTED and contrast.counted and contrast.is_contrast
    assert contrast.primary and contrast.correction == cl.HOLM and contrast.control is None
    assert [(p["n1"], p["n2"]) for p in contrast.parts] == [(10, 10)] * 3
    assert contrast.effect["estimate"] == 1.0 and contrast.effect["groups"] == ["softmax", "ReLU"]
    assert {k: c.outcome for k, c in _checks(contrast).items()} == {
        "sinks.both_rules_reached_stop": cl.VERIFIED, "sinks.relu_scale": cl.VERIFIED,
        "sinks.relu_bos_share": cl.DESCRIBED}
    # the only empirical claim: each rule's own rate is described, with its bound in the sentence
    assert [c.key for c in claims.values() if c.kind == EMPIRICAL] == [rp.CONTRAST]
    softmax, relu = claims["softmax.sink_rate"], claims["relu.sink_rate"]
    assert softmax.kind == relu.kind == DESCRIPTIVE
    assert softmax.sentence.endswith(cl.bound_words(30, 30, above=True))
    assert relu.sentence.endswith(cl.bound_words(0, 30, above=False))
    assert claims["2x2.softmax.like_the_figure"].kind == DESCRIPTIVE
    assert claims["2x2.softmax.like_the_figure"].sentence.startswith("10 of 10")
    # against the reference code's 3 of 5 seeds: described with its Fisher p-value, no verdict
    ref = claims["4x4.softmax.sink_in_layer_1_vs_reference"]
    assert ref.kind == DESCRIPTIVE and ref.p_value == pytest.approx(fisher(0, 10, 3, 5))
    assert all(c.kind in (DESCRIPTIVE, EMPIRICAL) for c in claims.values())


def test_claims_on_one_seed_say_they_cannot_decide():
    contrast = _decided(_records(1, False), 1)[rp.CONTRAST]
    assert contrast.outcome == UNDETERMINED and not contrast.counted
    assert f"fewer than the {MIN_N} a decision needs" in contrast.needed_text
    assert contrast.p_value == pytest.approx(rp.agreeing_p(1))


def test_agreeing_p_is_the_stratified_exact_test_on_agreeing_seeds():
    for seeds in range(1, 7):
        for configs in (1, 2, 3):
            tables = [(seeds, seeds, 0, seeds)] * configs
            assert rp.agreeing_p(seeds, configs) == pytest.approx(
                stratified_exact_p(tables, greater=True), rel=1e-9)


def test_the_default_seeds_are_the_fewest_that_decide_the_primary_contrast():
    """Every seed agreeing, the default seed count decides the primary contrast through the
    study's own claims (supported, counted, no check failed); one seed fewer per configuration
    does not."""
    n = rp.DEFAULT_SEEDS
    assert rp.ReproduceOptions().seeds == n and 1 < n <= rp.MAX_DEFAULT_SEEDS
    c = _decided(_records(n, False), n)[rp.CONTRAST]
    assert c.primary and c.correction == cl.HOLM and c.n == 2 * n * len(rp.EXPERIMENTS)
    assert c.outcome == SUPPORTED and c.counted
    assert c.adjusted_p == pytest.approx(rp.agreeing_p(n))
    fewer = _decided(_records(n - 1, False), n - 1)[rp.CONTRAST]
    assert fewer.outcome == UNDETERMINED and not fewer.counted


def test_decisive_seeds_is_the_fewest_meeting_both_conditions_and_is_capped():
    def decides(seeds, m, configs):
        return (seeds * configs >= MIN_N
                and rp.agreeing_p(seeds, configs) < ALPHA / m)

    for m in (1, 2, 4):
        for configs in (1, 2, 3):
            s = rp.decisive_seeds(n_primary=m, n_configurations=configs)
            assert decides(s, m, configs)
            assert not any(decides(fewer, m, configs) for fewer in range(1, s))
    # no number up to the cap decides them: the cap
    assert not decides(rp.MAX_DEFAULT_SEEDS, 10**6, 1)
    assert rp.decisive_seeds(n_primary=10**6, n_configurations=1) == rp.MAX_DEFAULT_SEEDS
    assert rp.decisive_seeds(n_primary=10**40) == rp.MAX_DEFAULT_SEEDS


def test_the_contrast_turns_around_when_relu_sinks_and_softmax_does_not():
    """Records built to contradict it: softmax models without a sink head and ReLU models with
    one contradict the contrast; with neither rule sinking there is no evidence either way."""
    records = _records(10, False)
    for r in records["runs"]:
        r["sink_heads"] = 1 if r["rule"] == "relu" else 0
    assert _decided(records, 10)[rp.CONTRAST].outcome == CONTRADICTED
    for r in records["runs"]:
        r["sink_heads"] = 0
    assert _decided(records, 10)[rp.CONTRAST].outcome == UNDETERMINED


def test_the_contrast_is_not_counted_when_one_rule_missed_the_stop_rule():
    records = _records(10, False)
    for r in records["runs"]:
        if (r["experiment"], r["rule"]) == ("2x2", "relu") and r["seed"] < 2:
            r["converged"], r["status"] = False, "max_steps"
    contrast = _decided(records, 10)[rp.CONTRAST]
    assert contrast.outcome == SUPPORTED and not contrast.counted
    reached = _checks(contrast)["sinks.both_rules_reached_stop"]
    assert reached.outcome == cl.FAILED and reached.estimate == pytest.approx(0.2)
    assert "2x2: softmax 10/10" in reached.data and "ReLU 8/10" in reached.data


def test_the_contrast_is_not_counted_when_relu_sinks_below_the_threshold_by_scale():
    """A ReLU head whose rows are on (half its trigger row's sum) and all on BOS, at a BOS mass
    of 0.5: a sink by its share of the row that the absolute threshold misses."""
    records = _records(10, False)
    head = next(r for r in records["runs"]
                if (r["experiment"], r["rule"], r["seed"]) == ("1x1", "relu", 0))
    head["bos_mass_nontrigger"], head["row_sum_nontrigger"] = [[0.5]], [[0.5]]
    contrast = _decided(records, 10)[rp.CONTRAST]
    assert contrast.outcome == SUPPORTED and not contrast.counted
    checks = _checks(contrast)
    assert checks["sinks.relu_scale"].outcome == cl.FAILED
    assert checks["sinks.relu_scale"].estimate == 1
    assert "1 of 210 heads" in checks["sinks.relu_bos_share"].data
    # a row that is off (below OFF_ROW of its trigger row's sum) is not a sink, whatever its
    # share on BOS: ReLU's leftover weight in rows it has turned off
    head["bos_mass_nontrigger"], head["row_sum_nontrigger"] = [[0.01]], [[0.01]]
    assert _decided(records, 10)[rp.CONTRAST].counted


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 2**32 - 1))
def test_layer_summaries_do_not_depend_on_head_order(seed):
    rng = random.Random(seed)
    records = _records(4, True)
    for r in records["runs"]:
        r["bos_mass_nontrigger"] = [[rng.random() for _ in layer]
                                    for layer in r["bos_mass_nontrigger"]]
        r["sink_heads_per_layer"] = [sum(v >= 0.9 for v in layer)
                                     for layer in r["bos_mass_nontrigger"]]
    before = layer_summaries(records["runs"], "4x4", "softmax")
    for r in records["runs"]:
        for layer in r["bos_mass_nontrigger"]:
            rng.shuffle(layer)
    after = layer_summaries(records["runs"], "4x4", "softmax")
    assert before == after
    assert all(row["sorted_bos_max"] == sorted(row["sorted_bos_max"], reverse=True)
               or len(row["sorted_bos_max"]) == 1 for row in before)


def test_big_models_train_one_job_per_seed_on_a_cpu_and_one_ensemble_on_a_gpu(monkeypatch):
    """On a CPU each 4x4 seed is its own job (an ensemble saves nothing there) and the small
    models share one per (configuration, rule); on a GPU every configuration's seeds are one
    ensemble on the device."""
    import torch

    from sinklab import train

    opts = rp.ReproduceOptions(seeds=3)
    chunks = {(c.group, c.chunk) for c in rp.cells(opts, Execution(device="cpu"))}
    assert chunks == {(("1x1", r), None) for r in rp.RULES} | {
        (("2x2", r), None) for r in rp.RULES} | {(("4x4", r), 1) for r in rp.RULES}
    monkeypatch.setattr(train, "resolve_device", lambda name, flag="": torch.device("cuda"))
    exe = Execution(device="cpu")
    exe.device = "cuda"  # after the check: this machine has no GPU
    gpu = rp.cells(opts, exe)
    assert {c.chunk for c in gpu} == {None}

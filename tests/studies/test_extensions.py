"""``sinklab extensions`` (``sinklab.studies.extensions`` and ``extensions_analysis``): which
runs the sweeps train (with the stable names and settings, so another folder's runs are adopted),
the evaluations they add checked on exact constructions, the per-seed readings of sink fate and
emergence, the claims, and the study end to end with ``--reuse``."""

from __future__ import annotations

import csv
import json

import pytest

from helpers import DOCS, run_cli
from sinklab import claims, measure
from sinklab.config import build_run_config
from sinklab.runs import folders
from sinklab.runs.files import read_json, write_json
from sinklab.studies import extensions as ext
from sinklab.studies import extensions_analysis as exa
from sinklab.studies.runner import adopt_runs
from sinklab.studies.study import Execution
from sinklab.theory import constructions as theory
from sinklab.train import check_compatible, save_member


def test_setting_names_mark_only_what_differs_from_the_paper():
    assert ext.setting_name({}, {}) == ""
    assert ext.setting_name({"seq_len": 16, "max_triggers": 1}, {"block": "attention"}) == ""
    assert ext.setting_name({"seq_len": 64}, {}) == "_L64"
    assert ext.setting_name({"no_trigger_prob": 0.5, "max_triggers": 4}, {}) == "_none0.5_k4"
    assert ext.setting_name({}, {"block": "standard"}) == "_standard"


def test_sweeps_train_each_run_once_under_stable_names(tmp_path):
    from sinklab.sweeps.plan import plan, unique_cells

    opts = ext.ExtensionsOptions(seeds=2)
    cells = ext.cells(opts, Execution())
    unique = unique_cells(cells)  # the L = 16 run is named by three sweeps, with one config
    n_per = len(ext.SEQ_LENS) + len(ext.FREQUENCIES) + 2 * len(ext.BLOCKS)
    assert len(cells) == n_per * len(ext.RULES) * 2
    # per rule and seed, the plain run stands for L = 16, (0, 1) and the 1x1 attention block
    assert len(unique) == len(cells) - 2 * len(ext.RULES) * 2
    plain = {f"runs/{cfg}_{r}_lr{ext.LR[cfg]:g}_seed{s}" for cfg in ("1x1", "2x2")
             for r in ext.RULES for s in range(2)}
    assert plain <= {c.name for c in unique}  # the plain runs keep the older zoo's names
    for cell in unique:
        if cell.name in plain:
            assert cell.config.train.max_steps == ext.STEPS[cell.name[5:8]]
            assert cell.config.train.log_every == ext.LOG_EVERY
    jobs, done = plan(tmp_path, cells, print)
    assert done == 0 and sum(len(j.configs) for j in jobs) == len(unique)
    for job in jobs:
        check_compatible(job.configs)  # members differ only in seed
    assert jobs[0].configs[0].task.seq_len == 128  # the longest jobs start first


def test_trigger_frequency_sweep_trains_on_its_own_task():
    cells = ext.cells(ext.ExtensionsOptions(seeds=1), Execution())
    cell = next(c for c in cells
                if c.config.task.max_triggers == 4 and c.config.task.no_trigger_prob == 0.5)
    assert cell.name == "runs/1x1_softmax_lr0.001_none0.5_k4_seed0"
    assert cell.config.model.attention == "softmax" and cell.config.task.eval_trigger == 7
    assert cell.config.train.log_every == ext.LOG_EVERY
    standard = [c for c in cells if c.config.model.block == "standard"]
    assert {c.config.model.n_layers for c in standard} == {1, 2}
    assert all(c.config.task.target == "residual" for c in standard)
    quick = ext.cells(ext.ExtensionsOptions(quick=True), Execution())
    assert {c.config.train.max_steps for c in quick} == {ext.QUICK_STEPS["1x1"]}
    assert not any(c.config.model.n_layers == 2 for c in quick)


def _as_run(model_and_cfg, path):
    """A hand-built model as a finished run folder: marker, config, weights, completion record."""
    cfg, model = model_and_cfg
    path.mkdir(parents=True)
    folders.mark(path, "run")
    write_json(path / "config.json", cfg.to_dict())
    save_member(model.float(), 0, path / "model.pt")
    folders.seal(path)
    return path


def test_length_generalisation_of_exact_constructions(tmp_path):
    relu = _as_run(theory.relu_construction(), tmp_path / "relu")
    rows = measure.length_evaluation(relu, exa.EVAL_LENGTHS)
    assert [(r["seq_len"], r["trigger"]) for r in rows] == [
        (16, 7), (16, 15), (32, 7), (32, 31), (64, 7), (64, 63)]
    for r in rows:  # the construction has no notion of length: exact everywhere, no sink
        assert r["linf_nontrigger"] == 0 and r["linf_trigger"] < 1e-5 and r["bos_max"] == 0

    sink = _as_run(theory.softmax_sink(8.0), tmp_path / "sink")
    rows = [r for r in measure.length_evaluation(sink, exa.EVAL_LENGTHS) if r["trigger"] == 7]
    errors = [r["linf_nontrigger"] for r in rows]
    bos = [r["bos_max"] for r in rows]
    # BOS's fixed logit gap is shared by more keys as L grows: less BOS weight, more error
    assert errors[0] < errors[1] < errors[2] and bos[0] > bos[1] > bos[2]
    assert bos[0] == pytest.approx(1 - sum(i / (2980.96 + i) for i in range(1, 16) if i != 7)
                                   / 14, abs=1e-3)


def test_mixed_evaluation_splits_errors_by_trigger_count(tmp_path):
    relu = _as_run(theory.relu_construction(), tmp_path / "relu")
    mixed = measure.mixed_evaluation(relu, exa.MIXED, exa.MIXED_SEQUENCES)
    assert mixed["n_none"] + mixed["n_one"] + mixed["n_several"] == exa.MIXED_SEQUENCES
    assert min(mixed["n_none"], mixed["n_one"], mixed["n_several"]) > 200
    # the ReLU construction averages at every trigger row, however many there are
    assert mixed["linf_none"] == 0 and mixed["linf_one"] < 1e-5 and mixed["linf_several"] < 1e-5
    assert mixed["bos_max"] == 0
    sink = _as_run(theory.softmax_sink(4.0), tmp_path / "sink")
    mixed = measure.mixed_evaluation(sink, exa.MIXED, exa.MIXED_SEQUENCES)
    assert mixed["linf_none"] > 0.05 and mixed["bos_max"] > 0.5  # a leaky sink leaks everywhere


@pytest.mark.parametrize(("bos", "self_mass", "fate"), [
    (0.99, 0.0, "sink"), (0.3, 0.8, "self"), (0.3, 0.1, "none"), (0.95, 0.9, "sink")])
def test_fate_is_read_per_seed(bos, self_mass, fate):
    assert exa.fate({"bos_max": bos, "self_max": self_mass}) == fate


def test_emergence_reads_landmarks_off_the_training_log(tmp_path):
    # an older log calls the training batch's L∞ "linf"; read_log reads it as train_linf
    rows = [{"step": s, "loss": 0.1, "linf": lin, "bos_mass_nontrigger": [[0.1, b]]}
            for s, lin, b in [(0, 0.9, 0.2), (10, 0.5, 0.6), (20, 0.08, 0.7), (30, 0.2, 0.95),
                              (40, 0.004, 0.99)]]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    got = exa.emergence(tmp_path)
    assert got["step"] == [0, 10, 20, 30, 40] and got["bos_max"][0] == 0.2
    assert got["train_linf"] == [0.9, 0.5, 0.08, 0.2, 0.004]
    assert got["bos0.5_step"] == 10 and got["bos0.9_step"] == 30
    assert got["error_drop_step"] == 20  # the sink was half-formed before the error dropped
    assert exa.first_step(rows, "linf", lambda v: v < 1e-9) is None


def _settings(bos: dict[str, list[float]], converged: bool = True, share: float | None = None,
              error: dict[str, float] | None = None):
    """Per rule, two settings of runs with the given BOS weights (split in halves); every run's
    rows are recorded as empty (no BOS share) unless ``share`` is given, and its test L∞ is
    ``error[rule]`` (0.004 by default)."""
    out = {}
    for rule, values in bos.items():
        rows = [{"bos_max": b, "converged": converged, "row_sum_max": 0.01,
                 "bos_share_on": share, "test_linf": (error or {}).get(rule, 0.004)}
                for b in values]
        half = len(rows) // 2
        out[rule] = [("A", rows[:half]), ("B", rows[half:])]
    return out


def _check(claim, name):
    return next(c for c in claim.check_claims() if c.key.endswith(name))


def test_sink_contrast_compares_the_rules_once_pooled_over_settings():
    settings = _settings({"softmax": [0.99] * 10, "relu": [0.01] * 10})
    contrast, soft, relu = exa.sink_contrast("k", "at L = 8", settings)
    assert contrast.key == "k.sink" and contrast.rule == "rates_contrast" and contrast.n == 20
    assert contrast.control is None and contrast.effect["groups"] == ["softmax", "ReLU"]
    assert [(q["setting"], q["k1"], q["n1"], q["k2"], q["n2"]) for q in contrast.parts] == [
        ("A", 5, 5, 0, 5), ("B", 5, 5, 0, 5)]
    assert contrast.outcome == "supported" and contrast.counted
    assert [c.outcome for c in contrast.check_claims()] == ["verified"] * 3
    # each rule's own rate is described, with the bound its data give
    assert (soft.key, relu.key) == ("k.softmax.sink", "k.relu.sink")
    assert soft.kind == relu.kind == "descriptive" and soft.bound > 0.7 and relu.bound < 0.3
    assert "10 of 10, at least 74% of seeds (one-sided 95%)" in soft.sentence
    assert "0 of 10, at most 26% of seeds (one-sided 95%)" in relu.sentence
    assert exa._within(0.01, 0.005) and not exa._within(0.0101, 0.005)
    assert exa._within(0.0, 0.0) and not exa._within(None, 0.1)


def test_sink_contrast_is_contradicted_on_seeds_built_to_contradict_it():
    # softmax seeds without a sink head, ReLU seeds with one: the comparison comes out reversed
    settings = _settings({"softmax": [0.2] * 10, "relu": [0.99] * 10})
    contrast = exa.sink_contrast("k", "at L = 8", settings)[0]
    assert contrast.outcome == "contradicted" and not contrast.counted
    assert contrast.effect["estimate"] == -1.0
    # both rules sink: no difference to find, so nothing is supported
    same = exa.sink_contrast("k", "at L = 8", _settings({"softmax": [0.99] * 10,
                                                          "relu": [0.95] * 10}))[0]
    assert same.outcome == "undetermined" and not same.counted
    # too few seeds in a group: no decision
    few = exa.sink_contrast("k", "at L = 8", _settings({"softmax": [0.99] * 4,
                                                         "relu": [0.0] * 4}))[0]
    assert few.outcome == "undetermined" and "fewer than the 5" in few.needed_text


@pytest.mark.parametrize(("settings", "failed"), [
    # ReLU puts 0.95 of its (tiny) non-empty rows on BOS: a sink the absolute threshold misses
    (_settings({"softmax": [0.99] * 10, "relu": [0.01] * 10}, share=0.95), "scale"),
    # ReLU's rows were never measured: the share is unknown
    ({r: [(s, [{k: v for k, v in row.items() if k != "row_sum_max"} for row in rows])
          for s, rows in parts] for r, parts in
      _settings({"softmax": [0.99] * 10, "relu": [0.01] * 10}).items()}, "scale"),
    # ReLU trained to 5x softmax's error
    (_settings({"softmax": [0.99] * 10, "relu": [0.01] * 10},
               error={"softmax": 0.004, "relu": 0.02}), "errors"),
])
def test_a_sink_contrast_is_not_counted_when_a_check_beside_it_fails(settings, failed):
    contrast = exa.sink_contrast("k", "at L = 8", settings)[0]
    assert contrast.outcome == "supported"
    assert _check(contrast, failed).outcome == "failed" and not contrast.counted
    assert claims.summary_counts([contrast])[claims.CHECK_FAILED] == 1


def test_trained_checks_compare_stop_rule_shares_and_errors():
    def rows(reached, n, error):
        return [{"converged": i < reached, "test_linf": error} for i in range(n)]

    shares, errors = exa.trained_checks("k", ("a", "b"), rows(10, 10, 0.004), rows(7, 10, 0.004))
    assert shares.outcome == "failed" and shares.estimate == pytest.approx(0.3)
    assert errors.outcome == "verified" and errors.estimate == 1.0
    shares, errors = exa.trained_checks("k", ("a", "b"), rows(9, 10, 0.004), rows(10, 10, 0.0))
    assert shares.outcome == "verified" and errors.outcome == "failed"  # 0 against 0.004
    assert [c.outcome for c in exa.trained_checks("k", ("a", "b"), rows(9, 10, 0.1), [])] == [
        "failed", "failed"]  # an empty group passes nothing


def test_row_scale_reads_bos_share_of_the_rows_that_are_not_empty():
    summary = {"bos_mass_nontrigger": [[0.001, 0.3]], "row_sum_nontrigger": [[0.002, 0.4]],
               "row_sum_trigger": [[1.0, 1.0]]}
    # head 0's rows are empty (0.002 of its trigger row): its 0.5 share does not count
    assert exa._row_scale(summary) == {"row_sum_max": 0.4, "bos_share_on": pytest.approx(0.75)}
    summary["row_sum_nontrigger"] = [[0.002, 0.1]]
    assert exa._row_scale(summary) == {"row_sum_max": 0.1, "bos_share_on": None}
    assert exa._row_scale({"bos_mass_nontrigger": [[0.5]]}) == {"row_sum_max": None,
                                                                 "bos_share_on": None}


def test_solves_is_descriptive_with_the_test_errors_beside_it():
    rows = [{"converged": c, "test_linf": e} for c, e in ((True, 0.004), (True, 0.007),
                                                          (False, 0.2))]
    claim = exa.solves_claim("k", "relu", "at L = 8", [("L=8", rows)], 0.005)
    assert claim.kind == "descriptive" and claim.outcome == "described"
    assert claim.sentence == "2 of 3 ReLU seeds at L = 8 reached the stop rule"
    assert "above the tolerance 0.005 in 2 of 3" in claim.data


def _committed():
    path = DOCS / "extensions.json"
    result = read_json(path)
    return result["records"], ext.ExtensionsOptions(**result["options"])


def test_committed_claims_are_contrasts_with_checks_and_no_mirror_controls():
    from sinklab import stats

    records, opts = _committed()
    decided = ext.STUDY.decide(records, opts)
    by_key = {c.key: c for c in decided}
    assert set(ext.STUDY.primary) == {"seq_len.sink"}
    primary = by_key["seq_len.sink"]
    assert primary.primary and primary.correction == "holm" and primary.is_contrast
    assert len(primary.parts) == len(ext.SEQ_LENS)
    assert min(min(q["n1"], q["n2"]) for q in primary.parts) * len(ext.SEQ_LENS) >= stats.MIN_N
    for c in decided:
        assert c.kind in ("empirical", "descriptive")
        assert c.control is None  # no claim has the other arm of its comparison as control
        for word in ("every", "never", "no seed", "all seeds", "converged", "solves"):
            assert word not in c.sentence.lower(), (c.key, word)  # words a rate cannot carry
        if c.kind == "empirical":
            assert c.rule == "rates_contrast" and len(c.check_claims()) >= 2
    # a sink contrast reads ReLU's scale; the standard block's, with no seed at the stop rule,
    # is described
    assert _check(primary, "scale") and by_key["block.sink"].kind == "descriptive"
    assert claims.summary_counts(decided)["contrasts"] == sum(
        c.kind == "empirical" for c in decided)


def test_committed_claims_can_fail_when_the_records_say_otherwise():
    records, opts = _committed()
    records = json.loads(json.dumps(records))
    for row in records["seq_len"]:  # the softmax seeds lose their sink, ReLU seeds gain one
        row["bos_max"] = 0.1 if row["rule"] == "softmax" else 0.99
    by_key = {c.key: c for c in ext.STUDY.decide(records, opts)}
    for key in ext.STUDY.primary:
        assert by_key[key].outcome == "contradicted" and by_key[key].adjusted_p_against < 0.05
    for row in records["trigger"]:  # softmax loses its error on several triggers, ReLU keeps it
        one = row["mixed_linf_one"]
        row["mixed_linf_several"] = one if row["rule"] == "relu" else 10 * one
    by_key = {c.key: c for c in ext.STUDY.decide(records, opts)}
    assert by_key["trigger.several_unseen"].outcome == "contradicted"
    assert by_key["trigger.relu.several_seen"].outcome == "undetermined"  # ReLU keeps it anyway


def test_committed_sink_contrast_is_counted_only_once_relu_rows_are_measured():
    records, opts = _committed()
    records = json.loads(json.dumps(records))
    decided = {c.key: c for c in ext.STUDY.decide(records, opts)}
    primary = decided["seq_len.sink"]  # these records hold no row sums: the scale is unknown
    assert primary.outcome == "supported" and not primary.counted
    assert "hold no row sums" in _check(primary, "scale").sentence
    for share, counted in ((None, True), (0.95, False)):
        for row in records["seq_len"]:  # ReLU's rows empty, or tiny with most of them on BOS
            row.update(row_sum_max=1.0 if row["rule"] == "softmax" else 0.01,
                       bos_share_on=row["bos_max"] if row["rule"] == "softmax" else share)
        primary = {c.key: c for c in ext.STUDY.decide(records, opts)}["seq_len.sink"]
        assert primary.outcome == "supported" and primary.counted == counted


def _finished_zoo_run(root, cell):
    """A sealed run folder (no training) with the cell's config, as another folder holds it."""
    path = root / cell.name
    path.mkdir(parents=True)
    folders.mark(path, "run")
    write_json(path / "config.json", cell.config.to_dict())
    write_json(path / "summary.json", {"seed": cell.config.train.seed})
    (path / "model.pt").write_bytes(b"weights")
    folders.seal(path)
    (path / "lengths.json").write_text("[]")  # an older sinklab's cache: not adopted
    return path


def test_adopt_runs_links_finished_runs_with_the_same_settings(tmp_path):
    opts = ext.ExtensionsOptions(seeds=1, quick=True)
    cells = ext.cells(opts, Execution())
    source, out = tmp_path / "zoo", tmp_path / "ext"
    same = _finished_zoo_run(source, cells[0])
    other = cells[1]
    changed = type(other)(other.name, build_run_config({"model": {"attention": "relu"},
                                                        "train": {"lr": 3e-3, "max_steps": 600}}))
    _finished_zoo_run(source, changed)  # same name, other settings: left alone
    (source / cells[2].name).mkdir(parents=True)  # unfinished: left alone
    lines = []
    out.mkdir()
    assert adopt_runs(out, cells, source, lines.append) == 1
    assert "adopted 1 finished run(s); 1 of the same name have other settings" in lines[-1]
    got = out / cells[0].name
    assert folders.check_complete(got) and not (got / "lengths.json").exists()
    assert (got / "model.pt").stat().st_ino == (same / "model.pt").stat().st_ino  # a link
    assert not (out / cells[1].name).exists() and not (out / cells[2].name).exists()
    assert adopt_runs(out, cells, source, lines.append) == 0  # what it has is left to the planner


@pytest.fixture
def tiny(monkeypatch):
    monkeypatch.setattr(ext, "QUICK_STEPS", {"1x1": 30, "2x2": 10})
    monkeypatch.setattr(ext, "QUICK_SEQ_LENS", (8, 16))
    monkeypatch.setattr(ext, "QUICK_FREQUENCIES", ((0.0, 1), (0.5, 2)))


@pytest.mark.slow
def test_extensions_end_to_end_reuse_another_folder(tmp_path, capsys, tiny):
    first, out = tmp_path / "first", tmp_path / "ext"
    code, _, err = run_cli(capsys, "extensions", "--quick", "--workers", "1", "--out", str(first))
    assert code == 0, err
    trained = sum(1 for _ in (first / "runs").iterdir())
    docs = tmp_path / "docs" / "extensions.md"
    args = ["extensions", "--quick", "--workers", "1", "--out", str(out)]
    code, _, err = run_cli(capsys, *args, "--reuse", str(first), "--docs", str(docs))
    assert code == 0, err
    # every run of the first folder has this study's names and settings: adopted, not trained
    assert f"adopted {trained} finished run(s)" in err
    assert f"0 runs to train in 0 jobs on 1 worker(s); {trained} already finished" in err
    result = read_json(out / "records.json")
    records = result["records"]
    assert result["options"]["reuse"] == str(first)
    assert [(g["rule"], g["seq_len"]) for g in records["seq_len_groups"]] == [
        (r, n) for r in ext.RULES for n in (8, 16)]
    assert len(records["trigger_groups"]) == 4 and len(records["block_groups"]) == 4
    for row in records["length"]:
        if (row["seq_len"], row["trigger"]) == (16, 7):  # the run's own test set, recomputed
            summary = read_json(out / ext.run_name(row["config"], row["rule"], row["seed"])
                                / "summary.json")
            assert row["linf_nontrigger"] == pytest.approx(summary["linf_nontrigger"])
    for curve in records["curves"]:  # logged every LOG_EVERY steps up to the stop step
        assert curve["step"][:3] == [0, ext.LOG_EVERY, 2 * ext.LOG_EVERY]
    rules = {c["key"]: c["rule"] for c in result["claims"]}
    for key in ("seq_len.sink", "trigger.sink", "trigger.several_unseen", "block.sink",
                "length.nontrigger", "emergence.bos_half"):
        assert rules[key] in ("rates_contrast", "descriptive"), key  # block: unless unsolved
    for key in ("seq_len.softmax.sink", "seq_len.relu.sink", "seq_len.relu.solves",
                "trigger.relu.several_unseen", "block.softmax.self", "length.relu.nontrigger",
                "length.softmax.trigger", "emergence.softmax.sink_first",
                "emergence.relu.bos_half"):
        assert rules[key] == "descriptive", key
    assert rules["seq_len.sink"] == "rates_contrast"
    for row in records["seq_len"]:  # fresh runs record ReLU's row sums for the scale check
        assert row["row_sum_max"] is not None
    assert {c["key"] for c in result["claims"] if c["primary"]} == set(ext.PRIMARY)
    text = (out / "EXTENSIONS.md").read_text()
    assert text.startswith("# Extensions: past the paper's setting\n")
    for section in ("## Sequence length", "## Trigger frequency", "## Length generalisation",
                    "## The standard block", "## Sink emergence", "## How the claims are decided"):
        assert section in text
    for name in ("seq_len", "trigger", "length", "block", "emergence"):
        assert (out / "figures" / f"fig_ext_{name}.png").is_file()
        assert (docs.parent / "extensions" / f"fig_ext_{name}.png").is_file()
        assert list(csv.DictReader((out / f"{name}.csv").read_text().splitlines()))
    code, _, err = run_cli(capsys, *args)
    assert code == 0 and "0 runs to train" in err


@pytest.mark.parametrize(("extra", "message"), [
    (["--seeds", "0"], "--seeds=0 is not allowed"),
    (["--reuse", "/nonexistent/zoo"], "--reuse /nonexistent/zoo does not exist"),
    (["--seeds", "1000000000"], "--seeds 1000000000 declares"),
])
def test_extensions_bad_input_is_one_sentence(tmp_path, capsys, extra, message):
    code, _, err = run_cli(capsys, "extensions", "--out", str(tmp_path / "e"), *extra)
    assert code == 2 and message in err and "Traceback" not in err
    assert not (tmp_path / "e").exists()

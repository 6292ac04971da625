"""The zoo's extensions: which runs the sweeps train (and share with the zoo), the evaluations
they add, checked on exact constructions, and the readings of sink fate and emergence."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sinklab import theory
from sinklab.experiments import extensions as ext
from sinklab.experiments import zoo
from sinklab.results import write_json
from sinklab.train import check_compatible, save_member


def test_setting_names_mark_only_what_differs_from_the_paper():
    assert ext.setting_name({}, {}) == ""
    assert ext.setting_name({"seq_len": 16, "max_triggers": 1}, {"block": "attention"}) == ""
    assert ext.setting_name({"seq_len": 64}, {}) == "_L64"
    assert ext.setting_name({"no_trigger_prob": 0.5, "max_triggers": 4}, {}) == "_none0.5_k4"
    assert ext.setting_name({}, {"block": "standard"}) == "_standard"


def test_sweeps_share_the_zoo_runs_and_train_compatible_ensembles(tmp_path):
    opts = zoo.ZooOptions(seeds=2)
    jobs, done = zoo.plan(tmp_path, opts)
    assert done == 0
    paths = [p for job in jobs for p in job.run_dirs]
    assert len(paths) == len(set(paths))  # every run trained once
    for job in jobs:
        check_compatible(job.configs)  # members differ only in seed and learning rate
    zoo_paths = {c.path for c in zoo.zoo_cells(tmp_path, opts)}
    ext_cells = ext.cells(tmp_path, opts)
    shared = [c for c in ext_cells if c.path in zoo_paths]
    # L = 16, P(no trigger) 0, one trigger and the attention block are the same zoo run
    for seed in range(2):
        assert zoo.run_dir(tmp_path, "1x1", "softmax", 1e-3, seed) in {c.path for c in shared}
        assert zoo.run_dir(tmp_path, "2x2", "relu", 3e-4, seed) in {c.path for c in shared}
    for cell in shared:  # the zoo's run and the sweep's run are one config
        twin = next(c for c in zoo.zoo_cells(tmp_path, opts) if c.path == cell.path)
        assert twin.cfg == cell.cfg
    n_ext = len(ext.SEQ_LENS) + len(ext.FREQUENCIES) + 2 * len(ext.BLOCKS)  # per rule and seed
    assert len(ext_cells) == n_ext * len(ext.RULES) * 2
    assert len(paths) == len(zoo_paths) + len(ext_cells) - len(shared)
    longest = jobs[0].configs[0]
    assert longest.task.seq_len == 128  # the longest jobs start first
    without, _ = zoo.plan(tmp_path, zoo.ZooOptions(seeds=2, extensions=False))
    assert sum(len(j.run_dirs) for j in without) == len(zoo_paths)


def _as_run(model_and_cfg, path):
    """A hand-built model as a finished run folder: marker, config, weights, completion record."""
    from sinklab import folders

    cfg, model = model_and_cfg
    path.mkdir(parents=True)
    folders.mark(path, "run")
    write_json(path / "config.json", cfg.to_dict())
    save_member(model.float(), 0, path / "model.pt")
    folders.seal(path)
    return path


def test_length_generalisation_of_exact_constructions(tmp_path):
    relu = _as_run(theory.relu_construction(), tmp_path / "relu")
    rows = ext.length_evaluation(relu)
    assert [(r["seq_len"], r["trigger"]) for r in rows] == [
        (16, 7), (16, 15), (32, 7), (32, 31), (64, 7), (64, 63)]
    for r in rows:  # the construction has no notion of length: exact everywhere, no sink
        assert r["linf_nontrigger"] == 0 and r["linf_trigger"] < 1e-5 and r["bos_max"] == 0
    assert json.loads((relu / "lengths.json").read_text()) == rows  # cached with the run

    sink = _as_run(theory.softmax_sink(8.0), tmp_path / "sink")
    rows = [r for r in ext.length_evaluation(sink) if r["trigger"] == 7]
    errors = [r["linf_nontrigger"] for r in rows]
    bos = [r["bos_max"] for r in rows]
    # BOS's fixed logit gap is shared by more keys as L grows: less BOS mass, more error
    assert errors[0] < errors[1] < errors[2] and bos[0] > bos[1] > bos[2]
    assert bos[0] == pytest.approx(1 - sum(i / (2980.96 + i) for i in range(1, 16) if i != 7)
                                   / 14, abs=1e-3)


def test_mixed_evaluation_splits_errors_by_trigger_count(tmp_path):
    relu = _as_run(theory.relu_construction(), tmp_path / "relu")
    mixed = ext.mixed_evaluation(relu)
    assert mixed["n_none"] + mixed["n_one"] + mixed["n_several"] == ext.MIXED_SEQUENCES
    assert min(mixed["n_none"], mixed["n_one"], mixed["n_several"]) > 200
    # the ReLU construction averages at every trigger row, however many there are
    assert mixed["linf_none"] == 0 and mixed["linf_one"] < 1e-5 and mixed["linf_several"] < 1e-5
    assert mixed["bos_max"] == 0
    sink = _as_run(theory.softmax_sink(4.0), tmp_path / "sink")
    mixed = ext.mixed_evaluation(sink)
    assert mixed["linf_none"] > 0.05 and mixed["bos_max"] > 0.5  # a leaky sink leaks everywhere


def _block_entry(block, bos, self_mass, rule="softmax"):
    return {"config": "1x1", "rule": rule, "block": block,
            "runs": [{"bos_max": b, "self_max": s} for b, s in zip(bos, self_mass)]}


@pytest.mark.parametrize(("bos", "self_mass", "fate"), [
    ([0.99, 0.97], [0.0, 0.0], "survives"),
    ([0.3, 0.4], [0.8, 0.7], "moves to the query itself"),
    ([0.3, 0.4], [0.1, 0.2], "vanishes"),
])
def test_sink_fate_compares_with_the_attention_only_model(bos, self_mass, fate):
    base = _block_entry("attention", [0.99, 0.99], [0.0, 0.0])
    entry = _block_entry("standard", bos, self_mass)
    assert ext.sink_fate(base, [base, entry]) == "baseline"
    assert ext.sink_fate(entry, [base, entry]) == fate
    no_sink = _block_entry("attention", [0.0, 0.0], [0.0, 0.0], "relu")
    appears = _block_entry("standard", [0.95, 0.95], [0.0, 0.0], "relu")
    assert ext.sink_fate(appears, [no_sink, appears]) == "appears"


def test_emergence_reads_landmarks_off_the_training_log(tmp_path):
    rows = [{"step": s, "loss": 0.1, "linf": lin, "bos_mass_nontrigger": [[0.1, b]]}
            for s, lin, b in [(0, 0.9, 0.2), (10, 0.5, 0.6), (20, 0.08, 0.7), (30, 0.2, 0.95),
                              (40, 0.004, 0.99)]]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    got = ext.emergence(tmp_path)
    assert got["step"] == [0, 10, 20, 30, 40] and got["bos_max"][0] == 0.2
    assert got["bos0.5_step"] == 10 and got["bos0.9_step"] == 30
    assert got["error_drop_step"] == 20  # the sink was half-formed before the error dropped
    assert ext.first_step(rows, "linf", lambda v: v < 1e-9) is None


def test_trigger_frequency_sweep_trains_on_its_own_task():
    cell = next(c for c in ext.cells(Path("/x"), zoo.ZooOptions(seeds=1))
                if c.cfg.task.max_triggers == 4 and c.cfg.task.no_trigger_prob == 0.5)
    assert cell.path.name == "1x1_softmax_lr0.001_none0.5_k4_seed0"
    assert cell.cfg.model.attention == "softmax" and cell.cfg.task.eval_trigger == 7
    assert cell.cfg.train.log_every == zoo.LOG_EVERY
    standard = [c for c in ext.cells(Path("/x"), zoo.ZooOptions(seeds=1))
                if c.cfg.model.block == "standard"]
    assert {c.config for c in standard} == {"1x1", "2x2"}
    assert all(c.cfg.task.target == "residual" for c in standard)

"""The command line, in-process: train writes a run folder, plot draws its maps, reproduce
writes its report and resumes (tests/test_bad_input.py has every kind of bad input)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from sinklab import folders
from sinklab.cli import main
from sinklab.experiments import reproduce as rep
from sinklab.results import read_json, read_metrics, write_json


def run_cli(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_train_writes_the_run_folder(tmp_path, capsys):
    out = tmp_path / "run"
    code, stdout, err = run_cli(capsys, "train", "model.attention=relu", "train.max_steps=30",
                                "train.log_every=10", "eval.n_sequences=64", "--out", str(out))
    assert code == 0, err
    assert sorted(p.name for p in out.iterdir() if p.name not in folders.LEFTOVERS) == [
        "attention.npz", "config.json", "metrics.jsonl", "model.pt", "sinklab.json",
        "summary.json"]
    summary = read_json(out / "summary.json")
    for key in ("attention", "n_layers", "n_heads", "seq_len", "d_model", "seed", "steps",
                "converged", "linf_error", "mse", "bos_mass_nontrigger", "bos_mass_trigger",
                "sink_heads"):
        assert key in summary, key
    assert summary["attention"] == "relu" and summary["steps"] == 30
    assert [r["step"] for r in read_metrics(out / "metrics.jsonl")] == [0, 10, 20, 30]
    assert "relu 1x1, seed 0: stopped without converging at 30 steps" in stdout
    assert stdout.endswith(f"  wrote {out}/: config.json metrics.jsonl attention.npz model.pt "
                           f"summary.json sinklab.json\ndraw the attention maps: sinklab plot "
                           f"{out}\n")
    # overrides may also follow the options
    code, _, err = run_cli(capsys, "train", "--out", str(tmp_path / "after"), "train.max_steps=3",
                           "eval.n_sequences=8")
    assert code == 0, err
    assert read_json(tmp_path / "after" / "summary.json")["steps"] == 3
    # a finished run is never overwritten
    code, _, err = run_cli(capsys, "train", "--out", str(out))
    assert code == 2 and "already holds a finished run" in err


def test_train_diverged_exits_1_and_keeps_logs(tmp_path, capsys):
    out = tmp_path / "div"
    code, _, err = run_cli(capsys, "train", "model.attention=relu", "model.init_std=1e4",
                           "eval.n_sequences=16", "--out", str(out))
    assert code == 1
    assert "diverged at step 0" in err and err.count("\n") == 1
    assert (out / "metrics.jsonl").is_file() and (out / "summary.json").is_file()
    code, stdout, err = run_cli(capsys, "plot", str(out))  # its maps are not finite
    assert code == 0 and stdout == "" and err == f"sinklab: left out: {out} diverged, so it has " \
        "no maps to draw.\n"
    assert not (out / "attention.png").exists() and folders.check_complete(out)


def test_train_refuses_a_foreign_folder(tmp_path, capsys):
    (tmp_path / "notes.txt").write_text("mine")
    code, _, err = run_cli(capsys, "train", "--out", str(tmp_path))
    assert code == 2 and "is not an empty folder or a sinklab run folder" in err
    assert (tmp_path / "notes.txt").read_text() == "mine"


def is_png(path) -> bool:
    from PIL import Image

    with Image.open(path) as image:
        image.verify()
        return image.format == "PNG" and min(image.size) > 100


def test_plot_draws_finished_runs_and_leaves_them_finished(tmp_path, capsys):
    from test_faults import holder, stop

    run, seeds = tmp_path / "run", tmp_path / "seeds"
    tiny = ["train.max_steps=2", "eval.n_sequences=8"]
    assert run_cli(capsys, "train", *tiny, "--out", str(run))[0] == 0
    assert run_cli(capsys, "train", *tiny, "model.n_layers=2", "model.n_heads=2", "--seeds", "2",
                   "--out", str(seeds))[0] == 0
    runs = [run, seeds / "seed0", seeds / "seed1"]
    # a run named twice (itself and in its --seeds folder) is drawn once
    code, stdout, err = run_cli(capsys, "plot", str(run), str(seeds), str(seeds / "seed1"))
    assert code == 0 and err == ""
    assert stdout.splitlines() == [f"wrote {r / 'attention.png'}" for r in runs]
    for r in runs:
        assert is_png(r / "attention.png")
        assert folders.check_complete(r)
        assert "attention.png" not in read_json(r / "sinklab.json")["complete"]["files"]
    first = (run / "attention.png").read_bytes()
    assert run_cli(capsys, "plot", str(run))[0] == 0
    assert (run / "attention.png").read_bytes() == first  # drawing again gives the same bytes
    # an older sinklab recorded the figure in the completion record: drawing it again (or
    # deleting it) leaves the run finished
    record = read_json(run / "sinklab.json")["complete"]
    record["files"]["attention.png"] = {"bytes": 1, "sha256": "0" * 64}
    folders.update_marker(run, complete=record)
    assert folders.check_complete(run)
    assert run_cli(capsys, "plot", str(run))[0] == 0 and folders.check_complete(run)
    # a run another process is writing is refused before anything is drawn
    for r in runs[1:]:
        (r / "attention.png").unlink()
    proc = holder(run, "run")
    try:
        code, _, err = run_cli(capsys, "plot", str(seeds), str(run))
    finally:
        stop(proc)
    assert code == 2 and f"{run} is being written by another sinklab process (pid {proc.pid}," \
        in err and err.count("\n") == 1
    assert not any((r / "attention.png").exists() for r in runs[1:])


def test_train_draws_no_figure(tmp_path):
    # `sinklab train --seeds N` finishes its runs without drawing: matplotlib is never imported
    code = ("import sys; from sinklab.cli import main; code = main(sys.argv[1:]); "
            "print(code, 'matplotlib' in sys.modules, 'sinklab.plots' in sys.modules)")
    out = tmp_path / "seeds"
    result = subprocess.run([sys.executable, "-c", code, "train", "train.max_steps=1",
                             "eval.n_sequences=8", "--seeds", "4", "--out", str(out)],
                            capture_output=True, text=True, check=True)
    assert result.stdout.splitlines()[-1] == "0 False False", result.stdout
    assert result.stdout.splitlines()[-2] == f"draw the attention maps: sinklab plot {out}"
    assert len(list(out.glob("seed*/summary.json"))) == 4 and not list(out.rglob("*.png"))


@pytest.fixture
def tiny_reproduce(monkeypatch):
    """--quick with multi-layer runs capped at 20 steps, so the whole thing takes seconds."""
    monkeypatch.setattr(rep, "QUICK_MAX_STEPS", 20)


@pytest.mark.slow
def test_reproduce_quick_report_resume_and_errors(tmp_path, capsys, tiny_reproduce):
    out = tmp_path / "rep"
    docs = tmp_path / "docs" / "reproduction.md"
    code, stdout, err = run_cli(capsys, "reproduce", "--quick", "--workers", "1", "--out",
                                str(out), "--docs", str(docs))
    assert code == 0, err
    summary = read_json(out / "summary.json")
    runs = summary["runs"]
    assert [(r["experiment"], r["attention"]) for r in runs] == [
        (e, rule) for e in ("1x1", "2x2", "4x4") for rule in ("softmax", "relu")]
    for r in runs:
        layers, heads = rep.EXPERIMENTS[r["experiment"]]
        assert (r["n_layers"], r["n_heads"]) == (layers, heads)
        assert len(r["bos_mass_nontrigger"]) == layers
        assert all(len(row) == heads for row in r["bos_mass_trigger"])
        assert isinstance(r["sink_heads"], int) and isinstance(r["steps"], int)
    soft = runs[0]
    assert soft["converged"] and soft["bos_mass_nontrigger"][0][0] >= 0.95
    report = (out / "REPORT.md").read_text()
    assert "| 1x1 softmax sinks, every seed | >= 0.95 |" in report
    assert "| 2x2 softmax reaches the stop rule | every seed | 0/1 seeds | FAIL |" in report
    assert "quick mode" in report
    for fig in ("fig_1x1", "fig_2x2_softmax", "fig_4x4_relu", "fig_bos_mass"):
        assert (out / "figures" / f"{fig}.png").is_file()
        assert (docs.parent / "reproduction" / f"{fig}.png").is_file()
    assert "(reproduction/fig_1x1.png)" in docs.read_text()
    # the docs version links the zoo's report and its Extensions part
    assert "[Zoo](zoo.md)" in docs.read_text() and "(zoo.md#extensions)" in docs.read_text()
    assert "## Extensions" in report and "sinklab zoo --out <dir>" in report
    assert "[Real models](real-models.md)" in docs.read_text() and "sinklab lm" in report

    # The runs went through the sweep machinery: the folder's store lists them.
    code, listing, _ = run_cli(capsys, "results", str(out), "--status", "done")
    assert code == 0 and listing.count("runs/") == 6 and "runs/1x1_softmax_seed0" in listing
    assert (out / "results.csv").is_file()

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

    # Other settings in the same folder are refused, not mixed in.
    code, _, err = run_cli(capsys, "reproduce", "--seeds", "1", "--out", str(out))
    assert code == 2 and "holds a run with different settings" in err

    # A damaged finished run is named, not reused and not overwritten: a truncated model.pt,
    # a missing file, a changed summary, each checked against the run's completion record.
    run = out / "runs" / "1x1_relu_seed0"
    weights = (run / "model.pt").read_bytes()
    (run / "model.pt").write_bytes(weights[:100])
    code, _, err = run_cli(capsys, "reproduce", "--quick", "--out", str(out))
    assert code == 2 and err.count("\n") == 1
    assert f"{run / 'model.pt'} is 100 bytes, not the {len(weights)} it had" in err
    assert (run / "model.pt").read_bytes() == weights[:100]
    (run / "model.pt").write_bytes(weights)
    summary_text = (run / "summary.json").read_text()
    (run / "summary.json").write_text(summary_text.replace('"relu"', '"RELU"'))
    code, _, err = run_cli(capsys, "reproduce", "--quick", "--out", str(out))
    assert code == 2 and "summary.json has changed since the run finished" in err
    (run / "summary.json").unlink()
    code, _, err = run_cli(capsys, "reproduce", "--quick", "--out", str(out))
    assert code == 2 and "summary.json is missing from a finished run" in err


def test_reproduce_refuses_a_foreign_folder(tmp_path, capsys):
    (tmp_path / "data.csv").write_text("a,b\n")
    code, _, err = run_cli(capsys, "reproduce", "--quick", "--out", str(tmp_path))
    assert code == 2 and "is not an empty folder or a sinklab reproduce folder" in err


@pytest.mark.slow
def test_worker_processes_write_the_same_results(tmp_path):
    from sinklab.config import build_run_config

    def jobs(root):
        out = []
        for rule in ("softmax", "relu"):
            cfg = build_run_config({"model": {"attention": rule, "n_layers": 2, "n_heads": 2},
                                    "train": {"max_steps": 15}, "eval": {"n_sequences": 32}})
            out.append(rep.Job("2x2", rule, [cfg], [root / rule]))
        return out

    for name, workers in (("pool", 2), ("serial", 1)):
        with folders.writing(tmp_path / name, "reproduce"):
            rep.run_all(jobs(tmp_path / name), workers=workers, log=lambda line: None,
                        out=tmp_path / name)
    for rule in ("softmax", "relu"):
        a = read_json(tmp_path / "pool" / rule / "summary.json")
        b = read_json(tmp_path / "serial" / rule / "summary.json")
        assert a["steps"] == b["steps"] == 15
        assert a["mse"] == pytest.approx(b["mse"], rel=1e-5)


def test_python_dash_m_and_help():
    result = subprocess.run([sys.executable, "-m", "sinklab", "--help"], capture_output=True,
                            text=True, check=True)
    assert "reproduce" in result.stdout and "train" in result.stdout
    result = subprocess.run([sys.executable, "-m", "sinklab", "train", "--help"],
                            capture_output=True, text=True, check=True)
    assert "model.attention=softmax" in result.stdout


def test_rules_lists_the_registry(capsys):
    code, out, _ = run_cli(capsys, "rules")
    from sinklab.attention import RULES

    assert code == 0
    assert [line.split()[0] for line in out.splitlines()] == sorted(RULES)


def test_import_has_no_side_effects(tmp_path):
    code = ("import os, sys; os.chdir(sys.argv[1]); import sinklab, sinklab.cli, "
            "sinklab.experiments.reproduce; print(sorted(os.listdir('.')))")
    result = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True,
                            text=True, check=True)
    assert result.stdout.strip() == "[]" and result.stderr == ""


def test_train_seeds_runs_an_ensemble_equal_to_single_runs(tmp_path, capsys):
    common = ["model.attention=relu", "train.max_steps=25", "eval.n_sequences=32"]
    code, out, err = run_cli(capsys, "train", *common, "train.seed=4", "--seeds", "3",
                             "--out", str(tmp_path / "ens"))
    assert code == 0, err
    assert [line.split(":")[0] for line in out.splitlines() if not line.startswith(" ")] == [
        *(f"relu 1x1, seed {s}" for s in (4, 5, 6)), "draw the attention maps"]
    code, _, err = run_cli(capsys, "train", *common, "train.seed=5", "--out",
                           str(tmp_path / "alone"))
    assert code == 0, err
    together = read_json(tmp_path / "ens" / "seed5" / "summary.json")
    alone = read_json(tmp_path / "alone" / "summary.json")
    assert together["seed"] == alone["seed"] == 5
    assert together["mse"] == pytest.approx(alone["mse"], rel=1e-5)
    code, _, err = run_cli(capsys, "train", "--seeds", "0", "--out", str(tmp_path / "x"))
    assert code == 2 and "--seeds=0 is not allowed" in err
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep")
    code, _, err = run_cli(capsys, "train", "--seeds", "2", "--out", str(tmp_path / "mine"))
    assert code == 2 and "is not an empty folder or a sinklab folder of seed runs" in err
    assert sorted(p.name for p in (tmp_path / "mine").iterdir()) == ["notes.txt"]


@pytest.mark.slow
def test_theory_quick_end_to_end_links_and_resumes(tmp_path, capsys, tiny_reproduce):
    out = tmp_path / "theory"
    docs = tmp_path / "docs" / "theory.md"
    args = ["theory", "--quick", "--workers", "1", "--steps", "40", "--seeds", "1", "--eps",
            "0.1,0.5", "--out", str(out)]
    code, _, err = run_cli(capsys, *args, "--docs", str(docs))
    assert code == 0, err
    result = read_json(out / "theory.json")
    assert result["softmax_family"]["slope_linf"] == pytest.approx(1.0, abs=0.1)
    assert max(r["linf"] for r in result["relu_construction"] if r["dtype"] == "float64") < 1e-12
    assert {(r["rule"], r["setting"]) for r in result["denied"]} == {
        (rule, s) for rule in ("softmax", "relu") for s in ("removed", "capped-0.1", "capped-0.5")}
    assert set(result["frontier"]) == {f"{e} {r}" for e in ("1x1", "2x2", "4x4")
                                       for r in ("softmax", "relu")}
    assert len(result["heads_4x4_softmax"]) == 1
    assert len(result["heads_4x4_softmax"][0]["layers"]) == 4
    text = (out / "THEORY.md").read_text()
    for fig in ("fig_family", "fig_denied", "fig_frontier", "fig_heads"):
        assert (out / "figures" / f"{fig}.png").is_file()
        assert f"(figures/{fig}.png)" in text
        assert (docs.parent / "theory" / f"{fig}.png").is_file()
    # the reproduction it trained links the section from its report
    assert "(../THEORY.md)" in (out / "reproduce" / "REPORT.md").read_text()

    code, _, err = run_cli(capsys, *args)  # resume: nothing retrained
    assert code == 0 and "0 denied-sink runs to train" in err and "6 already finished" in err


@pytest.mark.parametrize(("extra", "message"), [
    (["--eps", "0.1,1.5"], "--eps value 1.5 is not allowed: every eps must lie in (0, 1)"),
    (["--eps", "0.1,big"], "give numbers in (0, 1) separated by commas"),
    (["--steps", "0"], "--steps=0 is not allowed"),
    (["--reproduce", "nowhere"], "is not a finished reproduce folder"),
    (["--d-model", "3"], "--d-model=3 is not allowed: the constructions need an integer >= 4"),
    (["--seq-len", "2"], "--seq-len=2 is not allowed"),
])
def test_theory_bad_input_is_one_sentence(tmp_path, capsys, extra, message):
    code, _, err = run_cli(capsys, "theory", "--out", str(tmp_path / "t"), *extra)
    assert code == 2 and message in err and "Traceback" not in err
    assert not (tmp_path / "t").exists()

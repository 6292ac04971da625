"""The command line, in-process: train writes a run folder, plot draws its maps (the studies'
commands are tested in tests/test_reproduction.py and the other study tests; tests/test_bad_input.py
has every kind of bad input)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from helpers import run_cli
from sinklab.runs import folders
from sinklab.runs.files import read_json, read_log


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
    assert [r["step"] for r in read_log(out / "metrics.jsonl")] == [0, 10, 20, 30]
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


def test_a_run_whose_marker_is_corrupted_says_how_to_train_it_again(tmp_path, capsys):
    out = tmp_path / "run"
    args = ["train", "train.max_steps=2", "eval.n_sequences=8", "--out", str(out)]
    assert run_cli(capsys, *args)[0] == 0
    (out / "sinklab.json").write_text('{"kind": "run", "comp')
    for argv in (args, ["plot", str(out)]):
        code, _, err = run_cli(capsys, *argv)
        assert code == 2 and err.count("\n") == 1, err
        assert f"{out / 'sinklab.json'} is corrupted (not valid JSON: " in err
        assert f"sinklab cannot tell what {out} holds; delete {out} to train that run again" in err
    import shutil

    shutil.rmtree(out)  # as the sentence says: the run trains again
    assert run_cli(capsys, *args)[0] == 0 and folders.check_complete(out)


def is_png(path) -> bool:
    from PIL import Image

    with Image.open(path) as image:
        image.verify()
        return image.format == "PNG" and min(image.size) > 100


def test_plot_draws_finished_runs_and_leaves_them_finished(tmp_path, capsys):
    from helpers import holder, stop

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


@pytest.mark.slow
def test_train_draws_no_figure(tmp_path):
    # `sinklab train --seeds N` finishes its runs without drawing: matplotlib is never imported,
    # nor scipy.stats (the claims' statistics, which only the studies' reports need)
    code = ("import sys; from sinklab.cli import main; code = main(sys.argv[1:]); "
            "print(code, 'matplotlib' in sys.modules, 'sinklab.plots' in sys.modules, "
            "'scipy.stats' in sys.modules)")
    out = tmp_path / "seeds"
    result = subprocess.run([sys.executable, "-c", code, "train", "train.max_steps=1",
                             "eval.n_sequences=8", "--seeds", "4", "--out", str(out)],
                            capture_output=True, text=True, check=True)
    assert result.stdout.splitlines()[-1] == "0 False False False", result.stdout
    assert result.stdout.splitlines()[-2] == f"draw the attention maps: sinklab plot {out}"
    assert len(list(out.glob("seed*/summary.json"))) == 4 and not list(out.rglob("*.png"))


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
    lines = out.splitlines()
    assert [line.split()[0] for line in lines if not line[0].isspace()] == sorted(RULES)
    assert "softmax    rows: simplex; no parameters. Standard softmax attention" in out
    assert "sink_logit rows: implicit sink; learned parameters." in out
    assert "model.attention_args.temperature: float = 1.0 -- every score is divided" in out
    assert "model.attention_args.bias: float or none = none --" in out


def test_import_has_no_side_effects(tmp_path):
    code = ("import os, sys; os.chdir(sys.argv[1]); import sinklab, sinklab.cli, "
            "sinklab.studies.reproduce; print(sorted(os.listdir('.')))")
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



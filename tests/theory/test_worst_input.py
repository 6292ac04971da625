"""``sinklab worst``'s inputs: its options are bounded before any work, its attack's memory does
not grow with the steps, a sink attack whose restarts would not fit is refused, and a folder
that is not a toy model's run (a language-model run, a study's folder) is named as such."""

from __future__ import annotations

import tracemalloc

import pytest

from helpers import DOCS
from sinklab.cli import main
from sinklab.pretrain.runconfig import PretrainConfig
from sinklab.runs import limits
from sinklab.theory import attack, bounds

TINY_RUN = ["train.max_steps=30", "eval.n_sequences=8", "task.seq_len=6", "task.d_model=6",
            "task.eval_trigger=5"]


def _worst(capsys, *argv: str) -> tuple[int, str]:
    code = main(["worst", *argv])
    return code, capsys.readouterr().err


@pytest.mark.parametrize(("flag", "most"), [("--attack-steps", attack.MAX_STEPS),
                                            ("--restarts", attack.MAX_RESTARTS)])
@pytest.mark.parametrize("value", ["1000000000", "0"])
def test_attack_steps_and_restarts_are_bounded_before_any_run_is_read(tmp_path, capsys, flag,
                                                                      most, value):
    # the run does not exist: the options are refused before it is looked at
    code, err = _worst(capsys, str(tmp_path / "none"), flag, value)
    assert code == 2, err
    assert (f"{flag}={value} is not allowed: it must be an integer from 1 to {most:,}, since "
            "the attack's time grows in proportion to it.") in err
    assert "Traceback" not in err


def test_the_step_sizes_are_computed_on_demand_not_kept():
    """The attack's memory grew with its steps: every step's size was kept in a list (32 GB
    for a billion steps). The sizes are the same, each computed when asked for."""
    tracemalloc.start()
    try:
        sizes = attack.step_sizes(10**6)
        last = sizes[len(sizes) - 1]
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 10_000 and last == pytest.approx(attack.STEP_END)
    for steps in (1, 2, 7):
        ratio = attack.STEP_END / attack.STEP_START
        want = [attack.STEP_START] if steps == 1 else \
            [attack.STEP_START * ratio ** (t / (steps - 1)) for t in range(steps)]
        assert list(attack.step_sizes(steps)) == want
    with pytest.raises(IndexError):
        attack.step_sizes(3)[3]


def test_restarts_whose_sink_attack_would_not_fit_are_refused_with_the_most_that_fit(
        tmp_path, capsys, monkeypatch):
    run = tmp_path / "soft"
    assert main(["train", *TINY_RUN, "--out", str(run)]) == 0
    capsys.readouterr()
    monkeypatch.setenv(limits.MEMORY_ENV, "100M")
    from sinklab.train import load_model

    cfg, model = load_model(run)
    per_restart = bounds.sink_attack_bytes(model, cfg, 1)
    most = (100 * 2**20 - limits.RUN_BYTES) // per_restart
    code, err = _worst(capsys, str(run), "--restarts", str(most + 1))
    assert code == 2, err
    assert f"--restarts={most + 1} is too many for {run}: the sink attack" in err
    assert f"give --restarts {most:,} or fewer." in err
    # a ReLU model has no sink attack, and the attack it has works in chunks of a fixed size:
    # the same restarts are not refused for it (only its time grows with them)
    relu = tmp_path / "relu"
    assert main(["train", *TINY_RUN, "model.attention=relu", "--out", str(relu)]) == 0
    relu_cfg, relu_model = load_model(relu)
    bounds.check_restarts(relu, relu_model, relu_cfg, most + 1)


def test_a_sink_attack_estimate_grows_with_its_rows_and_restarts():
    from sinklab.config import build_run_config
    from sinklab.model import AttentionStack

    cfg = build_run_config({"task": {"seq_len": 16, "d_model": 16, "eval_trigger": 8}})
    model = AttentionStack(cfg.model, 16, residual=cfg.residual)
    assert bounds.sink_attack_rows(16) == 14 + sum(15 - j for j in range(2, 15))
    assert bounds.sink_attack_bytes(model, cfg, 8) == 8 * bounds.sink_attack_bytes(model, cfg, 1)


def test_worst_on_a_language_model_run_says_what_it_is_and_what_worst_takes(tmp_path, capsys):
    from sinklab.pretrain.training import train

    tiny = dict(corpus="pydoc", d_model=8, n_layers=1, n_heads=1, context=8, batch_size=1,
                tokens=8, log_every=1, eval_windows=1, probe_windows=0, warmup=0,
                device="cpu")
    lm = tmp_path / "lm"
    train(PretrainConfig.make(**tiny), lm)
    code, err = _worst(capsys, str(lm))
    assert code == 2, err
    assert err.startswith(f"sinklab: error: {lm} holds a language-model run (sinklab pretrain), "
                          "not a model of the trigger task; sinklab worst takes finished run "
                          "folders of `sinklab train`")
    assert "unknown config section" not in err and "Traceback" not in err


def test_worst_on_a_study_folder_or_a_seeds_folder_names_its_kind(tmp_path, capsys):
    from sinklab.runs import folders

    study = tmp_path / "pq"
    study.mkdir()
    folders.mark(study, "pretrain", study={"name": "pretrain", "title": "t",
                                           "report": "PRETRAIN.md"})
    code, err = _worst(capsys, str(study))
    assert code == 2 and f"{study} is a sinklab pretrain folder, whose runs are language " \
                          "models" in err, err
    seeds = tmp_path / "seeds"
    assert main(["train", *TINY_RUN, "--seeds", "2", "--out", str(seeds)]) == 0
    capsys.readouterr()
    code, err = _worst(capsys, str(seeds))
    assert code == 2 and f"give its seed folders ({seeds / 'seed0'}, ...)" in err, err


def test_the_docs_state_the_bounds_the_code_has():

    docs = DOCS
    for page in ("usage.md", "limits.md"):
        flat = " ".join((docs / page).read_text().split())
        assert f"{attack.MAX_STEPS:,}" in flat and f"{attack.MAX_RESTARTS:,}" in flat, page

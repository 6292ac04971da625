"""Two training options: ``train.save_every`` (weights saved along the way, loaded back by step)
and ``train.patience`` (the plateau rule). Both are off at 0, and off they leave the config and
the training exactly as they were; on, a member keeps equal to its solo run."""

from __future__ import annotations

import json

import pytest
import torch

from helpers import small_config
from sinklab.config import build_run_config, derive_seed
from sinklab.errors import ConfigError, ResultsError
from sinklab.runs import folders
from sinklab.runs.files import read_json, read_log
from sinklab.task import TrainStream
from sinklab.train import (
    CONVERGED,
    DIVERGED,
    MAX_STEPS,
    PLATEAU,
    STATUS,
    Plateau,
    build_ensemble,
    checkpoint_path,
    list_checkpoints,
    load_checkpoint,
    load_model,
    plateau_rule_text,
    stop_codes,
    train_runs,
)


def tiny(**sections):
    """A 1x1 config with batches of 16 and a small test set, the given sections on top."""
    base = {"train": {"batch_size": 16}, "eval": {"n_sequences": 16}}
    for name, values in sections.items():
        base[name] = {**base.get(name, {}), **values}
    return small_config(**base)


def unfit(**train):
    """A 1x1 softmax model with BOS hidden from the non-trigger rows: it cannot output zero
    there, so at a tiny tol only the plateau rule (or the cap) stops it."""
    return tiny(model={"bos": "removed"}, train={"tol": 1e-9, "max_steps": 400, **train})


def files(run_dir):
    return {name: (run_dir / name).read_bytes()
            for name in ("model.pt", "attention.npz", "config.json", "metrics.jsonl")}


# ---------------------------------------------------------------------------- config


def test_the_options_are_left_out_of_the_config_while_off_and_round_trip_when_on():
    default = build_run_config({}).to_dict()
    assert "save_every" not in default["train"] and "patience" not in default["train"]
    explicit = build_run_config({"train": {"save_every": 0, "patience": 0}}).to_dict()
    assert json.dumps(explicit) == json.dumps(default)  # config.json byte for byte as before
    cfg = build_run_config({"train": {"patience": 500, "save_every": 10}})
    d = cfg.to_dict()
    assert d["train"]["patience"] == 500 and d["train"]["save_every"] == 10
    assert build_run_config(json.loads(json.dumps(d))) == cfg
    assert build_run_config({"train": {"patience": "7"}}).train.patience == 7  # command line
    # learning-rate drops: left out while off (and the factor while it is the default)
    explicit = build_run_config({"train": {"lr_drops": 0, "lr_drop_factor": 0.1}}).to_dict()
    assert json.dumps(explicit) == json.dumps(default)
    cfg = build_run_config({"train": {"patience": 5, "lr_drops": 2, "lr_drop_factor": 0.5}})
    assert build_run_config(json.loads(json.dumps(cfg.to_dict()))) == cfg
    assert cfg.to_dict()["train"]["lr_drops"] == 2


@pytest.mark.parametrize("train, message", [
    ({"lr_drops": 2}, "is not allowed with train.patience=0"),
    ({"patience": 5, "lr_drops": 11}, "it must be an integer in 0..10"),
    ({"patience": 5, "lr_drops": 1.5}, "it must be of type int"),
    ({"patience": 5, "lr_drops": -1}, "it must be an integer in 0..10"),
    ({"patience": 5, "lr_drops": 1, "lr_drop_factor": 1.0}, "it must be in \\(0, 1\\)"),
    ({"patience": 5, "lr_drops": 1, "lr_drop_factor": 0}, "it must be in \\(0, 1\\)"),
], ids=repr)
def test_bad_lr_drops_are_one_sentence(train, message):
    with pytest.raises(ConfigError, match=message) as exc:
        build_run_config({"train": train})
    assert "\n" not in str(exc.value) and str(exc.value).endswith(".")


@pytest.mark.parametrize("key", ["save_every", "patience"])
@pytest.mark.parametrize("value", [-1, 1.5, True, "x", "-2"], ids=repr)
def test_bad_values_are_one_sentence_naming_the_key(key, value):
    with pytest.raises(ConfigError, match=rf"^train\.{key}=.* is not allowed: it must be") as exc:
        build_run_config({"train": {key: value}})
    assert "\n" not in str(exc.value) and str(exc.value).endswith(".")


# ---------------------------------------------------------------------------- checkpoints


@pytest.mark.parametrize("last", [23, 20], ids=["stop-between", "stop-at-a-multiple"])
def test_checkpoints_are_saved_at_every_multiple_and_the_stop_step(tmp_path, monkeypatch, last):
    cfg = tiny(train={"max_steps": last, "save_every": 5, "log_every": 5})
    steps = sorted({0, 5, 10, 15, 20, last})
    at_seal = []
    real_seal = folders.seal
    monkeypatch.setattr(folders, "seal",
                        lambda run_dir: (at_seal.append(list_checkpoints(run_dir)),
                                         real_seal(run_dir)))
    (summary,) = train_runs([cfg], [tmp_path], progress=False)
    assert summary["status"] == "max_steps" and summary["steps"] == last
    assert list_checkpoints(tmp_path) == steps
    assert at_seal == [steps]  # all written before the completion record
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == [
        f"step{s:06d}.pt" for s in steps]
    # the checkpoint at the stop step is model.pt, and loads as it does
    assert checkpoint_path(tmp_path, last).read_bytes() == (tmp_path / "model.pt").read_bytes()
    loaded_cfg, stop = load_checkpoint(tmp_path, last)
    _, final = load_model(tmp_path)
    assert loaded_cfg == cfg
    for p, q in zip(stop.parameters(), final.parameters()):
        assert torch.equal(p, q)
    # step 0 is the initialisation; later ones differ from it
    init = build_ensemble([cfg], torch.device("cpu"))
    _, first = load_checkpoint(tmp_path, 0)
    _, mid = load_checkpoint(tmp_path, 10)
    for p0, p_init, p_mid in zip(first.parameters(), init.parameters(), mid.parameters()):
        assert torch.equal(p0, p_init) and not torch.equal(p0, p_mid)


def test_a_checkpoint_reproduces_the_log_row_of_its_step(tmp_path):
    """The weights at step s are those that gave the log row of step s: replaying the member's
    data stream to step s and running the checkpoint on that batch gives the row's numbers."""
    cfg = tiny(train={"max_steps": 12, "save_every": 4, "log_every": 4})
    train_runs([cfg], [tmp_path], progress=False)
    rows = {r["step"]: r for r in read_log(tmp_path / "metrics.jsonl")}
    gen = torch.Generator().manual_seed(derive_seed(cfg.train.seed, "data"))
    stream = TrainStream(cfg.task, cfg.train.batch_size, [gen], residual=cfg.residual)
    checked = []
    for step in range(13):
        batch = stream.next()
        if step not in list_checkpoints(tmp_path):
            continue
        _, model = load_checkpoint(tmp_path, step)
        with torch.no_grad():
            err = model(batch.x).out - batch.y
        assert err.pow(2).mean().item() == pytest.approx(rows[step]["loss"], rel=1e-6)
        assert err.abs().max().item() == pytest.approx(rows[step]["train_linf"], rel=1e-6)
        checked.append(step)
    assert checked == [0, 4, 8, 12]


def test_missing_and_corrupted_checkpoints_are_one_sentence(tmp_path):
    cfg = tiny(train={"max_steps": 6, "save_every": 3})
    train_runs([cfg], [tmp_path / "saved"], progress=False)
    with pytest.raises(ResultsError, match=r"step000004\.pt does not exist; the run in .* saved "
                                           r"weights at steps 0, 3, 6\.$"):
        load_checkpoint(tmp_path / "saved", 4)
    # the completion record lists every checkpoint, so a changed one is caught before loading
    assert "checkpoints/step000003.pt" in folders.read_marker(tmp_path / "saved")[
        "complete"]["files"]
    checkpoint_path(tmp_path / "saved", 3).write_bytes(b"not a checkpoint")
    with pytest.raises(ResultsError, match=r"checkpoints/step000003\.pt .*delete .* to run it "
                                           r"again"):
        load_checkpoint(tmp_path / "saved", 3)
    with pytest.raises(ValueError, match="step=-1 is not a checkpoint step"):
        load_checkpoint(tmp_path / "saved", -1)
    train_runs([tiny(train={"max_steps": 6})], [tmp_path / "plain"], progress=False)
    assert list_checkpoints(tmp_path / "plain") == []
    assert not (tmp_path / "plain" / "checkpoints").exists()
    with pytest.raises(ResultsError, match=r"saved weights at none \(it was trained with "
                                           r"train\.save_every=0\)\.$"):
        load_checkpoint(tmp_path / "plain", 0)
    # an unfinished run's checkpoints are not loaded
    folders.mark(tmp_path / "unfinished", "run")
    with pytest.raises(ResultsError, match="holds no finished run"):
        load_checkpoint(tmp_path / "unfinished", 0)


def test_a_fresh_attempt_removes_an_earlier_attempts_checkpoints(tmp_path):
    folders.mark(tmp_path, "run")  # an interrupted attempt that had got further
    checkpoint_path(tmp_path, 999).parent.mkdir()
    checkpoint_path(tmp_path, 999).write_bytes(b"stale")
    train_runs([tiny(train={"max_steps": 4, "save_every": 2})], [tmp_path], progress=False)
    assert list_checkpoints(tmp_path) == [0, 2, 4]


# ---------------------------------------------------------------------------- the plateau rule


def test_the_plateau_rule_needs_a_strictly_lower_error():
    rule = Plateau(2, 2, torch.device("cpu"), torch.float32)
    # member 0 improves at steps 0, 1, 3 (a tie at step 2 is no new best); member 1 only at 0
    errors = [[3.0, 1.0], [2.0, 1.0], [2.0, 1.0], [1.0, 1.0], [1.0, 1.0], [1.0, 1.0]]
    stalled = [rule.update(s, torch.tensor(e)).tolist() for s, e in enumerate(errors)]
    assert [s[0] for s in stalled] == [False, False, False, False, False, True]
    assert [s[1] for s in stalled] == [False, False, True, True, True, True]
    assert rule.best.tolist() == [1.0, 1.0] and rule.best_step.tolist() == [3, 0]
    assert "for 2 consecutive steps" in plateau_rule_text(2)
    assert "no plateau rule" in plateau_rule_text(0)


@pytest.mark.parametrize("linf, loss, stalled, status", [
    (1e-4, 1e-8, True, "converged"),
    (float("nan"), float("nan"), True, "diverged"),
    (1e9, float("inf"), True, "diverged"),
    (0.5, 0.1, True, "plateau"),
    (0.5, 0.1, False, "max_steps"),
    (0.5, 0.1, None, "max_steps"),
], ids=["converged-over-plateau", "nan-over-plateau", "inf-over-plateau", "plateau",
        "max-steps", "no-rule"])
def test_stop_codes_precedence(linf, loss, stalled, status):
    flag = None if stalled is None else torch.tensor([stalled])
    code = stop_codes(torch.tensor([linf]), torch.tensor([loss]), 1e-3, flag)
    assert STATUS[int(code[0])] == status
    assert {CONVERGED, MAX_STEPS, DIVERGED, PLATEAU} == set(STATUS)


def test_patience_stops_a_run_that_cannot_fit_with_status_plateau(tmp_path):
    cfg = unfit(patience=10, log_every=1)
    (summary,) = train_runs([cfg], [tmp_path], progress=False)
    assert summary["status"] == "plateau" and not summary["converged"]
    assert 10 <= summary["steps"] < 400
    assert read_json(tmp_path / "summary.json")["status"] == "plateau"
    rows = read_log(tmp_path / "metrics.jsonl")
    assert rows[-1]["step"] == summary["steps"] and rows[-1]["status"] == "plateau"
    assert all("status" not in r for r in rows[:-1])
    # the rule, read back from the log: the last new best is exactly 10 steps before the stop,
    # and no earlier stretch went 10 steps without one
    errors = [r["train_linf"] for r in rows]
    bests = [s for s in range(len(errors)) if all(errors[s] < e for e in errors[:s])]
    assert bests[-1] == summary["steps"] - 10
    assert max(b - a for a, b in zip(bests, bests[1:])) <= 10
    # without the rule, the same run goes on to the cap
    assert train_runs([unfit(max_steps=summary["steps"] + 20)], progress=False)[0]["status"] \
        == "max_steps"


@pytest.mark.slow
def test_converged_wins_when_patience_leaves_room_and_the_rule_is_exact(tmp_path):
    """A ReLU model that reaches tol: with patience one step longer than its longest stretch
    without a new best it converges as it does without the rule (same bytes); with patience
    equal to that stretch it stops on the plateau at the stretch's end."""
    base = {"model": {"attention": "relu"}, "train": {"tol": 5e-2, "max_steps": 3000,
                                                      "log_every": 1}}
    (plain,) = train_runs([tiny(**base)], [tmp_path / "plain"], progress=False)
    assert plain["status"] == "converged"
    errors = [r["train_linf"] for r in read_log(tmp_path / "plain" / "metrics.jsonl")]
    bests = [s for s in range(len(errors)) if all(errors[s] < e for e in errors[:s])]
    assert bests[-1] == plain["steps"]  # a converging step is always a new best
    gaps = [b - a for a, b in zip(bests, bests[1:])]
    longest = max(gaps)
    assert longest >= 2
    roomy = tiny(model=base["model"], train={**base["train"], "patience": longest})
    (summary,) = train_runs([roomy], [tmp_path / "roomy"], progress=False)
    assert summary["status"] == "converged" and summary["steps"] == plain["steps"]
    assert (tmp_path / "roomy" / "model.pt").read_bytes() == \
        (tmp_path / "plain" / "model.pt").read_bytes()
    tight = tiny(model=base["model"], train={**base["train"], "patience": longest - 1})
    (stopped,) = train_runs([tight], progress=False)
    first = next(a for a, b in zip(bests, bests[1:]) if b - a == longest)
    assert stopped["status"] == "plateau" and stopped["steps"] == first + longest - 1


def test_patience_that_never_fires_leaves_the_run_bit_for_bit(tmp_path):
    for name, patience in (("off", 0), ("on", 1000)):
        cfg = tiny(model={"n_layers": 2, "n_heads": 2}, train={"max_steps": 25, "log_every": 5,
                                                               "patience": patience})
        (summary,) = train_runs([cfg], [tmp_path / name], progress=False)
        assert summary["status"] == "max_steps"
    off, on = files(tmp_path / "off"), files(tmp_path / "on")
    assert on.pop("config.json") != off.pop("config.json")  # only the config names patience
    assert on == off


def test_ensemble_members_stop_on_their_own_plateau_and_equal_their_solo_runs(tmp_path):
    cfgs = [unfit(patience=10, save_every=7, seed=s, lr=lr)
            for s, lr in ((0, 1e-3), (1, 2e-3), (2, 1e-3))]
    together = train_runs(cfgs, [tmp_path / f"together{i}" for i in range(3)], progress=False)
    assert [s["status"] for s in together] == ["plateau"] * 3
    assert len({s["steps"] for s in together}) == 3  # one member's stop did not stop the others
    for i, (cfg, t) in enumerate(zip(cfgs, together)):
        (alone,) = train_runs([cfg], [tmp_path / f"alone{i}"], progress=False)
        assert alone["steps"] == t["steps"] and alone["status"] == t["status"]
        a, b = tmp_path / f"together{i}", tmp_path / f"alone{i}"
        assert files(a) == files(b)  # bit for bit
        steps = list_checkpoints(a)
        assert steps == list_checkpoints(b)
        assert steps == sorted({*range(0, t["steps"] + 1, 7), t["steps"]})
        for s in steps:
            assert checkpoint_path(a, s).read_bytes() == checkpoint_path(b, s).read_bytes()


def test_lr_drops_lower_the_rate_at_each_plateau_then_the_rule_stops_the_run(tmp_path):
    """With two drops the plateau rule fires three times: the first two lower the rate tenfold
    and restart the count at that step, the third stops the run. Without drops the same run
    stops at the first drop's step."""
    cfg = unfit(patience=10, lr_drops=2, log_every=1, max_steps=1000)
    (summary,) = train_runs([cfg], [tmp_path / "drops"], progress=False)
    assert summary["status"] == "plateau"
    first, second = summary["lr_drop_steps"]
    # (the engine holds the configured rate as float32 rounds it, as it always has)
    assert summary["lr_final"] == float(torch.tensor(1e-3)) * 0.1 * 0.1
    assert summary["lr"] == 1e-3
    errors = [r["train_linf"] for r in read_log(tmp_path / "drops" / "metrics.jsonl")]
    bests = [s for s in range(len(errors)) if all(errors[s] < e for e in errors[:s])]
    # each firing: 10 steps since the last new best or since the last drop, whichever is later
    assert first == max(b for b in bests if b <= first) + 10
    assert second == max(first, max(b for b in bests if b <= second)) + 10
    assert summary["steps"] == max(second, bests[-1]) + 10
    (plain,) = train_runs([unfit(patience=10, log_every=1, max_steps=1000)], progress=False)
    assert plain["status"] == "plateau" and plain["steps"] == first
    assert "lr_drop_steps" not in plain and "lr_final" not in plain


def test_ensemble_members_drop_their_own_rate_and_equal_their_solo_runs(tmp_path):
    cfgs = [unfit(patience=10, lr_drops=1, seed=s, lr=lr, max_steps=600)
            for s, lr in ((0, 1e-3), (1, 2e-3), (2, 1e-3))]
    together = train_runs(cfgs, [tmp_path / f"together{i}" for i in range(3)], progress=False)
    drops = [s["lr_drop_steps"] for s in together]
    assert all(len(d) == 1 for d in drops) and len({d[0] for d in drops}) > 1
    for i, (cfg, t) in enumerate(zip(cfgs, together)):
        (alone,) = train_runs([cfg], [tmp_path / f"alone{i}"], progress=False)
        assert (alone["steps"], alone["lr_drop_steps"], alone["lr_final"]) == \
            (t["steps"], t["lr_drop_steps"], t["lr_final"])
        assert files(tmp_path / f"together{i}") == files(tmp_path / f"alone{i}")  # bit for bit


def test_the_cli_trains_to_a_plateau(tmp_path, capsys):
    from sinklab.cli import main

    out = tmp_path / "run"
    code = main(["train", "model.bos=removed", "train.tol=1e-9", "train.patience=10",
                 "train.save_every=10", "train.batch_size=16", "eval.n_sequences=16",
                 "--out", str(out)])
    stdout, err = capsys.readouterr()
    steps = read_json(out / "summary.json")["steps"]
    assert code == 0, err
    assert f"softmax 1x1, seed 0: stopped on a plateau at {steps} steps" in stdout
    assert list_checkpoints(out)[-1] == steps


def test_checkpoints_travel_with_a_sweep_job_and_an_adopted_run(tmp_path):
    """A sweep job returns the checkpoints with the run's other files (names relative to the
    run folder), the store writes them back into place, and the completion record lists them,
    so a finished run with checkpoints checks complete after the trip."""
    from sinklab.sweeps import run as sweep_run

    cfg = tiny(train={"max_steps": 6, "save_every": 3})
    (result,) = sweep_run.compute([("cell", cfg.to_dict())])
    assert {"checkpoints/step000000.pt", "checkpoints/step000003.pt",
            "checkpoints/step000006.pt", "model.pt"} <= set(result["files"])
    folder = tmp_path / "copy"
    for name, data in result["files"].items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(data)
    assert folders.check_complete(folder)
    assert list_checkpoints(folder) == [0, 3, 6]

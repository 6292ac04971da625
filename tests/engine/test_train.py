"""Training: the batched Adam equals torch's, a 1x1 softmax model reaches the paper's stop rule
with a sink, runs are deterministic, ensemble members equal runs trained alone, and divergence
stops cleanly with its logs kept."""

from __future__ import annotations

import json

import pytest
import torch

from helpers import small_config
from sinklab.runs.files import read_json, read_log
from sinklab.train import MemberAdam, build_ensemble, train_ensemble, train_runs


@pytest.mark.parametrize("lrs", [[1e-3, 3e-2, 1e-1], [1e-2, 1e-2, 1e-2]],
                         ids=["own-lr", "shared-lr"])
def test_member_adam_matches_torch_adam_per_member(lrs):
    # Member 2 freezes after 5 steps and then sees NaN gradients; the others train on, through
    # the unmasked path first and the masked one after the freeze.
    gen = torch.Generator().manual_seed(0)
    params = [torch.randn(3, 4, 5, generator=gen), torch.randn(3, 7, generator=gen)]
    ours = [p.clone().requires_grad_() for p in params]
    opt = MemberAdam(ours, torch.tensor(lrs), (0.9, 0.95), 1e-8)
    theirs = [[p[e].clone().requires_grad_() for p in params] for e in range(3)]
    torch_opts = [torch.optim.Adam(theirs[e], lr=lrs[e], betas=(0.9, 0.95), eps=1e-8)
                  for e in range(3)]
    for step in range(20):
        if step == 5:
            opt.freeze([2])
            frozen = opt.m.clone(), opt.v.clone()
        grads = [torch.randn(p.shape, generator=gen) for p in params]
        for p, g in zip(ours, grads):
            p.grad = g.clone()
            if step >= 5:
                p.grad[2] = float("nan")  # a frozen member's gradient must not leak in
        opt.step()
        for e in range(3 if step < 5 else 2):
            for p, g in zip(theirs[e], grads):
                p.grad = g[e].clone()
            torch_opts[e].step()
    for e in range(3):
        for p_ours, p_theirs in zip(ours, theirs[e]):
            torch.testing.assert_close(p_ours[e], p_theirs, rtol=1e-5, atol=1e-6)
    member = opt.member == 2
    assert torch.equal(opt.m[member], frozen[0][member])
    assert torch.equal(opt.v[member], frozen[1][member])
    assert opt.t == 20


def test_member_adam_unfrozen_is_torch_adam_bit_for_bit():
    gen = torch.Generator().manual_seed(1)
    p_ours = torch.randn(2, 6, generator=gen).requires_grad_()
    p_theirs = p_ours.detach().clone().requires_grad_()
    opt = MemberAdam([p_ours], torch.tensor([3e-3, 3e-3]), (0.9, 0.95), 1e-8)
    torch_opt = torch.optim.Adam([p_theirs], lr=3e-3, betas=(0.9, 0.95), eps=1e-8)
    for _ in range(10):
        g = torch.randn(2, 6, generator=gen)
        p_ours.grad, p_theirs.grad = g.clone(), g.clone()
        opt.step()
        torch_opt.step()
    assert torch.equal(p_ours, p_theirs)


def test_1x1_softmax_reaches_the_stop_rule_with_a_sink(tmp_path):
    cfg = small_config(train={"log_every": 200})
    (summary,) = train_runs([cfg], [tmp_path], progress=False)
    assert summary["status"] == "converged" and summary["converged"]
    assert 0 < summary["steps"] < 5000
    assert summary["train_linf"] < 5e-3
    assert summary["bos_mass_nontrigger"][0][0] >= 0.95
    assert summary["sink_heads"] == 1
    rows = read_log(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in rows[:-1]] == list(range(0, summary["steps"], 200))
    assert rows[-1]["step"] == summary["steps"] and rows[-1]["status"] == "converged"
    assert rows[-1]["train_linf"] == summary["train_linf"] < 5e-3
    assert all(len(r["bos_mass_nontrigger"]) == 1 for r in rows)
    assert read_json(tmp_path / "summary.json") == json.loads(json.dumps(summary))
    assert read_json(tmp_path / "config.json")["train"]["lr"] == 1e-3


def test_same_seed_gives_the_same_numbers():
    cfg = small_config(model={"n_layers": 2, "n_heads": 2}, train={"max_steps": 60},
                       eval={"n_sequences": 50})
    a, b = train_runs([cfg], progress=False)[0], train_runs([cfg], progress=False)[0]
    drop = ("wall_time_s", "train_time_s")
    assert {k: v for k, v in a.items() if k not in drop} == \
           {k: v for k, v in b.items() if k not in drop}
    other = small_config(model={"n_layers": 2, "n_heads": 2},
                         train={"max_steps": 60, "seed": 1}, eval={"n_sequences": 50})
    assert train_runs([other], progress=False)[0]["mse"] != a["mse"]


def test_ensemble_members_equal_runs_trained_alone(tmp_path):
    """Exact per-member early stopping: each member ends with the step count, metrics and
    weights it has when trained alone, although the ensemble runs on after it stops."""
    from sinklab.train import load_model

    cfgs = [small_config(model={"attention": "relu"}, train={"seed": s, "lr": lr})
            for s, lr in ((0, 1e-3), (1, 2e-3))]
    together, ensemble = train_ensemble(cfgs, [tmp_path / "together0", tmp_path / "together1"],
                                        progress=False)
    alone = [train_runs([c], [tmp_path / f"alone{i}"], progress=False)[0]
             for i, c in enumerate(cfgs)]
    assert together[0]["steps"] != together[1]["steps"]  # they stop at different steps
    for i, (t, a) in enumerate(zip(together, alone)):
        assert t["steps"] == a["steps"] and t["status"] == a["status"] == "converged"
        for key in ("linf_error", "mse", "train_linf"):
            assert t[key] == pytest.approx(a[key], rel=1e-4, abs=1e-7)
        _, m_t = load_model(tmp_path / f"together{i}")
        _, m_a = load_model(tmp_path / f"alone{i}")
        for p_t, p_a, p_end in zip(m_t.parameters(), m_a.parameters(), ensemble.parameters()):
            torch.testing.assert_close(p_t, p_a, rtol=1e-5, atol=1e-6)
            # frozen after its stop: the ensemble's final weights are still the stop weights
            torch.testing.assert_close(p_end[i:i + 1], p_t, rtol=0, atol=0)
        assert (read_log(tmp_path / f"together{i}" / "metrics.jsonl")[-1]["step"]
                == read_log(tmp_path / f"alone{i}" / "metrics.jsonl")[-1]["step"])


def test_ensemble_initialisation_is_per_seed():
    cfgs = [small_config(train={"seed": s}) for s in (0, 1, 0)]
    model = build_ensemble(cfgs, torch.device("cpu"))
    w = model.blocks[0].attn.w_q
    assert torch.equal(w[0], w[2]) and not torch.equal(w[0], w[1])


def test_divergence_stops_with_status_and_keeps_logs(tmp_path):
    cfg = small_config(model={"attention": "relu", "init_std": 1e4},
                       eval={"n_sequences": 20})
    (summary,) = train_runs([cfg], [tmp_path], progress=False)
    assert summary["status"] == "diverged" and not summary["converged"]
    rows = read_log(tmp_path / "metrics.jsonl")
    assert rows[-1]["status"] == "diverged" and rows[-1]["loss"] is None
    assert read_json(tmp_path / "summary.json")["status"] == "diverged"


def test_saved_model_reloads_to_the_same_metrics(tmp_path):
    from sinklab.evaluate import eval_batch, evaluate
    from sinklab.train import load_model

    cfg = small_config(model={"n_layers": 2, "n_heads": 2}, train={"max_steps": 40},
                       eval={"n_sequences": 100})
    (summary,) = train_runs([cfg], [tmp_path], progress=False)
    loaded_cfg, model = load_model(tmp_path)
    assert loaded_cfg == cfg
    (metrics,), _ = evaluate(model, eval_batch(cfg, torch.device("cpu")))
    assert metrics["mse"] == pytest.approx(summary["mse"], rel=1e-6)
    torch.testing.assert_close(torch.tensor(metrics["bos_mass_nontrigger"]),
                               torch.tensor(summary["bos_mass_nontrigger"]))
    (tmp_path / "model.pt").write_bytes(b"not a checkpoint")
    from sinklab.errors import ResultsError

    with pytest.raises(ResultsError, match="model.pt is 16 bytes, not the .* it had when the run "
                                           "finished"):
        load_model(tmp_path)


def test_thread_choice_keeps_the_numbers_and_restores_the_caller_setting(monkeypatch):
    from sinklab import train

    cfg = small_config(model={"n_layers": 2, "n_heads": 2}, train={"max_steps": 30},
                       eval={"n_sequences": 50})
    assert train.step_threads(small_config(), 1, torch.device("cpu")) == 1  # a tiny step
    torch.set_num_threads(2)
    assert train.step_threads(cfg, 64, torch.device("cpu")) == 2  # a large one keeps both
    one = train_runs([cfg], progress=False)[0]  # a tiny step: trained with one thread
    assert torch.get_num_threads() == 2
    monkeypatch.setattr(train, "SMALL_STEP", 0)  # now every step uses the caller's two threads
    two = train_runs([cfg], progress=False)[0]
    assert torch.get_num_threads() == 2
    for key in ("mse", "linf_error", "train_loss"):
        assert one[key] == pytest.approx(two[key], rel=1e-4)


def test_same_seed_same_bytes_and_the_completion_record_comes_last(tmp_path, monkeypatch):
    from sinklab.runs import folders

    cfg = small_config(model={"n_layers": 2, "n_heads": 2}, train={"max_steps": 12},
                       eval={"n_sequences": 16})
    order = []
    real_seal = folders.seal

    def seal(run_dir):  # what the run folder holds at the moment it is sealed
        order.append(sorted(p.name for p in run_dir.iterdir()))
        real_seal(run_dir)

    monkeypatch.setattr(folders, "seal", seal)
    for name in ("a", "b"):
        train_runs([cfg], [tmp_path / name], progress=False)
    for f in ("model.pt", "attention.npz", "config.json", "metrics.jsonl"):
        assert (tmp_path / "a" / f).read_bytes() == (tmp_path / "b" / f).read_bytes(), f
    # no figure: `sinklab plot` draws attention.png later, outside the record
    assert order[0] == ["attention.npz", "config.json", "metrics.jsonl", "model.pt",
                        "sinklab.json", "summary.json"]
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == order[0]
    record = read_json(tmp_path / "a" / "sinklab.json")["complete"]["files"]
    assert sorted(record) == [f for f in order[0] if f != "sinklab.json"]
    assert folders.check_complete(tmp_path / "a")
    with (tmp_path / "a" / "metrics.jsonl").open("a") as f:
        f.write('{"step": 99}\n')  # a log that grew after the run finished
    with pytest.raises(folders.DamagedRun, match="metrics.jsonl is .* bytes, not the"):
        folders.check_complete(tmp_path / "a")


def test_a_truncated_npz_is_one_sentence(tmp_path):
    import numpy as np

    from sinklab.errors import ResultsError
    from sinklab.runs.files import read_npz, write_npz

    path = tmp_path / "attention.npz"
    write_npz(path, mean=np.ones((2, 3)), std=np.zeros((2, 3)))
    assert read_npz(path)["mean"].shape == (2, 3)
    path.write_bytes(path.read_bytes()[:40])
    with pytest.raises(ResultsError, match="attention.npz is corrupted"):
        read_npz(path)


def test_a_rule_argument_changes_the_run_and_its_default_changes_nothing(tmp_path):
    def run(args, name):
        cfg = small_config(model={"attention": "sigmoid", "attention_args": args},
                           train={"max_steps": 30}, eval={"n_sequences": 50})
        (summary,) = train_runs([cfg], [tmp_path / name], progress=False)
        return {k: v for k, v in summary.items() if k not in ("train_time_s", "wall_time_s")}

    default, explicit, shifted = run({}, "default"), run({"bias": None}, "none"), \
        run({"bias": -1.0}, "shifted")
    assert {k: v for k, v in explicit.items() if k != "attention_args"} == default
    assert (tmp_path / "default" / "model.pt").read_bytes() == \
        (tmp_path / "none" / "model.pt").read_bytes()
    assert shifted["attention_args"] == {"bias": -1.0} and "attention_args" not in default
    assert shifted["mse"] != default["mse"]
    assert read_json(tmp_path / "shifted" / "config.json")["model"]["attention_args"] == \
        {"bias": -1.0}
    assert "attention_args" not in read_json(tmp_path / "default" / "config.json")["model"]


def test_a_log_written_before_the_rename_reads_linf_as_train_linf(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 0, "loss": 0.5, "linf": 0.9, "bos_mass_nontrigger": [[0.1]]}\n'
                    '{"step": 10, "loss": 0.2, "train_linf": 0.4, '
                    '"bos_mass_nontrigger": [[0.2]]}\n')
    rows = read_log(path)
    assert [r["train_linf"] for r in rows] == [0.9, 0.4]
    assert all("linf" not in r for r in rows)


def test_a_finished_writer_seals_what_it_wrote_and_an_unfinished_one_is_not_finished(tmp_path):
    """The run-folder writer on its own: a finished folder's completion record lists exactly
    the files the writer wrote (the stop step's checkpoint too), with their hashes; a folder
    whose writer was only closed, as an interrupt leaves it, is not a finished run."""
    import hashlib

    import numpy as np

    from sinklab.errors import ResultsError
    from sinklab.runs import folders
    from sinklab.train import RunWriter, checkpoint_path, load_model

    cfg = small_config(train={"save_every": 4})
    model = build_ensemble([cfg, small_config(train={"seed": 1, "save_every": 4})],
                           torch.device("cpu"))
    done, left = RunWriter.start(tmp_path / "done", cfg), RunWriter.start(tmp_path / "left", cfg)
    for writer in (done, left):
        writer.log({"step": 0, "loss": 0.5})
        writer.checkpoint(model, 1, 0)
    left.close()
    maps = np.full((1, 1, cfg.task.seq_len, cfg.task.seq_len), 0.25)
    done.finish(model, 1, 6, {"status": "max_steps"}, mean=maps, std=maps)

    def written(folder):
        return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*")
                      if p.is_file() and p.name != "sinklab.json")

    folder = tmp_path / "done"
    assert written(folder) == ["attention.npz", "checkpoints/step000000.pt",
                               "checkpoints/step000006.pt", "config.json", "metrics.jsonl",
                               "model.pt", "summary.json"]
    record = folders.read_marker(folder)["complete"]["files"]
    assert sorted(record) == written(folder)
    assert all(entry["sha256"] == hashlib.sha256((folder / name).read_bytes()).hexdigest()
               for name, entry in record.items())
    assert folders.check_complete(folder)
    assert read_log(folder / "metrics.jsonl") == [{"step": 0, "loss": 0.5}]
    assert read_json(folder / "summary.json") == {"status": "max_steps"}
    loaded_cfg, loaded = load_model(folder)  # member 1's weights, without the member axis
    assert loaded_cfg == cfg
    assert all(torch.equal(p[0], q[1]) for p, q in zip(loaded.parameters(), model.parameters()))
    assert checkpoint_path(folder, 6).read_bytes() == (folder / "model.pt").read_bytes()

    unfinished = tmp_path / "left"
    assert written(unfinished) == ["checkpoints/step000000.pt", "config.json", "metrics.jsonl"]
    assert "complete" not in folders.read_marker(unfinished)
    assert not folders.check_complete(unfinished)
    with pytest.raises(ResultsError, match="holds no finished run"):
        load_model(unfinished)

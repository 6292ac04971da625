"""Training: the batched Adam equals torch's, a 1x1 softmax model reaches the paper's stop rule
with a sink, runs are deterministic, ensemble members equal runs trained alone, and divergence
stops cleanly with its logs kept."""

from __future__ import annotations

import json

import pytest
import torch

from conftest import small_config
from sinklab.results import read_json, read_metrics
from sinklab.train import MemberAdam, build_ensemble, train_ensemble, train_runs


def test_member_adam_matches_torch_adam_per_member():
    gen = torch.Generator().manual_seed(0)
    params = [torch.randn(3, 4, 5, generator=gen), torch.randn(3, 7, generator=gen)]
    lrs = [1e-3, 3e-2, 1e-1]
    ours = [p.clone().requires_grad_() for p in params]
    opt = MemberAdam(ours, torch.tensor(lrs), (0.9, 0.95), 1e-8)
    theirs = [[p[e].clone().requires_grad_() for p in params] for e in range(3)]
    torch_opts = [torch.optim.Adam(theirs[e], lr=lrs[e], betas=(0.9, 0.95), eps=1e-8)
                  for e in range(3)]
    for _ in range(20):
        grads = [torch.randn(p.shape, generator=gen) for p in params]
        for p, g in zip(ours, grads):
            p.grad = g.clone()
        opt.step(torch.ones(3, dtype=torch.bool))
        for e in range(3):
            for p, g in zip(theirs[e], grads):
                p.grad = g[e].clone()
            torch_opts[e].step()
    for e in range(3):
        for p_ours, p_theirs in zip(ours, theirs[e]):
            torch.testing.assert_close(p_ours[e], p_theirs, rtol=1e-5, atol=1e-6)


def test_member_adam_leaves_inactive_members_untouched():
    p = torch.zeros(2, 3, requires_grad=True)
    opt = MemberAdam([p], torch.tensor([0.1, 0.1]), (0.9, 0.95), 1e-8)
    p.grad = torch.ones(2, 3)
    opt.step(torch.tensor([True, True]))
    frozen_p = p[1].clone()
    frozen_m, frozen_v = opt.m.view(2, 3)[1].clone(), opt.v.view(2, 3)[1].clone()
    p.grad = torch.full((2, 3), float("nan"))  # even a NaN gradient must not leak in
    opt.step(torch.tensor([True, False]))
    assert torch.equal(p[1], frozen_p)
    assert torch.equal(opt.m.view(2, 3)[1], frozen_m)
    assert torch.equal(opt.v.view(2, 3)[1], frozen_v)
    assert opt.t.tolist() == [2, 1]


def test_1x1_softmax_reaches_the_stop_rule_with_a_sink(tmp_path):
    cfg = small_config(train={"log_every": 200})
    (summary,) = train_runs([cfg], [tmp_path], progress=False)
    assert summary["status"] == "converged" and summary["converged"]
    assert 0 < summary["steps"] < 5000
    assert summary["train_linf"] < 5e-3
    assert summary["bos_mass_nontrigger"][0][0] >= 0.95
    assert summary["sink_heads"] == 1
    rows = read_metrics(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in rows[:-1]] == list(range(0, summary["steps"], 200))
    assert rows[-1]["step"] == summary["steps"] and rows[-1]["status"] == "converged"
    assert rows[-1]["linf"] < 5e-3
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
        assert (read_metrics(tmp_path / f"together{i}" / "metrics.jsonl")[-1]["step"]
                == read_metrics(tmp_path / f"alone{i}" / "metrics.jsonl")[-1]["step"])


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
    rows = read_metrics(tmp_path / "metrics.jsonl")
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
    from sinklab.results import ResultsError

    with pytest.raises(ResultsError, match="model.pt is corrupted"):
        load_model(tmp_path)

"""Metrics as pure functions: each checked on hand-built weights against its definition."""

from __future__ import annotations

import pytest
import torch

from sinklab import formats as md
from sinklab import metrics
from sinklab.attention import causal_mask, relu, softmax


def sink_weights(seq_len=8, trigger=4):
    """One head that sinks everywhere except at the trigger row, which averages keys 1..j."""
    w = torch.zeros(seq_len, seq_len)
    w[:, 0] = 1.0
    w[trigger] = 0
    w[trigger, 1:trigger + 1] = 1.0 / trigger
    return w


def test_bos_mass_nontrigger_excludes_bos_and_trigger_rows():
    w = sink_weights()
    w[0, 0] = 0.0  # the BOS query row must not count
    w[3, 0], w[3, 1] = 0.5, 0.5  # one non-trigger row only half sinks
    weights = w.expand(2, 1, 8, 8)  # (B, H, L, L)
    trigger = torch.tensor([4, 4])
    got = metrics.bos_mass_nontrigger(weights, trigger)
    assert got.shape == (1,)
    assert got.item() == pytest.approx((5 + 0.5) / 6)  # rows 1..7 except 4


def test_bos_mass_per_sample_triggers_and_leading_axes():
    a, b = sink_weights(trigger=2), sink_weights(trigger=5)
    b[2, 0], b[2, 1] = 0.5, 0.5
    weights = torch.stack([a, b])[:, None]  # (B=2, H=1, L, L)
    trigger = torch.tensor([2, 5])
    expected = (12 - 0.5) / 12  # 6 non-trigger rows per sample, one of them half a sink
    assert metrics.bos_mass_nontrigger(weights, trigger).item() == pytest.approx(expected)
    stacked = torch.stack([weights, weights * 0.5])  # a leading (members) axis
    torch.testing.assert_close(metrics.bos_mass_nontrigger(stacked, trigger),
                               torch.tensor([[expected], [expected / 2]]))
    rows = metrics.bos_mass_nontrigger_rows(weights, trigger)
    assert torch.isnan(rows[0, 0])  # the BOS row is never a non-trigger row
    assert rows[0, 2].item() == pytest.approx(0.5)  # row 2 is the trigger of sample a: only b
    assert rows[0, 5].item() == pytest.approx(1.0)  # row 5 is the trigger of sample b: only a


def test_trigger_stats_of_an_exact_average():
    weights = sink_weights(trigger=4)[None, None]
    stats = metrics.trigger_stats(weights, torch.tensor([4]))
    assert stats["bos"].item() == 0
    assert stats["content"].item() == pytest.approx(1.0)
    assert stats["key_mean"].item() == pytest.approx(0.25)
    assert stats["key_std"].item() == pytest.approx(0.0, abs=1e-7)
    uneven = sink_weights(trigger=4)
    uneven[4, 1:5] = torch.tensor([0.1, 0.2, 0.3, 0.4])
    stats = metrics.trigger_stats(uneven[None, None], torch.tensor([4]))
    assert stats["key_std"].item() == pytest.approx(torch.tensor([0.1, 0.2, 0.3, 0.4]).std(
        correction=0).item())


def test_row_sums_split_by_row_type():
    s = torch.randn(3, 2, 8, 8, generator=torch.Generator().manual_seed(0))
    trigger = torch.tensor([2, 3, 7])
    soft = metrics.row_sums(softmax(s, causal_mask(8)), trigger)
    torch.testing.assert_close(soft["nontrigger"], torch.ones(2))
    zero = metrics.row_sums(relu(-s.abs(), causal_mask(8)), trigger)
    assert torch.all(zero["nontrigger"] == 0) and torch.all(zero["trigger"] == 0)


def test_key_importance_and_sink_rate_match_gu_definition():
    s = torch.randn(5, 3, 8, 8, generator=torch.Generator().manual_seed(1)) * 2
    w = softmax(s, causal_mask(8))
    a = metrics.key_importance(w)
    for k in range(8):
        torch.testing.assert_close(a[..., k], w[..., k:, k].sum(-1) / (8 - k))
    rate = metrics.sink_rate(w, eps=0.3)
    torch.testing.assert_close(rate, (a[..., 0] > 0.3).float().mean(0))


def test_relative_sink_rate_normalises_rows():
    w = sink_weights()[None, None] * 0.1  # a ReLU-like head: rows sum to 0.1
    assert metrics.sink_rate(w).item() == 0.0  # absolute weights never exceed 0.3
    assert metrics.sink_rate(w, relative=True).item() == 1.0
    zero = torch.zeros(1, 1, 8, 8)
    assert metrics.sink_rate(zero, relative=True).item() == 0.0  # all-zero rows stay zero


def test_error_split():
    target = torch.zeros(2, 6, 4)
    pred = torch.zeros(2, 6, 4)
    trigger = torch.tensor([3, 5])
    pred[0, 3, 0] = 0.5  # error on a trigger row
    pred[1, 1, 2] = -0.2  # error on a non-trigger row
    e = metrics.error_split(pred, target, trigger)
    assert e["linf"].item() == pytest.approx(0.5)
    assert e["linf_trigger"].item() == pytest.approx(0.5)
    assert e["linf_nontrigger"].item() == pytest.approx(0.2)
    assert e["mse"].item() == pytest.approx((0.25 + 0.04) / 48)
    assert e["mse_trigger"].item() == pytest.approx(0.25 / 8)
    assert e["mse_nontrigger"].item() == pytest.approx(0.04 / 40)


def test_sink_heads_threshold():
    bos = torch.tensor([[0.95, 0.5], [0.9, 0.89]])
    assert metrics.sink_heads(bos).item() == 2


def test_trigger_masks_select_the_same_rows_as_positions_and_allow_none_or_several():
    a, b = sink_weights(trigger=2), sink_weights(trigger=5)
    weights = torch.stack([a, b])[:, None]
    positions = torch.tensor([2, 5])
    mask = torch.arange(8) == positions[:, None]
    for fn in (metrics.bos_mass_nontrigger, metrics.bos_mass_nontrigger_rows):
        torch.testing.assert_close(fn(weights, mask), fn(weights, positions), equal_nan=True)
    # sample 0 without a trigger (every row 1..7 counts), sample 1 with triggers at 3 and 5
    mask = torch.zeros(2, 8, dtype=torch.bool)
    mask[1, 3] = mask[1, 5] = True
    nontrigger, is_trigger = metrics.row_types(mask, 8)
    assert nontrigger[0].tolist() == [False] + [True] * 7
    assert nontrigger[1].tolist() == [False, True, True, False, True, False, True, True]
    assert torch.equal(is_trigger, mask)
    bos = metrics.bos_mass_nontrigger(weights, mask).item()
    # a's rows 1..7: 1 except its trigger row 2 (0); b's rows 1, 2, 4, 6, 7: all 1
    assert bos == pytest.approx((6 + 5) / 12)
    pred, target = torch.zeros(2, 8, 4), torch.zeros(2, 8, 4)
    pred[0, 2, 0] = 0.3  # not a trigger row in sample 0 any more
    pred[1, 3, 1] = -0.7
    e = metrics.error_split(pred, target, mask)
    assert e["linf_nontrigger"].item() == pytest.approx(0.3)
    assert e["linf_trigger"].item() == pytest.approx(0.7)
    assert e["mse_trigger"].item() == pytest.approx(0.49 / 8)


def test_self_mass_nontrigger_reads_the_diagonal_of_non_trigger_rows():
    w = torch.eye(8)  # every query on itself
    w[4] = 0
    w[4, 1:5] = 0.25  # the trigger row averages
    w[2, 2], w[2, 0] = 0.5, 0.5
    got = metrics.self_mass_nontrigger(w.expand(3, 1, 8, 8), torch.tensor([4, 4, 4]))
    assert got.shape == (1,) and got.item() == pytest.approx((5 + 0.5) / 6)
    assert metrics.self_mass_nontrigger(sink_weights()[None, None], torch.tensor([4])) == 0


def test_encoder_importance_dormancy_and_first_token_mass():
    w = torch.full((4, 4), 0.25)  # bidirectional, uniform
    w[:, 0] = 0.7
    w[:, 1:] = 0.1
    weights = w.expand(3, 2, 4, 4).clone()  # (B, H, L, L)
    torch.testing.assert_close(metrics.key_importance(weights, causal=False)[0, 0],
                               torch.tensor([0.7, 0.1, 0.1, 0.1]))
    assert metrics.sink_rate(weights, eps=0.69, causal=False).tolist() == [1.0, 1.0]
    weights[1, 0, -1, 0] = 0.95  # only sample 1, head 0 has a last query on BOS >= 0.89
    assert metrics.dormant_rate(weights).tolist() == pytest.approx([1 / 3, 0.0])
    assert metrics.dormant_rate(weights, cutoff=0.7).tolist() == [1.0, 1.0]
    causal = sink_weights()[None, None]  # row 0 (BOS's own) is left out of the causal mean
    assert metrics.first_token_mass(causal).item() == pytest.approx(6 / 7)
    enc = metrics.first_token_mass(weights, causal=False)
    assert enc[1].item() == pytest.approx(0.7)
    assert enc[0].item() == pytest.approx(0.7 + 0.25 / 12)


# ------------------------------------------------------------------------- the metric table


def test_every_metric_declares_what_it_measures():
    for name, m in metrics.METRICS.items():
        assert m.name == name and m.kind in metrics.KINDS and m.per in metrics.PER
        assert m.description and "\n" not in m.description
        assert not m.listed or m.scalar
    from sinklab.sweeps.listing import columns

    assert columns() == ["converged", "steps", "linf_error", "bos_max", "sink_heads"]
    with pytest.raises(ValueError, match="metric 'mse' is registered twice"):
        metrics.metric("mse", kind="error")(lambda ev: ev.errors["mse"])
    with pytest.raises(ValueError, match="has kind 'volume', not one of error, mass"):
        metrics.metric("test_volume", kind="volume")(lambda ev: ev.bos)
    assert "test_volume" not in metrics.METRICS


def test_a_trained_run_summary_holds_every_metric_of_the_table(tmp_path):
    from helpers import small_config
    from sinklab.runs.files import read_json
    from sinklab.train import train_runs

    cfg = small_config(model={"n_layers": 2, "n_heads": 2}, train={"max_steps": 5},
                       eval={"n_sequences": 20})
    (summary,) = train_runs([cfg], [tmp_path], progress=False)
    assert set(metrics.METRICS) <= set(summary)
    assert summary["bos_max"] == max(max(layer) for layer in summary["bos_mass_nontrigger"])
    assert summary["sink_heads"] == sum(summary["sink_heads_per_layer"])
    assert len(summary["sink_rate_per_head"]) == 2 and len(summary["sink_rate_per_head"][0]) == 2
    assert read_json(tmp_path / "summary.json") == summary


def test_a_metric_registered_anywhere_reaches_summaries_the_store_and_results(tmp_path,
                                                                               capsys):
    from helpers import run_cli
    from sinklab.runs.files import read_json
    from sinklab.sweeps.store import Store

    @metrics.metric("test_bos_mean", kind="mass", listed=True)
    def bos_mean(ev: metrics.Evaluation) -> torch.Tensor:
        """Non-trigger BOS mass averaged over layers and heads."""
        return ev.bos.mean(dim=(-2, -1))

    try:
        code, _, err = run_cli(capsys, "train", "train.max_steps=3", "eval.n_sequences=16",
                               "--out", str(tmp_path / "run"))
        assert code == 0, err
        summary = read_json(tmp_path / "run" / "summary.json")
        assert summary["test_bos_mean"] == pytest.approx(summary["bos_mass_nontrigger"][0][0])
        spec = tmp_path / "spec.toml"
        spec.write_text('[base]\ntrain.max_steps = 3\neval.n_sequences = 16\n'
                        '[grid]\n"model.attention" = ["softmax", "relu"]\n')
        code, _, err = run_cli(capsys, "sweep", str(spec), "--out", str(tmp_path / "sw"),
                               "--workers", "1")
        assert code == 0, err
        code, out, _ = run_cli(capsys, "results", str(tmp_path / "sw"))
        header, *rows = out.splitlines()
        assert header.split()[-2:] == ["test_bos_mean", "reason"] and len(rows) == 2
        store = Store.read(tmp_path / "sw")
        for row in store.rows():  # the store keeps the run's own value; results shows it
            value = row["metrics"]["test_bos_mean"]
            run = read_json(tmp_path / "sw" / row["path"] / "summary.json")
            assert value == run["test_bos_mean"] == pytest.approx(
                run["bos_mass_nontrigger"][0][0])
            line = next(r for r in rows if r.split()[0] == row["name"])
            assert line.endswith("  " + md.mass_text(value))  # a mass, as masses print
        store.close()
        csv_head = (tmp_path / "sw" / "results.csv").read_text().splitlines()[0]
        assert "test_bos_mean" in csv_head.split(",")
    finally:
        del metrics.METRICS["test_bos_mean"]
    assert "test_bos_mean" not in run_cli(capsys, "results", str(tmp_path / "sw"))[1]

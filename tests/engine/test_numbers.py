"""Numbers a newcomer reads: sink rates as shares in [0, 1] (older records in percent read as
shares), BOS masses printed with 3 significant digits that never read as an exact 1 or 0, and
a sweep summarised per value of a grid key (``sinklab results DIR --by KEY``)."""

from __future__ import annotations

import csv
import json
import shutil
import sqlite3
import statistics
from pathlib import Path

import pytest
import torch

from helpers import run_cli
from sinklab import formats as md
from sinklab import metrics
from sinklab.runs.files import read_json
from sinklab.sweeps.store import SHARES, Store, metrics_of

# ----------------------------------------------------------------------------- sink rates


def test_the_sink_rates_of_a_summary_are_shares():
    # every head of every member puts all of every row on BOS: a sink in every sample
    weights = torch.zeros(2, 1, 4, 2, 8, 8)  # (E, layers, B, H, L, L)
    weights[..., 0] = 1.0
    trigger = torch.full((4,), 5)
    ev = metrics.Evaluation(weights, torch.zeros(2, 4, 8, 4), torch.zeros(4, 8, 4), trigger)
    for row in metrics.metric_values(ev):
        assert row["sink_rate"] == row["sink_rate_relative"] == 1.0
        assert row["sink_rate_per_head"] == [[1.0, 1.0]]
    weights[:, :, :2, 1] = 0.0  # head 1 has no weight on BOS in half the samples
    weights[:, :, :2, 1, :, 1] = 1.0
    (row, _) = metrics.metric_values(metrics.Evaluation(weights, ev.pred, ev.target, trigger))
    assert row["sink_rate_per_head"] == [[1.0, 0.5]] and row["sink_rate"] == 0.75


def test_a_run_writes_its_summary_format_and_older_summaries_read_as_shares(tmp_path, capsys):
    code, _, err = run_cli(capsys, "train", "train.max_steps=3", "eval.n_sequences=16",
                           "--out", str(tmp_path / "run"))
    assert code == 0, err
    summary = read_json(tmp_path / "run" / "summary.json")
    assert summary["summary_format"] == metrics.SUMMARY_FORMAT == 2
    assert metrics.in_shares(summary) == summary  # a share is read as it is
    assert 0 <= summary["sink_rate"] <= 1
    older = {k: v for k, v in summary.items() if k != "summary_format"}
    older.update(sink_rate=40.0, sink_rate_relative=100.0)  # percent, as sinklab wrote them
    assert metrics.in_shares(older)["sink_rate"] == 0.4
    assert metrics.in_shares(older)["sink_rate_relative"] == 1.0
    assert metrics_of(older)["sink_rate"] == 0.4  # what a store keeps of an older run
    assert metrics_of({**older, "sink_rate": None})["sink_rate"] is None  # a diverged run's


# ------------------------------------------------------------------------------ a sweep

SPEC = """seeds = 1
[base]
train.max_steps = 3
eval.n_sequences = 16
[grid]
"model.attention" = ["softmax", "relu"]
"task.seq_len" = [12, 8]
"""


@pytest.fixture(scope="module")
def sweep(tmp_path_factory) -> Path:
    """A finished sweep of four cells (two rules, two lengths given out of order)."""
    from sinklab.cli import main

    root = tmp_path_factory.mktemp("numbers")
    (root / "spec.toml").write_text(SPEC)
    assert main(["sweep", str(root / "spec.toml"), "--out", str(root / "sw"),
                 "--workers", "1"]) == 0
    return root


def _copy(sweep: Path, tmp_path: Path) -> Path:
    """A copy of the sweep's store to change (the run folders are not needed to read it)."""
    out = tmp_path / "sw"
    out.mkdir()
    (out / "sweep.db").write_bytes((sweep / "sw" / "sweep.db").read_bytes())
    return out


def test_an_older_store_in_percent_is_read_and_upgraded_as_shares(sweep, tmp_path, capsys):
    out = tmp_path / "sw"
    shutil.copytree(sweep / "sw", out)
    shares = {r["name"]: r["metrics"]["sink_rate"] for r in Store.read(out).rows()}
    conn = sqlite3.connect(out / "sweep.db")
    assert conn.execute("SELECT value FROM meta WHERE key = ?", SHARES[:1]).fetchone() == \
        (SHARES[1],)
    # as an older sinklab left it: no mark, its rates in percent (here 40%)
    conn.execute("DELETE FROM meta WHERE key = ?", SHARES[:1])
    for name, text in conn.execute("SELECT name, metrics FROM cells").fetchall():
        conn.execute("UPDATE cells SET metrics = ? WHERE name = ?",
                     (json.dumps({**json.loads(text), "sink_rate": 40.0}), name))
    conn.commit()
    conn.close()
    assert {r["metrics"]["sink_rate"] for r in Store.read(out).rows()} == {0.4}
    code, _, err = run_cli(capsys, "results", str(out), "--csv", str(tmp_path / "cells.csv"))
    assert code == 0, err
    table = list(csv.DictReader((tmp_path / "cells.csv").read_text().splitlines()))
    assert {float(r["sink_rate"]) for r in table} == {0.4}
    # the sweep resumed: its store is upgraded, once, before it writes a row of its own
    code, _, err = run_cli(capsys, "sweep", str(sweep / "spec.toml"), "--out", str(out))
    assert code == 0 and "0 to run" in err
    store = Store.read(out)
    store.upgrade_rates()  # again: nothing to do
    assert {r["metrics"]["sink_rate"] for r in store.rows()} == {0.4}
    raw = store.conn.execute("SELECT metrics FROM cells").fetchall()
    assert {json.loads(text)["sink_rate"] for (text,) in raw} == {0.4}
    assert store.meta()[SHARES[0]] == SHARES[1]
    store.close()
    assert all(0 <= v <= 1 for v in shares.values())  # what the sweep itself stored


# ------------------------------------------------------------------------------ BOS mass


@pytest.mark.parametrize(("mass", "text"), [
    (0.99996, "1 - 4.00e-05"), (4e-05, "4.00e-05"), (1.0, "1"), (0.0, "0"), (0.5213, "0.521"),
    (0.995, "1 - 5.00e-03"), (1.00003, "1 + 3.00e-05"), (2.55, "2.55"), (0.0099, "9.90e-03"),
])
def test_a_bos_mass_prints_with_three_significant_digits(mass, text):
    assert md.mass_text(mass) == text


def test_a_bos_mass_never_reads_as_exactly_one_or_zero_unless_it_is():
    for mass in (1 - 1e-12, 1 - 1e-5, 0.99, 0.989999, 0.5, 0.011, 1e-3, 1e-9, 1e-300):
        text = md.mass_text(mass)
        assert text not in ("0", "1", "1.0", "0.0", "0.00", "1.00")
        if text.startswith("1 - "):  # what it says is the mass to 3 significant digits
            assert float(text[4:]) == pytest.approx(1 - mass, rel=5e-3)
        else:
            assert float(text) == pytest.approx(mass, rel=5e-3)
    # a certified lower bound (sinklab worst) prints the same way, from its 1 - b
    from sinklab.theory import sink

    assert sink.mass_text({"off": 4e-05}) == md.mass_text(1 - 4e-05) == "1 - 4.00e-05"
    assert sink.mass_text(0.479) == "0.521" and sink.mass_text(None) == sink.VACUOUS


def test_train_prints_each_heads_bos_mass_so(tmp_path, capsys):
    code, out, err = run_cli(capsys, "train", "train.max_steps=3", "eval.n_sequences=16",
                             "model.n_heads=2", "--out", str(tmp_path / "run"))
    assert code == 0, err
    masses = read_json(tmp_path / "run" / "summary.json")["bos_mass_nontrigger"]
    texts = ", ".join(md.mass_text(v) for v in masses[0])
    assert f"  non-trigger BOS mass [layer][head]: [[{texts}]]\n" in out


# ------------------------------------------------------------------ sinklab results --by


def _table(out: str) -> list[list[str]]:
    """A printed table's rows, split on the two spaces between its columns."""
    return [[c.strip() for c in line.split("  ") if c.strip()] for line in out.splitlines()]


def test_results_by_a_grid_key_summarises_each_value(sweep, tmp_path, capsys):
    out = sweep / "sw"
    rows = Store.read(out).rows()
    code, printed, err = run_cli(capsys, "results", str(out), "--by", "task.seq_len")
    assert code == 0, err
    header, *table = _table(printed)
    assert header[:5] == ["task.seq_len", "cells", "done", "failed", "pending"]
    assert [r[:5] for r in table] == [["8", "2", "2", "0", "0"], ["12", "2", "2", "0", "0"]]
    at = header.index("linf_error")
    for line, length in zip(table, (8, 12)):
        values = [r["metrics"]["linf_error"] for r in rows if r["overrides"]["task.seq_len"]
                  == length]
        assert line[at] == (f"{statistics.median(values):.3g} [{min(values):.3g}, "
                            f"{max(values):.3g}]")
        assert line[header.index("steps")] == "3" and line[header.index("converged")] == "0/2"
    assert "4 of 4 cells in 2 groups by task.seq_len" in err

    code, printed, _ = run_cli(capsys, "results", str(out), "--by", "model.attention",
                               "--where", "task.seq_len=8")
    assert [r[:3] for r in _table(printed)[1:]] == [["relu", "1", "1"], ["softmax", "1", "1"]]
    code, printed, _ = run_cli(capsys, "results", str(out), "--by", "seed", "--status", "failed")
    assert code == 0 and _table(printed)[1:] == []


def test_results_by_counts_cells_by_status_and_writes_its_csv(sweep, tmp_path, capsys):
    out = _copy(sweep, tmp_path)
    conn = sqlite3.connect(out / "sweep.db")  # a sweep stopped before one cell ran
    conn.execute("UPDATE cells SET status = 'pending', metrics = NULL WHERE name = ?",
                 ("model.attention=relu,task.seq_len=12,seed=0",))
    conn.commit()
    conn.close()
    rows = [r for r in Store.read(out).rows() if r["status"] == "done"]
    code, printed, _ = run_cli(capsys, "results", str(out), "--by", "model.attention")
    header, relu, softmax = _table(printed)
    assert relu[:5] == ["relu", "2", "1", "0", "1"]
    assert softmax[:5] == ["softmax", "2", "2", "0", "0"]
    done = [r["metrics"]["bos_max"] for r in rows if r["overrides"]["model.attention"] == "relu"]
    assert relu[header.index("bos_max")] == md.mass_text(done[0])  # the done cell alone

    target = tmp_path / "by.csv"
    for _ in range(2):  # a CSV this command wrote may be written again
        code, printed, err = run_cli(capsys, "results", str(out), "--by", "model.attention",
                                     "--csv", str(target))
        assert code == 0, err
    assert f"wrote 2 groups of 4 cells to {target}" in printed
    table = list(csv.DictReader(target.read_text().splitlines()))
    assert [(r["by"], r["value"], r["cells"], r["done"], r["pending"]) for r in table] == [
        ("model.attention", "relu", "2", "1", "1"), ("model.attention", "softmax", "2", "2", "0")]
    soft = [r["metrics"]["sink_rate"] for r in rows if r["overrides"]["model.attention"] ==
            "softmax"]
    assert float(table[1]["sink_rate_median"]) == statistics.median(soft)
    assert float(table[1]["sink_rate_max"]) == max(soft) <= 1  # a share


def test_results_by_an_unknown_key_names_the_grid_keys(sweep, capsys):
    code, _, err = run_cli(capsys, "results", str(sweep / "sw"), "--by", "colour")
    assert code == 2 and err.strip() == (
        "sinklab: error: --by 'colour' is not a grid key of this sweep: choose one of "
        "model.attention, task.seq_len, seed.")

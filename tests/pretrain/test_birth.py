"""``sinklab birth``: one run watched as its sink forms (sinklab.pretrain.birth), on a tiny
model so that it runs in seconds."""

from __future__ import annotations

import pytest

from sinklab.cli import main
from sinklab.pretrain import birth

TINY = dict(corpus="pydoc", d_model=16, n_layers=2, n_heads=2, context=32, batch_size=4,
            log_every=4, eval_windows=4, warmup=2)


@pytest.fixture
def tiny(monkeypatch):
    monkeypatch.setattr(birth, "BIRTH", {**birth.BIRTH, **TINY})


def point(tokens: int, rates: list[list[float]]) -> dict:
    return {"tokens": tokens, "val_loss": 2.0, "sink_rate": rates,
            "first_mass": [[r / 2 for r in row] for row in rates],
            "resid_ratio": [1.5, 3.0]}


def test_a_sink_is_born_where_the_rate_holds_to_the_end():
    curve = [point(0, [[0, 0], [0, 0]]), point(10, [[0.6, 0], [0, 0]]),
             point(20, [[0, 0], [0, 0]]), point(30, [[0.6, 0], [0, 0]]),
             point(40, [[0.8, 0], [0, 0.7]])]
    assert birth.born(curve) == 30
    assert birth.sink_heads(curve[-1]) == [(0, 0), (1, 1)]
    text = birth.verdict(curve)
    assert "at 30 tokens" in text and "layer(s) 0, 1" in text and "3.0x" in text
    assert "L0H0 0.40, L1H1 0.35" in birth.line(curve[-1])
    assert "no sink held" in birth.verdict(curve[:3]) and "0.150 at 10 tokens" in \
        birth.verdict(curve[:3])


def test_the_command_prints_each_point_resumes_and_reads_a_finished_run_back(
        tiny, tmp_path, capsys):
    out = tmp_path / "birth"
    assert main(["birth", "--out", str(out), "--tokens", str(4 * 32 * 8)]) == 0
    first = capsys.readouterr().out
    assert first.count(" tokens  loss ") == 3  # steps 0, 4 and 8
    assert (out / "birth.png").stat().st_size > 0 and "no sink held" in first
    assert main(["birth", "--out", str(out), "--tokens", str(4 * 32 * 8)]) == 0
    again = capsys.readouterr().out
    assert "holds a finished run" in again and again.count(" tokens  loss ") == 3
    # other settings on a finished run: one sentence, not a retraining
    assert main(["birth", "--out", str(out), "--tokens", str(4 * 32 * 12)]) != 0
    assert "other settings" in capsys.readouterr().err


@pytest.mark.parametrize("args, words", [(["--tokens", "0"], "--tokens=0"),
                                         (["--seed", "-1"], "seed=-1"),
                                         (["--device", "tpu"], "device")])
def test_bad_options_are_one_sentence(tiny, tmp_path, capsys, args, words):
    assert main(["birth", "--out", str(tmp_path / "b"), *args]) != 0
    err = capsys.readouterr().err
    assert words in err and "Traceback" not in err


def test_a_folder_that_is_not_ours_is_refused(tiny, tmp_path, capsys):
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("keep me")
    assert main(["birth", "--out", str(foreign), "--tokens", "1024"]) != 0
    assert (foreign / "notes.txt").read_text() == "keep me"
    assert "Traceback" not in capsys.readouterr().err

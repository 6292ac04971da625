"""Sweep spec keys written two ways: TOML reads ``"model.attention"`` (quoted) and
``model.attention`` (dotted) as two keys, so a spec that gives one key both ways is refused in
one sentence naming the key and both spellings, never run with one of them silently winning."""

from __future__ import annotations

import pytest

from helpers import run_cli
from sinklab.sweeps.spec import SpecError, cells, load_spec


@pytest.mark.parametrize(("text", "message"), [
    ('[grid]\n"model.attention" = ["softmax"]\nmodel.attention = ["relu"]\n',
     "grid key 'model.attention' is given twice, as \"model.attention\" (line 2) and as "
     "model.attention (line 3)"),
    ('[grid]\nmodel.attention = ["relu"]\n"model.attention" = ["softmax"]\n',
     "grid key 'model.attention' is given twice, as model.attention (line 2) and as "
     "\"model.attention\" (line 3)"),
    ('[grid]\n"task.seq_len" = [8]\n[grid.task]\nseq_len = [12]\n',
     "grid key 'task.seq_len' is given twice, as \"task.seq_len\" (line 2) and as "
     "task.seq_len (line 4)"),
    ('[base]\nmodel.attention = "sigmoid"\n[grid]\n"model.attention_args.bias" = [1.0]\n'
     'model.attention_args.bias = [2.0]\n',
     "grid key 'model.attention_args.bias' is given twice, as \"model.attention_args.bias\" "
     "(line 4) and as model.attention_args.bias (line 5)"),
    ('[base]\n"train.max_steps" = 30\ntrain.max_steps = 40\n[grid]\n"task.seq_len" = [8]\n',
     "base key 'train.max_steps' is given twice, as \"train.max_steps\" (line 2) and as "
     "train.max_steps (line 3)"),
    ('[base]\n"model.attention" = "relu"\n[grid]\nmodel.attention = ["softmax"]\n',
     "grid key 'model.attention' (line 4) is also set in [base] (line 2)"),
], ids=["quoted-then-dotted", "dotted-then-quoted", "table", "rule-argument", "base",
        "base-and-grid"])
def test_a_key_given_twice_is_refused_with_both_spellings(tmp_path, capsys, text, message):
    path = tmp_path / "spec.toml"
    path.write_text(text)
    with pytest.raises(SpecError) as info:
        load_spec(path)
    assert message in str(info.value) and "\n" not in str(info.value)
    out = tmp_path / "sw"
    code, _, err = run_cli(capsys, "sweep", str(path), "--out", str(out))
    assert code == 2 and message in err and "Traceback" not in err
    assert not out.exists()  # refused before anything runs


def test_a_quoted_base_key_reads_as_the_dotted_one(tmp_path):
    dotted, quoted = tmp_path / "dotted.toml", tmp_path / "quoted.toml"
    dotted.write_text('[base]\ntrain.max_steps = 30\nmodel.attention_args.bias = 1.0\n'
                      'model.attention = "sigmoid"\n[grid]\n"task.seq_len" = [8, 12]\n')
    quoted.write_text('[base]\n"train.max_steps" = 30\n"model.attention_args.bias" = 1.0\n'
                      'model.attention = "sigmoid"\n[grid]\ntask.seq_len = [8, 12]\n')
    a, b = load_spec(dotted), load_spec(quoted)
    assert a.to_json() == b.to_json()  # the same sweep, whichever way its keys are written
    assert [c.config for c in cells(a)] == [c.config for c in cells(b)]
    assert cells(b)[0].config.train.max_steps == 30

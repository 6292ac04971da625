"""``sinklab lm``: the toy task's sink metrics on real pretrained models, and the
trigger-conditional heads found in them.

For each model (``--model``, repeatable: smollm2, minilm or a path) it runs two probe sets, the
project's natural English passages and random-token sequences, each with and without the
tokenizer's BOS (or [CLS] ... [SEP]) added, and writes::

    {model}/lm.json        every number: per (layer, head) first-token mass, Gu sink rate and
                           Guo dormant fraction with their sweeps, the trigger-conditional heads
    figures/               layer-by-head heat maps, sweeps
    LM.md                  the report (``--docs FILE`` copies it, figures beside it)

Rerunning with the same ``--out`` keeps every model already analysed with the same settings.
"""

from __future__ import annotations

import hashlib
import re
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.figure import Figure

from sinklab import folders, limits, lm, plots, report
from sinklab.config import ConfigError, check_count
from sinklab.experiments import reproduce as rep
from sinklab.results import read_json, write_atomic, write_json
from sinklab.train import resolve_device, versions

MAIN_EPS, MAIN_CUTOFF = "0.3", "0.89"
TITLE = "# Sinks in real pretrained models"  # the report's first line (--docs checks it)
PROBE_SETS = ("natural", "random")


@dataclass
class LMOptions:
    """What ``sinklab lm`` analyses; every value is checked on creation."""

    models: tuple[str, ...] = ("smollm2",)
    device: str = "auto"
    batch_size: int = 16
    n_tokens: int = lm.PROBE_TOKENS
    n_random: int = lm.N_RANDOM

    def __post_init__(self) -> None:
        if not self.models:
            raise ConfigError("--model needs at least one model: smollm2, minilm or a path.")
        for spec in self.models:
            if self.models.count(spec) > 1:
                raise ConfigError(f"--model {spec} is given twice; give each model once.")
        check_count("--batch-size", self.batch_size)
        check_count("--random", self.n_random)
        if not (isinstance(self.n_tokens, int) and self.n_tokens >= 8):
            raise ConfigError(f"--tokens={self.n_tokens!r} is not allowed: it must be an "
                              "integer >= 8.")
        resolve_device(self.device, "--device")

    def settings(self) -> dict[str, Any]:
        """What a model's analysis depends on (every option but the list of models)."""
        return asdict(self) | {"models": None}


def folder_name(spec: str) -> str:
    """A model's subfolder: its short name, or the path's last part made file-name safe."""
    if spec in lm.PACKAGED:
        return spec
    stem = Path(spec).expanduser().resolve().name
    digest = hashlib.blake2b(spec.encode(), digest_size=3).hexdigest()
    return re.sub(r"[^A-Za-z0-9._-]+", "_", stem) + f"-{digest}"


def conditions(loaded: lm.LoadedModel) -> list[tuple[str, bool]]:
    """(label, add specials) pairs: with and without the tokenizer's BOS / [CLS] ... [SEP]."""
    if not loaded.prefix and not loaded.suffix:
        return [("no BOS token in this tokenizer", False)]
    added = " ... ".join(loaded.special_names)
    return [(f"with {added}", True), (f"without {added}", False)]


def probe_bytes(loaded: lm.LoadedModel, opts: LMOptions, natural: tuple[int, ...]) -> int:
    """Memory of the probes and of one batch's attention weights (every layer's, kept by the
    model and stacked here), beyond the model itself."""
    n_natural, tokens = natural
    tokens += 2  # BOS, or [CLS] and [SEP]
    ids = 8 * tokens * (n_natural + 2 * opts.n_random)
    batch = min(opts.batch_size, max(n_natural, opts.n_random))
    weights = 4 * batch * loaded.n_layers * loaded.n_heads * tokens * tokens
    per_query = 4 * 8 * loaded.n_layers * loaded.n_heads * n_natural * tokens  # the finder's
    return ids + 4 * weights + per_query


def analyse_model(spec: str, opts: LMOptions, log: Callable[[str], None]) -> dict[str, Any]:
    """Load one model, run every probe set and condition, and return its results."""
    start = time.perf_counter()
    source = lm.locate(spec)
    device = resolve_device(opts.device)
    loaded = lm.load(source, device)
    load_s = time.perf_counter() - start
    log(f"lm: {spec}: loaded {loaded.n_layers} layers x {loaded.n_heads} heads in "
        f"{load_s:.0f} s")
    natural = lm.natural_ids(loaded, lm.natural_texts(), opts.n_tokens)
    if natural.shape[1] < opts.n_tokens:
        log(f"lm: {spec}: the shortest natural probe has {natural.shape[1]} tokens, so every "
            f"probe is cut to {natural.shape[1]} (--tokens {opts.n_tokens} asked for more)")
    limits.check_memory(probe_bytes(loaded, opts, natural.shape),
                        f"--model {spec} with --random {opts.n_random} and --batch-size "
                        f"{opts.batch_size}", device)
    probes = {"natural": natural, "random": lm.random_ids(loaded, opts.n_random,
                                                          natural.shape[1])}
    results, finder = [], None
    for probe in PROBE_SETS:
        for label, specials in conditions(loaded):
            ids = lm.with_specials(loaded, probes[probe], specials)
            # the finder reads the natural probes in the model's first condition (with BOS)
            wanted = probe == "natural" and label == conditions(loaded)[0][0]
            acc = lm.Accumulator(loaded.n_layers, loaded.n_heads, per_query=wanted)
            for _, weights in lm.attentions(loaded, ids, opts.batch_size):
                acc.add(weights)
            results.append({"probes": probe, "condition": label, "specials": specials,
                            "sequences": int(ids.shape[0]), "tokens": int(ids.shape[1]),
                            **acc.summary()})
            if wanted and acc.causal:
                positions = np.tile(np.arange(1, ids.shape[1]), ids.shape[0])
                tokens = ids[:, 1:].reshape(-1).numpy()
                finder = lm.find_trigger_heads(acc.query_arrays(), tokens, positions,
                                               loaded.tokenizer.decode)
            log(f"lm: {spec}: {probe} probes, {label}: done "
                f"({time.perf_counter() - start:.0f} s)")
    return {
        "model": spec, "folder": str(source.folder), "gguf": source.gguf,
        "architecture": type(loaded.model).__name__, "n_layers": loaded.n_layers,
        "n_heads": loaded.n_heads, "causal": results[0]["causal"],
        "special_tokens": loaded.special_names, "tokenizer_adds_them": loaded.adds_specials,
        "settings": opts.settings(),
        "load_s": load_s, "total_s": time.perf_counter() - start, "device": str(device),
        "results": results, "trigger_heads": finder,
    }


def run_lm(out: Path, opts: LMOptions, *, log: Callable[[str], None] | None = None,
           docs: Path | None = None, command: str | None = None) -> dict[str, Any]:
    """Analyse every model into ``out`` (keeping models already done), then write LM.md."""
    log = log or (lambda line: print(line, file=sys.stderr, flush=True))
    out = Path(out)
    for spec in opts.models:  # every model must be findable before anything is written
        lm.locate(spec)
    rep.check_docs(docs, TITLE)
    with folders.writing(out, "lm"):
        return _run_lm(out, opts, log, docs, command)


def _run_lm(out: Path, opts: LMOptions, log: Callable[[str], None], docs: Path | None,
            command: str | None) -> dict[str, Any]:
    models = []
    for spec in opts.models:
        path = out / folder_name(spec) / "lm.json"
        if path.is_file() and read_json(path).get("settings") == opts.settings():
            log(f"lm: {spec}: already analysed in {path.parent}")
            models.append(read_json(path))
            continue
        result = analyse_model(spec, opts, log)
        write_json(path, result)
        models.append(read_json(path))
    meta = {"command": command or f"sinklab lm --out {out}",
            "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"), "versions": versions()}
    figures = [f for m in models for f in write_figures(out, m)]
    write_atomic(out / "LM.md", render(models, meta, "figures").encode())
    if docs is not None:
        rep.copy_to_docs(Path(docs), figures, lambda prefix: render(models, meta, prefix))
    log(f"lm: wrote {out / 'LM.md'}")
    return {"models": models, **meta}


# ------------------------------------------------------------------------------ outputs


def _main(model: dict[str, Any]) -> dict[str, Any]:
    return model["results"][0]  # natural probes, first condition


def _share_above(values: list[list[float]], level: float) -> float:
    return float((np.asarray(values) >= level).mean())


def write_figures(out: Path, model: dict[str, Any]) -> list[Path]:
    name = folder_name(model["model"])
    results = model["results"]
    cols = len(results) // len(PROBE_SETS)
    fig = Figure(figsize=(4.2 * cols, 3.6 * len(PROBE_SETS)))
    axes = fig.subplots(len(PROBE_SETS), cols, squeeze=False)
    for ax, r in zip(axes.flat, results):
        mass = np.asarray(r["first_token_mass"])
        layers, heads = mass.shape  # 1-indexed, as the tables name heads (L21 H9)
        image = ax.imshow(mass, cmap="Blues", vmin=0, vmax=1, aspect="auto",
                          interpolation="nearest",
                          extent=(0.5, heads + 0.5, layers + 0.5, 0.5))
        ax.set_xlabel("head")
        ax.set_ylabel("layer")
        ax.set_title(f"{r['probes']}, {r['condition']}", fontsize=8)
        fig.colorbar(image, ax=ax, fraction=0.046, pad=0.04)
    fig.suptitle(f"{model['model']}: first-token mass per (layer, head)", fontsize=10)
    fig.tight_layout()
    heat = out / "figures" / f"fig_lm_{name}_first_token.png"
    plots.save_figure(fig, heat)

    fig = Figure(figsize=(13, 3.6))
    ax_eps, ax_cut, ax_layer = fig.subplots(1, 3)
    for r in results:
        label = f"{r['probes']}, {r['condition']}"
        eps = [float(k) for k in r["sink_rate"]]
        ax_eps.plot(eps, [v["overall"] for v in r["sink_rate"].values()], marker="o",
                    label=label)
        cut = [float(k) for k in r["dormant"]]
        ax_cut.plot(cut, [100 * v["overall"] for v in r["dormant"].values()], marker="o",
                    label=label)
        per_layer = r["sink_rate"][MAIN_EPS]["per_layer"]
        ax_layer.plot(range(1, len(per_layer) + 1), per_layer, marker=".", label=label)
    ax_eps.set_xlabel("eps")
    ax_eps.set_title("Gu sink rate (%) against eps", fontsize=9)
    ax_cut.set_xlabel("cut-off on the last query's first-token weight")
    ax_cut.set_title("Guo dormant (sample, layer, head) (%)", fontsize=9)
    ax_layer.set_xlabel("layer")
    ax_layer.set_title(f"Gu sink rate (%) per layer, eps = {MAIN_EPS}", fontsize=9)
    for ax in (ax_eps, ax_cut, ax_layer):
        ax.set_ylim(-2, 102)
        ax.legend(fontsize=6)
    fig.tight_layout()
    sweeps = out / "figures" / f"fig_lm_{name}_sweeps.png"
    plots.save_figure(fig, sweeps)
    return [heat, sweeps]


def summary_table(model: dict[str, Any]) -> str:
    rows = []
    for r in model["results"]:
        mass = r["first_token_mass"]
        rows.append([
            r["probes"], r["condition"], f"{r['sequences']} x {r['tokens']}",
            f"{float(np.mean(mass)):.3f}", f"{_share_above(mass, 0.5):.2f}",
            " / ".join(f"{v['overall']:.0f}" for v in r["sink_rate"].values()),
            " / ".join(f"{100 * v['overall']:.0f}" for v in r["dormant"].values()),
        ])
    eps = " / ".join(lm_keys(model, "sink_rate"))
    cut = " / ".join(lm_keys(model, "dormant"))
    return report.table(["probes", "condition", "sequences x tokens", "first-token mass (mean "
                         "over heads)", "share of heads >= 0.5",
                         f"Gu sink rate % at eps {eps}", f"dormant % at cut-off {cut}"], rows)


def lm_keys(model: dict[str, Any], key: str) -> list[str]:
    return list(model["results"][0][key])


def layer_table(model: dict[str, Any]) -> str:
    results = model["results"]
    headers = ["layer"]
    for r in results:
        short = f"{r['probes']}, {r['condition']}"
        headers += [f"first-token mass ({short})", f"sink rate % ({short})"]
    rows = []
    for layer in range(model["n_layers"]):
        row: list[object] = [layer + 1]
        for r in results:
            row += [f"{float(np.mean(r['first_token_mass'][layer])):.2f}",
                    f"{r['sink_rate'][MAIN_EPS]['per_layer'][layer]:.0f}"]
        rows.append(row)
    return report.table(headers, rows)


def trigger_table(model: dict[str, Any]) -> str:
    rows = []
    for h in model["trigger_heads"] or []:
        tokens = ", ".join(f"`{t['token'].strip() or repr(t['token'])}` ({t['count']}, "
                           f"{t['mean_first']:.2f})" for t in h["tokens"])
        w = h["when_triggered"]
        rows.append([f"L{h['layer'] + 1} H{h['head'] + 1}", f"{h['dormant_share']:.2f}",
                     f"{h['median_first']:.2f}", h["n_trigger_tokens"], h["n_triggered"],
                     tokens, w["kind"],
                     f"{w['first']:.2f} / {w['prev']:.2f} / {w['self']:.2f} / {w['top']:.2f} / "
                     f"{w['entropy']:.2f}"])
    return report.table(["head", "dormant share", "median first-token weight",
                         "trigger tokens", "triggered queries",
                         "top trigger tokens (count, mean first-token weight)",
                         "when triggered it attends to",
                         "first / previous / itself / largest other / entropy"], rows)


def relation(model: dict[str, Any]) -> list[str]:
    """How the heads found relate to the paper's trigger-conditional task, in measured terms."""
    heads = model["trigger_heads"]
    if not heads:
        return []
    top = heads[0]
    w = top["when_triggered"]
    tokens = ", ".join(f"`{t['token'].strip()}`" for t in top["tokens"][:3])
    averages = w["entropy"] >= 0.8
    return [
        "**How this relates to the paper's task.** The paper's head outputs zero (parks on BOS) "
        "everywhere except at a trigger, where it averages the tokens before it. "
        f"L{top['layer'] + 1} H{top['head'] + 1} shares the first half of that pattern: its "
        f"median first-token weight is {top['median_first']:.2f} and it drops to "
        f"{w['first']:.2f} on average at {tokens}. "
        + ("When triggered its row is near uniform over the previous tokens (entropy "
           f"{w['entropy']:.2f}), as the task's target asks. " if averages else
           f"When triggered it does not average the previous tokens as the task's target "
           f"does (entropy {w['entropy']:.2f}); it mostly attends to {w['kind']}. ")
        + "This is a correlation read off attention weights on "
        f"{_main(model)['sequences']} probes: it does not show what the head computes, or that "
        "its first-token default exists for the reason the theorem gives; that would need "
        "interventions on the model, which `sinklab lm` does not make.",
        "",
    ]


def render(models: list[dict[str, Any]], meta: dict[str, Any], prefix: str) -> str:
    v = meta["versions"]
    lines = [
        TITLE,
        "",
        f"- Written by: `{meta['command']}` on {meta['date']}",
        f"- Versions: sinklab {v['sinklab']}, torch {v['torch']}, Python {v['python']}",
        "- Probes: the project's natural English passages (`src/sinklab/data/probes_en.txt`, "
        "each cut to the same number of tokens) and random-token sequences (uniform over the "
        f"vocabulary without special tokens, seed {lm.RANDOM_SEED}), each run with and without "
        "the tokenizer's BOS (an encoder's [CLS] ... [SEP]).",
        "- Metrics, the same functions as for the toy models (`sinklab.metrics`): *first-token "
        "mass*, the mean weight on position 0 over the queries that can see it (a decoder's "
        "query 0 is left out); *Gu sink rate*, the % of (sample, layer, head) whose first-key "
        "importance exceeds eps; *dormant*, the % of (sample, layer, head) whose last query "
        "puts at least the cut-off on the first key (Guo et al.: 0.89).",
        "",
    ]
    for m in models:
        name = folder_name(m["model"])
        kind = "decoder (causal)" if m["causal"] else "encoder (bidirectional)"
        lines += [
            f"## {m['model']}",
            "",
            f"{m['architecture']}, {m['n_layers']} layers x {m['n_heads']} heads, {kind}; "
            f"special tokens added: {', '.join(m['special_tokens']) or 'none'} (a plain "
            f"tokenizer call {'adds' if m['tokenizer_adds_them'] else 'does not add'} them, "
            f"so the \"{'with' if m['tokenizer_adds_them'] else 'without'}\" rows are what a "
            f"default pipeline measures). Loaded in {m['load_s']:.0f} s, analysed in "
            f"{m['total_s']:.0f} s in all on {m['device']}.",
            "",
            summary_table(m),
            "",
            f"![first-token mass per head]({prefix}/fig_lm_{name}_first_token.png)",
            "",
            f"![sweeps]({prefix}/fig_lm_{name}_sweeps.png)",
            "",
            "<details markdown=\"1\"><summary>Per layer (mean over heads; sink rate at eps "
            f"{MAIN_EPS})</summary>",
            "",
            layer_table(m),
            "",
            "</details>",
            "",
        ]
        if not m["causal"]:
            main = _main(m)
            first = np.asarray(main["first_token_mass"])
            last = np.asarray(main["last_token_mass"])
            names = m["special_tokens"] or ["first token", "last token"]
            lines += [f"Where an encoder's sinks sit (natural probes, {main['condition']}): the "
                      f"first token ({names[0]}) takes {first.mean():.3f} of the weight on "
                      f"average over every query and head, the last ({names[-1]}) "
                      f"{last.mean():.3f}, against 1/{main['tokens']} = "
                      f"{1 / main['tokens']:.3f} for a uniform row; {int((first >= 0.5).sum())} "
                      f"of {first.size} heads put at least half their weight on the first, "
                      f"{int((last >= 0.5).sum())} on the last.", ""]
        if m["trigger_heads"] is not None:
            lines += [
                f"### Trigger-conditional heads in {m['model']}",
                "",
                f"Heads that put >= {lm.DORMANT_LEVEL} on the first token for at least "
                f"{lm.DORMANT_SHARE:.0%} of their queries (natural probes, "
                f"{_main(m)['condition']}, query positions >= {lm.MIN_POSITION}) but whose "
                f"first-token weight averages <= {lm.TRIGGERED_LEVEL} for some token seen at "
                f"least {lm.MIN_COUNT} times. Ranked by the number of such tokens; the last "
                "column says where the triggered queries put their weight (means; entropy is "
                "that of the row without the first key, 1 for uniform).",
                "",
                trigger_table(m) if m["trigger_heads"] else "No head met both conditions.",
                "",
                *relation(m),
            ]
    return "\n".join(lines)

"""``sinklab lm``'s analysis (declared in ``sinklab.studies.lm``): the inputs checked before any
model is loaded (``check``), each model's analysis and interventions run by ``sinklab.lm.survey``
and kept in the run's cache (``collect``), the claims they test (``claims``), the records'
intervals worked out again (``complete``) and the figures (``FIGURES``).

The heads' two units behind the interventions' numbers (``Units``, ``head_analysis``, ...) are
``sinklab.lm.units``; the interventions' claims, each a contrast of the sink's units with random
ones, are ``sinklab.studies.lm_contrasts``; this module turns the rest into claims and
figures. It imports torch (through ``sinklab.lm.survey``) and is loaded only when the study runs
or renders::

    sinklab lm --model smollm2 --out results/lm
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from sinklab import claims as cl
from sinklab.claims import Claim
from sinklab.definitions import GU_EPS, GUO_CUTOFF
from sinklab.errors import ConfigError, Interrupted
from sinklab.lm import settings, sources, survey
from sinklab.lm.units import HOWS, Units, described, head_analysis, probe_summary, with_bands
from sinklab.studies.lm import MAX_TOKENS, LMOptions
from sinklab.studies.lm_contrasts import intervention_claims
from sinklab.studies.options import named
from sinklab.studies.outputs import default_log
from sinklab.studies.reference import GU
from sinklab.studies.study import Context, Execution, FigureSpec, read_kept
from sinklab.train import resolve_device

if TYPE_CHECKING:
    from sinklab.lm.edits import Stages

MAIN_EPS, MAIN_CUTOFF = f"{GU_EPS:g}", f"{GUO_CUTOFF:g}"  # keys of the sweeps the report leads with
HALF = 0.5  # "a head puts at least half its weight on the first token"
FORMAT = 7  # layout of a model's cached analysis: a change here recomputes every model

assert MAIN_EPS in {f"{e:g}" for e in settings.EPS_SWEEP}
assert MAIN_CUTOFF in {f"{c:g}" for c in settings.CUTOFF_SWEEP}


def check(opts: LMOptions, exe: Execution, out: Path) -> None:
    """Everything the inputs decide, before any model is loaded or anything is written: the
    probe texts, and for every model whose work is not already kept in ``out``: its files,
    config and tokenizer (``lm.inspect``, without its weights), ``--tokens`` against the
    positions it takes, and the memory its analysis and interventions need. What the texts are
    too short to measure is said here too (it is data, not an error)."""
    tokens = named(opts, "n_tokens")
    if opts.n_tokens > MAX_TOKENS:
        raise ConfigError(f"{tokens}={opts.n_tokens} is not allowed: no model sinklab loads "
                          f"takes more than {MAX_TOKENS:,} positions; give at most that.")
    texts = opts.probe_texts()
    located = {spec: sources.locate(spec) for spec in opts.models}
    device = resolve_device(exe.device)
    cfg = opts.survey(texts, exe.device)
    survey.forget()
    for spec, source in located.items():
        if not _kept(spec, opts, exe, out):
            survey.preflight(spec, source, cfg, device, default_log, tokens)


def _kept(spec: str, opts: LMOptions, exe: Execution, out: Path) -> bool:
    """Whether ``out`` keeps this model's whole analysis (and interventions, when asked for)
    with these settings already, so that the model need not be read at all."""
    wanted = [(sources.folder_name(spec), analysis_settings(spec, opts, exe))]
    if opts.n_intervene:
        wanted.append((f"{sources.folder_name(spec)}-interventions",
                       intervention_settings(spec, opts, exe)))
    return all(read_kept(out / "cache" / f"{key}.json", want, "result") is not None
               for key, want in wanted)


# ----------------------------------------------------------------------------- analysis


def intervention_settings(spec: str, opts: LMOptions, exe: Execution) -> dict[str, Any]:
    """What one model's interventions depend on: the analysis's settings (whose finder heads
    get the targeted ablation) and the intervention options."""
    return {**analysis_settings(spec, opts, exe), "n_intervene": opts.n_intervene,
            "ablate_heads": opts.ablate_heads, "cap_eps": opts.cap_eps, "window": opts.window,
            "sink_tokens": list(settings.SINK_TOKENS), "harmless": settings.HARMLESS,
            "control_seed": settings.CONTROL_SEED, "bands": [list(b) for b in settings.BANDS],
            "destinations": [list(d) for d in settings.DESTINATIONS]}


def analysis_settings(spec: str, opts: LMOptions, exe: Execution) -> dict[str, Any]:
    """What one model's analysis depends on (a cached analysis with other settings is redone):
    the options, the files the model resolves to (a new snapshot of a Hugging Face id is
    another model) and the natural texts themselves, by digest."""
    source = sources.locate(spec)
    texts = opts.probe_texts()
    return {"format": FORMAT, "model": spec,
            "files": str(source.folder / source.gguf if source.gguf else source.folder),
            "probes": {"label": texts.label, "n": len(texts.texts), "digest": texts.digest()},
            "n_tokens": opts.n_tokens, "n_random": opts.n_random, "batch_size": opts.batch_size,
            "device": exe.device}


# ------------------------------------------------------------------------------ records


def _described(result: dict[str, Any]) -> dict[str, Any]:
    """One probe set's per-head values summarised over heads (descriptive numbers)."""
    first = np.asarray(result["first_token_mass"], dtype=float)
    last = np.asarray(result["last_token_mass"], dtype=float)
    return {**result, "first_mean": float(first.mean()),
            "first_per_layer": first.mean(axis=1).tolist(),
            "heads_first_half": int((first >= HALF).sum()),
            "share_first_half": float((first >= HALF).mean()),
            "last_mean": float(last.mean()), "heads_last_half": int((last >= HALF).sum()),
            "pairs": int(first.size)}


def _tables(models: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Flat rows for the CSV files: one per (model, probe set, condition), one per head."""
    sets, heads = [], []
    for m in models:
        for r in m["results"]:
            sets.append({"model": m["model"], "probes": r["probes"], "label": r["label"],
                         "condition": r["condition"], "sequences": r["sequences"],
                         "min_tokens": r["lengths"]["min"],
                         "median_tokens": r["lengths"]["median"], "tokens": r["tokens"],
                         "first_token_mass_mean": r["first_mean"],
                         "share_heads_first_half": r["share_first_half"],
                         "gu_sink_rate": r["sink_rate"][MAIN_EPS]["overall"],
                         "dormant_rate": r["dormant"][MAIN_CUTOFF]["overall"]})
            for layer in range(m["n_layers"]):
                for head in range(m["n_heads"]):
                    heads.append({
                        "model": m["model"], "probes": r["probes"], "label": r["label"],
                        "condition": r["condition"], "layer": layer + 1, "head": head + 1,
                        "first_token_mass": r["first_token_mass"][layer][head],
                        "last_token_mass": r["last_token_mass"][layer][head],
                        "gu_sink_rate": r["sink_rate"][MAIN_EPS]["per_head"][layer][head],
                        "dormant_rate": r["dormant"][MAIN_CUTOFF]["per_head"][layer][head]})
    return sets, heads


def collect(ctx: Context) -> dict[str, Any]:
    opts: LMOptions = ctx.opts
    texts = opts.probe_texts()
    cfg = opts.survey(texts, ctx.exe.device)
    models: list[dict[str, Any]] = []
    kept: list[tuple[str, str, Any]] = []  # (model, part, its Stages; None once it is whole)

    def part(spec: str, name: str, key: str, wanted: dict[str, Any],
             compute: Callable[[Stages], dict[str, Any]]) -> dict[str, Any]:
        """One model's analysis or interventions: kept whole in cache/KEY.json, else computed
        stage by stage (resuming from the stages a stopped run finished)."""
        stages = ctx.stages(key, wanted)
        kept.append((spec, name, stages))

        def run() -> dict[str, Any]:
            if stages.done:
                ctx.log(f"lm: {spec}: {name} resumed from {len(stages.done)} finished "
                        f"stage(s) in {stages.path}")
            return compute(stages)

        result = ctx.cached(key, wanted, run)
        stages.finish()
        kept[-1] = (spec, name, None)
        return result

    try:
        for spec in opts.models:
            loader = survey.Loader(spec, cfg.device, ctx.log)
            analysis = part(spec, "analysis", sources.folder_name(spec),
                            analysis_settings(spec, opts, ctx.exe),
                            lambda stages, spec=spec, loader=loader: survey.analyse_model(
                                spec, cfg, ctx.log, loader, stages))
            model = {**analysis, "results": [_described(r) for r in analysis["results"]]}
            if opts.n_intervene:
                done = part(spec, "interventions", f"{sources.folder_name(spec)}-interventions",
                            intervention_settings(spec, opts, ctx.exe),
                            lambda stages, analysis=analysis, loader=loader: survey.intervene(
                                analysis, cfg, loader, ctx.log, stages))
                model["interventions"] = described(done)
            models.append(model)
    except KeyboardInterrupt:
        raise Interrupted(interrupted_text(ctx.out, kept)) from None
    sets, heads = _tables(models)
    return {
        "models": models, "probe_sets": sets, "heads": heads,
        "probes": {"source": texts.source, "label": texts.label, "file": texts.file,
                   "n_natural": len(texts.texts),
                   "n_file": len(texts.texts) - len(opts.texts) if texts.file else 0,
                   "n_text": len(opts.texts), "max_tokens": opts.n_tokens,
                   "random_seed": settings.RANDOM_SEED},
        "sweeps": {"eps": [f"{e:g}" for e in settings.EPS_SWEEP],
                   "cutoffs": [f"{c:g}" for c in settings.CUTOFF_SWEEP],
                   "main_eps": MAIN_EPS, "main_cutoff": MAIN_CUTOFF},
        "finder": {"dormant_level": settings.DORMANT_LEVEL, "dormant_share": settings.DORMANT_SHARE,
                   "min_count": settings.MIN_COUNT, "min_position": settings.MIN_POSITION,
                   "follow": settings.FOLLOW, "spread_entropy": settings.SPREAD_ENTROPY},
        "min_measured": settings.MIN_MEASURED, "half": HALF,
        "intervened": [m["key"] for m in _intervened({"models": models})],
    }


def interrupted_text(out: Path, kept: list[tuple[str, str, Any]]) -> str:
    """What an interrupted ``sinklab lm`` keeps, truthfully: each model's finished parts (a
    whole analysis or interventions, or the stages of one that were finished), and that the
    stage in progress and the report are not."""
    parts = []
    for spec, part, stages in kept:
        if stages is None:
            parts.append(f"{spec}'s {part}")
            continue
        names = list(stages.done)
        if not names:
            continue
        layers = sum(n.startswith("sweep ") for n in names)
        words = [n for n in names if ":" in n] + \
            (["the head statistics"] if "head_stats" in names else []) + \
            (["the global edits"] if "global" in names else []) + \
            ([f"{layers} layer(s) of the head sweep"] if layers else [])
        parts.append(f"of {spec}'s {part}: {', '.join(words)}")
    where = out / "cache"
    if not parts:
        return ("nothing was finished yet, so nothing is kept; no report was written")
    return (f"kept in {where}: {'; '.join(parts)}; not kept: the stage in progress, and no "
            "report was written; run the same command again to go on from there")


# ------------------------------------------------------------------------------- claims


def condition_key(result: dict[str, Any]) -> str:
    return "with_specials" if result["specials"] else "without_specials"


def first_token_provenance(model: dict[str, Any], result: dict[str, Any]) -> str:
    """What sits at position 0 of a probe set, in words."""
    if result["specials"] and model.get("special_tokens"):
        adds = "adds" if model["tokenizer_adds_them"] else "does not add"
        return (f"the tokenizer's {model['special_tokens'][0]}, put in front by sinklab "
                f"(a plain tokenizer call {adds} it)")
    return "the first random token (no special token in front)"


def claims(records: dict[str, Any], opts: LMOptions) -> list[Claim]:
    """Each decoder's Gu sink rate on random tokens beside the range Gu et al. report for open
    LMs, per condition, described (no verdict: the comparison is of one model with a range
    over other models), with the probe as the unit: a probe's rate is its share of (layer,
    head) pairs over the threshold, and the interval resamples probes; then each causal model's
    interventions (``intervention_claims``). Encoders get no Gu claim: Gu et al.'s range is for
    decoder LMs, and an encoder's first-key importance averages over every query."""
    out = []
    eps = float(MAIN_EPS)
    for m in records["models"]:
        if not m["causal"]:
            continue
        pairs = m["n_layers"] * m["n_heads"]
        for r in m["results"]:
            if r["probes"] != "random":
                continue
            rates = r["sink_rate"][MAIN_EPS]["per_probe"]
            s = probe_summary(rates)
            lo, hi = s["interval"]
            out.append(cl.descriptive(
                f"{m['key']}.random.{condition_key(r)}.gu_rate",
                f"{m['model']}, random tokens {r['condition']}: the Gu sink rate (eps = "
                f"{eps:g}) beside the range Gu et al. report for open LMs, "
                f"{GU.low:.0%}-{GU.high:.0%}",
                f"mean over {len(rates)} random-token probes of T = {r['tokens']} tokens of each "
                f"probe's share of its {pairs} (layer, head) pairs whose first-key importance "
                f"exceeds {eps:g}: {s['mean']:.3f}, bootstrap bounds over probes [{lo:.3f}, "
                f"{hi:.3f}] (the probe is the unit: the pairs of one probe are not "
                f"independent); the first token: {first_token_provenance(m, r)}; Gu et al.: "
                f"{GU.what}, {GU.low:.0%}-{GU.high:.0%} ({GU.source})",
                n=len(rates), estimate=s["mean"], interval=(lo, hi)))
    for m in records["models"]:
        iv_rec = m.get("interventions")
        if iv_rec and m["causal"] and "baseline" in iv_rec:
            out.extend(intervention_claims(m))
    return out


def complete(records: dict[str, Any], opts: LMOptions | None = None) -> dict[str, Any]:
    """The records with every interval of the interventions worked out again from their
    per-probe and per-head values: records written before the
    intervals' procedure changed get today's, the same the claims use."""
    models = []
    for m in records["models"]:
        iv = m.get("interventions")
        if isinstance(iv, dict) and "global" in iv:
            iv = {**iv, "global": [with_bands(g) for g in iv["global"]]}
            if "baseline" in iv:
                iv["streaming"] = [with_bands(x) for x in iv["streaming"]]
                iv["units"] = head_analysis(iv)
            m = {**m, "interventions": iv}
        models.append(m)
    return {**records, "models": models}


# ------------------------------------------------------------------------------ figures


def _label(model: dict[str, Any], result: dict[str, Any]) -> str:
    return f"{model['key']}: {result['label']}, {result['condition']}"


def _heat_grid(records: dict[str, Any], opts: LMOptions) -> tuple[int, int]:
    return len(records["models"]), max(len(m["results"]) for m in records["models"])


def _draw_heat(axes: Any, records: dict[str, Any], opts: LMOptions) -> None:
    """Every (layer, head)'s first-token mass, one panel per (model, probe set, condition)."""
    for row, m in enumerate(records["models"]):
        for col in range(axes.shape[1]):
            ax = axes[row, col]
            if col >= len(m["results"]):
                ax.set_axis_off()
                continue
            r = m["results"][col]
            mass = np.asarray(r["first_token_mass"])
            layers, heads = mass.shape  # 1-indexed, as the tables name heads (L21 H9)
            image = ax.imshow(mass, cmap="Blues", vmin=0, vmax=1, aspect="auto",
                              interpolation="nearest",
                              extent=(0.5, heads + 0.5, layers + 0.5, 0.5))
            ax.set_xlabel("head")
            ax.set_ylabel("layer")
            ax.set_title(_label(m, r), fontsize=8)
            ax.figure.colorbar(image, ax=ax, fraction=0.046, pad=0.04)


def _draw_sweeps(axes: Any, records: dict[str, Any], opts: LMOptions) -> None:
    """Per model: the Gu rate against eps, the dormant rate against the cut-off, and the Gu
    rate per layer at the main eps, one line per (probe set, condition)."""
    for row, m in enumerate(records["models"]):
        ax_eps, ax_cut, ax_layer = axes[row]
        for r in m["results"]:
            label = f"{r['label']}, {r['condition']}"
            ax_eps.plot([float(k) for k in r["sink_rate"]],
                        [100 * v["overall"] for v in r["sink_rate"].values()], marker="o",
                        label=label)
            ax_cut.plot([float(k) for k in r["dormant"]],
                        [100 * v["overall"] for v in r["dormant"].values()], marker="o",
                        label=label)
            per_layer = r["sink_rate"][MAIN_EPS]["per_layer"]
            ax_layer.plot(range(1, len(per_layer) + 1), [100 * v for v in per_layer],
                          marker=".", label=label)
        ax_eps.set_xlabel("eps")
        ax_eps.set_title(f"{m['key']}: Gu sink rate (%) against eps", fontsize=9)
        ax_cut.set_xlabel("cut-off on the last query's first-token weight")
        ax_cut.set_title(f"{m['key']}: Guo dormant (sample, layer, head) (%)", fontsize=9)
        ax_layer.set_xlabel("layer")
        ax_layer.set_title(f"{m['key']}: Gu sink rate (%) per layer, eps = {MAIN_EPS}",
                           fontsize=9)
        for ax in (ax_eps, ax_cut, ax_layer):
            ax.set_ylim(-2, 102)
            ax.legend(fontsize=6)


def _random_sets(records: dict[str, Any]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    return [(m, r) for m in records["models"] if m["causal"] for r in m["results"]
            if r["probes"] == "random"]


def _draw_gu(ax: Any, records: dict[str, Any], opts: LMOptions) -> None:
    """Each random-token probe's Gu sink rate (dots) and their mean (bar), per decoder and
    condition, against Gu et al.'s range for open LMs (band)."""
    sets = _random_sets(records)
    rng = np.random.default_rng(0)  # jitter only
    for i, (_, r) in enumerate(sets):
        rates = 100 * np.asarray(r["sink_rate"][MAIN_EPS]["per_probe"])
        ax.scatter(i + rng.uniform(-0.15, 0.15, len(rates)), rates, s=8, alpha=0.5,
                   color="tab:blue")
        ax.hlines(rates.mean(), i - 0.3, i + 0.3, color="black")
    ax.axhspan(100 * GU.low, 100 * GU.high, color="tab:orange", alpha=0.2,
               label="Gu et al., open LMs")
    ax.set_xticks(range(len(sets)))
    ax.set_xticklabels([_label(m, r) for m, r in sets], fontsize=7, rotation=15)
    ax.set_ylabel(f"Gu sink rate (%) per probe, eps = {MAIN_EPS}")
    ax.set_ylim(-2, 102)
    ax.legend(fontsize=7)


def _intervened(records: dict[str, Any]) -> list[dict[str, Any]]:
    """The models whose interventions were measured by the loss."""
    return [m for m in records["models"]
            if m.get("interventions") and "baseline" in m["interventions"]]


def _draw_interventions(axes: Any, records: dict[str, Any], opts: LMOptions) -> None:
    """Per causal model: the mean loss change at each position under each global edit and
    StreamingLLM cache; every head's zero-ablation loss change against its first-token mass,
    the sink heads apart; and per layer, the share of a hidden first key's weight that each
    key group gains, beside what a proportional hand-out would give it."""
    axes = np.atleast_2d(axes)
    for row, m in enumerate(_intervened(records)):
        iv = m["interventions"]
        ax_pos, ax_heads, ax_moved = axes[row]
        for g in iv["global"]:
            ax_pos.plot(g["per_position"], label=g["key"].replace("_", " "))
        for s in iv["streaming"]:
            kept = "a random old token" if s["k"] == "random" else f"k = {s['k']}"
            ax_pos.plot(s["per_position"], linestyle="--",
                        label=f"StreamingLLM {kept}, window {iv['window']}")
        for start, _ in settings.BANDS[1:]:
            ax_pos.axvline(start - 0.5, color="grey", linewidth=0.5, linestyle=":")
        ax_pos.axhline(0, color="grey", linewidth=0.5)
        ax_pos.set_xlabel("query position (dotted: the bands' edges)")
        ax_pos.set_ylabel("mean loss change (nats per token)")
        ax_pos.set_title(f"{m['key']}: edits at every layer", fontsize=9)
        ax_pos.legend(fontsize=6)
        every = iv["units"]["every_head"]
        sink = np.asarray(every["sink"])
        first, zero = np.asarray(every["first"]), np.asarray(every["zero"])
        ax_heads.scatter(first[~sink], zero[~sink], s=8, color="tab:blue", alpha=0.6,
                         label="other heads")
        ax_heads.scatter(first[sink], zero[sink], s=14, color="tab:red",
                         label=f"the {int(sink.sum())} sink heads")
        ax_heads.axhspan(-iv["harmless"], iv["harmless"], color="grey", alpha=0.2,
                         label=f"+-{iv['harmless']:g} nats")
        ax_heads.set_yscale("symlog", linthresh=iv["harmless"])
        ax_heads.set_xlabel("first-token mass")
        ax_heads.set_ylabel("loss change, zero ablation (symlog)")
        ax_heads.set_title(f"{m['key']}: every head ablated alone", fontsize=9)
        ax_heads.legend(fontsize=6)
        mv = iv["where_moved"]
        shares = np.asarray(mv["by_layer"])
        expected = np.asarray(mv["by_layer_expected"])
        layers = np.arange(1, len(shares) + 1)
        for g, (label, color) in enumerate(zip(mv["groups"], ("tab:red", "tab:orange",
                                                               "tab:green"))):
            ax_moved.plot(layers, shares[:, g], color=color, marker=".",
                          label=f"to position {label}")
            ax_moved.plot(layers, expected[:, g], color=color, linestyle=":")
        ax_moved.set_xlabel("layer")
        ax_moved.set_ylabel("share of the hidden first key's weight")
        ax_moved.set_title(f"{m['key']}: where the weight goes (dotted: proportional)",
                           fontsize=9)
        ax_moved.legend(fontsize=6)


CONTROL_PANELS = (("zero", "zero ablation"), ("mean", "mean ablation"),
                  ("cap", "first-token mass capped"), ("output_norm", "output norm"))


def _draw_controls(axes: Any, records: dict[str, Any], opts: LMOptions) -> None:
    """Per causal model and statistic: the means of the random control sets of other heads
    (histogram, over every probe), the sink set's mean (red line) and its two-level bootstrap
    bounds (red band)."""
    axes = np.atleast_2d(axes)
    for row, m in enumerate(_intervened(records)):
        iv = m["interventions"]
        units = Units(iv)
        for ax, (name, label) in zip(axes[row], CONTROL_PANELS):
            a = iv["units"][name]
            ax.hist(units.set_means(name), bins=40, color="tab:blue", alpha=0.7,
                    label=f"{len(units.sets)} random sets of {units.size} other heads")
            q = a["sink"]["quantiles"]
            ax.axvspan(q["0.05"], q["0.95"], color="tab:red", alpha=0.2,
                       label="sink heads: bootstrap bounds")
            ax.axvline(a["sink"]["estimate"], color="tab:red", label="sink heads' mean")
            if name in HOWS:
                ax.axvspan(-iv["harmless"], iv["harmless"], color="grey", alpha=0.15,
                           label=f"+-{iv['harmless']:g} nats")
            ax.set_xlabel("mean loss change (nats per token)" if name in HOWS
                          else "mean output norm")
            ax.set_title(f"{m['key']}: {label}", fontsize=9)
            ax.legend(fontsize=6)


FIGURES = (
    FigureSpec("fig_lm_first_token", _draw_heat, grid=_heat_grid, size=(4.2, 3.6),
               title="First-token mass per (layer, head)"),
    FigureSpec("fig_lm_sweeps", _draw_sweeps,
               grid=lambda records, opts: (len(records["models"]), 3), size=(4.4, 3.6)),
    FigureSpec("fig_lm_gu_random", _draw_gu, size=(7.0, 4.0),
               title="Gu sink rate of each random-token probe",
               when=lambda records, opts: bool(_random_sets(records))),
    FigureSpec("fig_lm_interventions", _draw_interventions,
               grid=lambda records, opts: (len(_intervened(records)), 3), size=(5.0, 3.8),
               title="Interventions measured by the next-token loss",
               when=lambda records, opts: bool(_intervened(records))),
    FigureSpec("fig_lm_controls", _draw_controls,
               grid=lambda records, opts: (len(_intervened(records)), len(CONTROL_PANELS)),
               size=(4.2, 3.4), title="The sink heads against random sets of other heads",
               when=lambda records, opts: bool(_intervened(records))),
)

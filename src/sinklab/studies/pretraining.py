"""``sinklab pretrain``: small language models pretrained on real text, one per attention rule.

Each rule trains the same causal LM (``sinklab.pretrain.network``) on the same text at the same
token budget, at its own learning rate, in rounds that ``sinklab pretrain`` reads off the
finished runs (``Study.more_cells``), so an interrupted study resumes where it stopped:

1. **Screening** (``screen/{rule}_lr{lr}/``, seed ``SCREEN_SEED``, a ``SCREEN_SHARE`` of the
   budget): every rate of ``START``; the best rate has the lowest final validation loss. While
   it is the smallest or largest screened, the next rate of ``LADDER`` beyond it is screened
   too, until it is not or the ladder ends (the report says so).
2. **The rule contrast** (``runs/{rule}_seed{s}/``): every rule at its rate found, seeds 0 to
   n - 1 (``seeds``; softmax ``softmax_seeds``, the rules proposed since the paper
   ``new_seeds``, the loss claims' control ``uniform`` ``control_seeds``).
3. **After it** (once every run of the contrast has finished, so that it comes first): Gu et
   al.'s factors on softmax at its rate (``variants/{variant}_seed{s}/``: no fixed first token,
   weight decay 5.0 against the default 0.1, windows of 64 tokens against 256), and the budget
   control, softmax at ``BUDGET_FACTOR`` times the tokens.

Every run logs, every ``log_every`` steps, the validation loss and, per layer and head, the
first token's attention mass, the Gu et al. sink rate at eps = 0.3 (absolute, and with each row
divided by its sum), the first value's norm over the others' and the first token's residual
norm over the others' (``sinklab.pretrain.training.measure``); at its end, ``sinklab lm``'s
interventions through the same code (``sinklab.pretrain.training.intervene``).

The primary claims (``PRIMARY``), each beside its control: softmax models form a first-token
sink (control: relu, sigmoid, softpick), those form none (control: softmax), they train to
softmax's validation loss within ``LOSS_MARGIN`` (control: uniform attention), and evicting the
first token raises softmax models' loss by more than ``HARMLESS`` (control: relu, sigmoid,
softpick). Gu et al.'s factors are secondary claims against the contrast's softmax seeds; the
budget control and the emergence of the sink are described.

``--quick`` is a smoke test of the machinery, not a study of sinks (a first-token sink takes
millions of tokens to form): the ``QUICK`` model and budget, ``QUICK_RULES``, ``QUICK_SEEDS``
seeds of each, one rate (``QUICK_LR``), no screening and no factors; the options the user gives
(sizes, tokens, rules, seeds of each rule) win over it and are checked as without --quick. It
says so at the end of its output and at the top of its report.

    sinklab pretrain --out results/pretrain          # the rule contrast, then the rest
    sinklab pretrain --quick --out /tmp/pretrain     # smoke test, under half a minute
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from sinklab import claims as cl
from sinklab.claims import Claim
from sinklab.config import check_count
from sinklab.definitions import GU_EPS
from sinklab.errors import ConfigError
from sinklab.lm.settings import HARMLESS
from sinklab.pretrain.runconfig import ABLATE_HEADS, CAP_EPS, WINDOW, PretrainConfig
from sinklab.runs import folders
from sinklab.studies.base import Cell, Context, Execution, FigureSpec, Study, named
from sinklab.studies.zoo import next_rate

# The rules of the contrast: the paper's two, the rules proposed against sinks before it, and
# (fewer seeds) those proposed since; uniform attention is the parity claims' control.
RULES = ("softmax", "relu", "sigmoid", "softmax1", "sink_logit", "gated", "softpick")
NEW_RULES = ("gated_dim", "kv_bias", "clipped_softmax")
CONTROL_RULE = "uniform"
NO_SINK_RULES = ("relu", "sigmoid", "softpick")  # the paper's claim: trained without a sink
LADDER = (1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2)
START = (3e-4, 1e-3, 3e-3)
SCREEN_SEED = 1000  # not a seed of the contrast
SCREEN_SHARE = 0.25  # of the budget, for each screened rate
BUDGET_FACTOR = 10
BUDGET_SEEDS = 3
# The model and budget on this machine, and a larger one for a GPU (``--preset gpu``).
PRESETS: dict[str, dict[str, Any]] = {
    "cpu": dict(d_model=128, n_layers=4, n_heads=4, context=256, batch_size=16,
                tokens=2_000_000, log_every=25, eval_windows=32, warmup=50),
    "gpu": dict(d_model=512, n_layers=8, n_heads=8, context=512, batch_size=32,
                tokens=200_000_000, log_every=100, eval_windows=64, warmup=500),
}
QUICK = dict(d_model=32, n_layers=2, n_heads=2, context=64, batch_size=8, tokens=8 * 64 * 24,
             log_every=8, eval_windows=8, warmup=4)
QUICK_RULES = ("softmax", "relu")
QUICK_SEEDS = 2  # of each rule
SIZE_OPTIONS = ("tokens", "d_model", "n_layers", "n_heads", "context")  # over the preset's
QUICK_LR = 3e-3
# Each seed option's default, and with --quick (None: not trained, so not to be given)
SEED_DEFAULTS: dict[str, tuple[int, int | None]] = {
    "seeds": (5, QUICK_SEEDS), "softmax_seeds": (10, QUICK_SEEDS),
    "new_seeds": (3, QUICK_SEEDS), "control_seeds": (5, QUICK_SEEDS),
    "variant_seeds": (5, None), "budget_seeds": (BUDGET_SEEDS, None)}
# Gu et al.'s factors, each a change of softmax's settings at its rate found
# (Gu et al., 2025: fixing a token at position 0 raised their sink rate from 18% to 74%, weight
# decay 5.0 removed the sink, windows of 64-128 tokens prevented it)
VARIANTS: dict[str, dict[str, Any]] = {
    "no_fixed_first": {"fixed_first": False},
    "weight_decay_5": {"weight_decay": 5.0},
    "window_64": {"context": 64},
}
VARIANT_WORDS = {"no_fixed_first": "no fixed first token", "weight_decay_5": "weight decay 5.0",
                 "window_64": "windows of 64 tokens"}
# A model has a first-token sink when the share of (window, layer, head) whose first-key
# importance exceeds Gu et al.'s eps is at least SINK_RATE: a tenth of its heads, where an
# untrained model has none (its importance is about ln(T) / T).
SINK_RATE = 0.1
LOSS_MARGIN = 0.05  # nats per token: "trains as well as softmax" within this of its median
# the interventions' numbers per run (sinklab.pretrain.training.intervention_summary)
EFFECTS = ("eviction_cost", "hide_first_key", "hide_first_key_control", "zero_first_value",
           "zero_first_value_control", "cap_first_mass", "cap_first_mass_control",
           "sink_heads_zero", "other_heads_zero", "streaming_1", "streaming_0")


def _default_rules() -> tuple[str, ...]:
    return (*RULES, *NEW_RULES, CONTROL_RULE)


def _seeds_help(name: str, what: str) -> str:
    full, quick = SEED_DEFAULTS[name]
    with_quick = f"{quick} with --quick" if quick is not None else \
        "none with --quick, which trains no factors"
    return f"{what} (default: {full}; {with_quick})"


@dataclass
class PretrainOptions:
    """What ``sinklab pretrain`` trains; checked on creation. The options left out (None) get
    the preset's or --quick's values here, so that one the user gave can be told from a
    default: a given option wins over --quick's, and is checked the same way."""

    rules: tuple[str, ...] | None = field(default=None, metadata={
        "help": "attention rules, separated by commas (default: the paper's two, the rules "
                "proposed against sinks, and uniform, the loss claims' control; "
                f"{' and '.join(QUICK_RULES)} with --quick)", "metavar": "RULES"})
    seeds: int | None = field(default=None, metadata={
        "help": _seeds_help("seeds", "seeds per rule (softmax: --softmax-seeds; the rules "
                            "proposed since the paper: --new-seeds; uniform: --control-seeds)"),
        "metavar": "N"})
    softmax_seeds: int | None = field(default=None, metadata={
        "help": _seeds_help("softmax_seeds", "softmax's seeds"), "metavar": "N"})
    new_seeds: int | None = field(default=None, metadata={
        "help": _seeds_help("new_seeds", f"seeds of {', '.join(NEW_RULES)}"), "metavar": "N"})
    control_seeds: int | None = field(default=None, metadata={
        "help": _seeds_help("control_seeds", "uniform's seeds (a control is decided from 5 "
                            "on)"), "metavar": "N"})
    variant_seeds: int | None = field(default=None, metadata={
        "help": _seeds_help("variant_seeds", "seeds of each of Gu et al.'s factors (no fixed "
                            "first token, weight decay, 64-token windows)"), "metavar": "N"})
    budget_seeds: int | None = field(default=None, metadata={
        "help": _seeds_help("budget_seeds", f"seeds of the budget control (softmax at "
                            f"{BUDGET_FACTOR}x the tokens); 0 leaves it out"), "metavar": "N"})
    corpus: str = field(default="bbc", metadata={
        "help": "the text: bbc (BBC News, 5 MB), pydoc (Python's help topics), or a text file "
                "or folder of .txt files", "metavar": "CORPUS"})
    preset: str | None = field(default=None, metadata={
        "help": "the model and budget: cpu (0.8M parameters, 2M tokens a run; the default) or "
                "gpu (25M parameters, 200M tokens a run); --quick has its own", "metavar": "NAME"})
    tokens: int | None = field(default=None, metadata={
        "help": "tokens per run of the contrast (default: the preset's, or --quick's)",
        "metavar": "N"})
    d_model: int | None = field(default=None, metadata={
        "help": "the model's width (default: the preset's, or --quick's; 64 to 512 span about "
                "0.2M to 13M parameters at 4 layers)", "metavar": "D"})
    n_layers: int | None = field(default=None, metadata={
        "help": "layers (default: the preset's, or --quick's)", "metavar": "N"})
    n_heads: int | None = field(default=None, metadata={
        "help": "heads per layer (default: the preset's, or --quick's)", "metavar": "N"})
    context: int | None = field(default=None, metadata={
        "help": "tokens per window, the first included (default: the preset's, or --quick's; "
                "Gu et al. saw windows of 64-128 prevent sinks)", "metavar": "T"})
    quick: bool = field(default=False, metadata={
        "help": "a smoke test of the machinery, not a study of sinks: a tiny model, "
                f"{' and '.join(QUICK_RULES)}, {QUICK_SEEDS} seeds of each, one rate, no "
                "screening and no factors; the size, token, rule and seed options given with "
                "it win over these"})

    def __post_init__(self) -> None:
        for name, (full, quick) in SEED_DEFAULTS.items():
            given = getattr(self, name)
            if self.quick and quick is None and given is not None:
                raise ConfigError(f"{named(self, name)}={given!r} is not allowed with "
                                  f"{named(self, 'quick')}, which trains no factors and no "
                                  "budget control: leave out one of them.")
            if given is None:
                setattr(self, name, quick if self.quick else full)
        for name in ("seeds", "softmax_seeds", "new_seeds", "control_seeds"):
            check_count(named(self, name), getattr(self, name))
        if not self.quick:
            check_count(named(self, "variant_seeds"), self.variant_seeds)
            if not (isinstance(self.budget_seeds, int) and self.budget_seeds >= 0):
                raise ConfigError(f"{named(self, 'budget_seeds')}={self.budget_seeds!r} is not "
                                  "allowed: it must be an integer >= 0.")
        if self.quick and self.preset is not None:
            raise ConfigError(f"{named(self, 'preset')} {self.preset!r} is not allowed with "
                              f"{named(self, 'quick')}, whose model and budget are its own: "
                              "leave out one of them (the size and --tokens options change "
                              "either).")
        if not self.quick:
            self.preset = "cpu" if self.preset is None else self.preset
            if self.preset not in PRESETS:
                raise ConfigError(f"{named(self, 'preset')} {self.preset!r} is not allowed: "
                                  f"choose one of {', '.join(PRESETS)}.")
        if self.rules is None:
            self.rules = QUICK_RULES if self.quick else _default_rules()
        self.rules = tuple(self.rules)
        from sinklab.attention import RULES as KNOWN  # torch: not for the help texts

        if not self.rules:
            raise ConfigError(f"{named(self, 'rules')} needs at least one rule name.")
        for rule in self.rules:
            if rule not in KNOWN:
                raise ConfigError(f"{named(self, 'rules')}: {rule!r} is not a known attention "
                                  f"rule: choose from {', '.join(sorted(KNOWN))}.")
            if self.rules.count(rule) > 1:
                raise ConfigError(f"{named(self, 'rules')} lists {rule!r} twice; give each "
                                  "rule once.")
        for name in SIZE_OPTIONS:
            if getattr(self, name) is not None:
                check_count(named(self, name), getattr(self, name))
        # every setting checked before a folder is written: a bad corpus path, a budget
        # shorter than one batch, heads that do not split the width, a rule that cannot run
        # with narrow heads; a size is named as the option that set it
        for rule in self.rules:
            try:
                cfg = base_config(self, rule, 1e-3, 0, "cpu")
            except ConfigError as exc:
                text = str(exc)
                for name in SIZE_OPTIONS:
                    for section in ("model", "train"):
                        text = text.replace(f"{section}.{name}=", f"{named(self, name)}=")
                raise ConfigError(text) from None
        # and the text: read once, split, each side long enough for a window
        from sinklab.pretrain import data  # torch: not for the help texts

        split = data.split(cfg.data.corpus, cfg.data.validation)
        for stream, side in ((split.train, "training"), (split.validation, "validation")):
            if stream.numel() < cfg.model.context:
                raise ConfigError(f"{named(self, 'corpus')} {self.corpus!r} gives "
                                  f"{stream.numel()} {side} tokens, fewer than one window of "
                                  f"{cfg.model.context}: give more text or a shorter "
                                  f"{named(self, 'context')}.")

    def n_seeds(self, rule: str) -> int:
        if rule == "softmax":
            return self.softmax_seeds
        if rule in NEW_RULES:
            return self.new_seeds
        if rule == CONTROL_RULE:
            return self.control_seeds
        return self.seeds

    def closing_lines(self) -> list[str]:
        """What ``sinklab pretrain`` prints last (``sinklab.cli``): with --quick, that it was a
        smoke test of the machinery."""
        if not self.quick:
            return []
        tokens = sizes(self)["tokens"]
        return [f"pretrain: {named(self, 'quick')} is a smoke test of the machinery, not a study "
                f"of sinks: one learning rate, no screening and no factors, {tokens:,} tokens a "
                "run (a first-token sink takes millions to form); run it without --quick for "
                "the study."]


def sizes(opts: PretrainOptions) -> dict[str, Any]:
    """The model and budget of the runs: the preset's (or --quick's), with the size and token
    options the user gave over them."""
    out = dict(QUICK if opts.quick else PRESETS[str(opts.preset)])
    out.update({key: getattr(opts, key) for key in SIZE_OPTIONS if getattr(opts, key) is not None})
    return out


def base_config(opts: PretrainOptions, rule: str, lr: float, seed: int, device: str,
                **changes: Any) -> PretrainConfig:
    """One run's settings: ``sizes``, the rule, rate and seed."""
    return PretrainConfig.make(**{**sizes(opts), "corpus": opts.corpus, "attention": rule,
                                  "lr": lr, "seed": seed, "device": device, **changes})


def run_name(stage: str, rule: str, seed: int | None = None, lr: float | None = None) -> str:
    parts = [rule] + ([f"lr{lr:g}"] if lr is not None else []) + \
        ([f"seed{seed}"] if seed is not None else [])
    return f"{stage}/{'_'.join(parts)}"


def _screen_cell(opts: PretrainOptions, exe: Execution, rule: str, lr: float) -> Cell:
    cfg = base_config(opts, rule, lr, SCREEN_SEED, exe.device)
    short = max(cfg.train.batch_size * cfg.model.context,
                int(cfg.train.tokens * SCREEN_SHARE))
    return Cell(run_name("screen", rule, lr=lr), cfg.replace(tokens=short),
                group=("screen", rule, lr), label=f"screen {rule} lr {lr:g}")


def cells(opts: PretrainOptions, exe: Execution) -> list[Cell]:
    """The first round: every rule's starting rates (quick: its runs at the one rate)."""
    if opts.quick:
        return [_run_cell(opts, exe, rule, QUICK_LR, seed) for rule in opts.rules
                for seed in range(opts.n_seeds(rule))]
    return [_screen_cell(opts, exe, rule, lr) for rule in opts.rules for lr in START]


def _run_cell(opts: PretrainOptions, exe: Execution, rule: str, lr: float, seed: int) -> Cell:
    return Cell(run_name("runs", rule, seed), base_config(opts, rule, lr, seed, exe.device),
                group=("runs", rule, seed), label=rule)


@dataclass
class Search:
    tried: dict[float, float | None]  # rate -> final validation loss (None: not finished)
    best: float | None
    at_ladder_end: bool


def _finished(ctx: Context, name: str) -> dict[str, Any] | None:
    return ctx.summary(name) if folders.check_complete(ctx.out / name) else None


def search(ctx: Context, rule: str) -> Search:
    """Replay ``rule``'s rate search from its finished screening runs."""
    tried: dict[float, float | None] = {}
    queue = list(START)
    while queue:
        lr = queue.pop(0)
        summary = _finished(ctx, run_name("screen", rule, lr=lr))
        if summary is None:
            tried[lr] = None
            return Search(tried, None, False)
        tried[lr] = _loss(summary)
        if queue:
            continue
        more = next_rate(list(tried), _best(tried), LADDER)
        if more is not None:
            queue.append(more)
    best = _best(tried)
    edge = best in (min(tried), max(tried)) and len(tried) > 1
    return Search(tried, best, edge and next_rate(list(tried), best, LADDER) is None)


def _loss(summary: dict[str, Any]) -> float:
    """A screened rate's final validation loss; a run that diverged counts as infinite."""
    value = summary["final"]["val_loss"]
    if summary.get("status") == "diverged" or value is None or not math.isfinite(value):
        return math.inf
    return value


def _best(tried: dict[float, float | None]) -> float:
    return min(tried, key=lambda lr: (tried[lr] if tried[lr] is not None else math.inf, lr))


def more_cells(ctx: Context) -> list[Cell]:
    """The rounds after the first: the screened rates past the start, each rule's runs at its
    rate found, then (once every run of the contrast is finished) Gu et al.'s factors and the
    budget control on softmax at its rate."""
    opts, exe = ctx.opts, ctx.exe
    if opts.quick:
        return []
    out: list[Cell] = []
    rates: dict[str, float] = {}
    for rule in opts.rules:
        found = search(ctx, rule)
        out += [_screen_cell(opts, exe, rule, lr) for lr in found.tried if lr not in START]
        if found.best is None:
            continue
        rates[rule] = found.best
        out += [_run_cell(opts, exe, rule, found.best, s) for s in range(opts.n_seeds(rule))]
    contrast = [c for c in out if c.name.startswith("runs/")]
    done = len(rates) == len(opts.rules) and all(
        folders.check_complete(ctx.out / c.name) for c in contrast)
    if done and "softmax" in rates:
        out += variant_cells(opts, exe, rates["softmax"])
    return out


def variant_cells(opts: PretrainOptions, exe: Execution, lr: float) -> list[Cell]:
    out = []
    for variant, changes in VARIANTS.items():
        out += [Cell(f"variants/{variant}_seed{s}",
                     base_config(opts, "softmax", lr, s, exe.device, **changes),
                     group=("variants", variant, s), label=f"softmax {VARIANT_WORDS[variant]}")
                for s in range(opts.variant_seeds)]
    tokens = sizes(opts)["tokens"] * BUDGET_FACTOR
    out += [Cell(f"variants/budget_x{BUDGET_FACTOR}_seed{s}",
                 base_config(opts, "softmax", lr, s, exe.device, tokens=tokens),
                 group=("budget", s), label=f"softmax at {BUDGET_FACTOR}x the tokens")
            for s in range(opts.budget_seeds)]
    return out


# ------------------------------------------------------------------------------ records


def _curve(ctx: Context, name: str) -> list[dict[str, Any]]:
    text = (ctx.out / name / "curve.jsonl").read_text()
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def _mean(values: Any) -> float:
    return float(np.mean(np.asarray(values, dtype=float)))


def point_summary(point: dict[str, Any]) -> dict[str, Any]:
    """One logged point's model-level numbers: means over layers and heads."""
    return {"step": point["step"], "tokens": point["tokens"], "val_loss": point["val_loss"],
            "sink_rate": _mean(point["sink_rate"]),
            "sink_rate_relative": _mean(point["sink_rate_relative"]),
            "first_mass": _mean(point["first_mass"]),
            "value_ratio": _mean(point["value_ratio"]),
            "resid_ratio_max": float(np.max(point["resid_ratio"]))}


def emergence(curve: list[dict[str, Any]]) -> int | None:
    """The first logged token count at which the sink rate reaches ``SINK_RATE`` and stays
    there to the end, or None."""
    above = [p["sink_rate"] >= SINK_RATE for p in curve]
    for i in range(len(above)):
        if all(above[i:]):
            return curve[i]["tokens"]
    return None


FINAL_KEYS = ("val_loss", "sink_rate", "sink_rate_relative", "first_mass", "value_ratio",
              "resid_ratio_max")


def run_record(ctx: Context, name: str, group: str, rule: str) -> dict[str, Any]:
    """One run's numbers at the end of training and its curve; a run that diverged has its
    curve up to its last measurement and no final numbers (None), so that it is counted apart
    and not in any median."""
    summary = ctx.summary(name)
    curve = [point_summary(p) for p in _curve(ctx, name)]
    diverged = summary.get("status") == "diverged"
    final = {k: None if diverged else curve[-1][k] for k in FINAL_KEYS}
    return {"name": name, "group": group, "rule": rule, "seed": summary["seed"],
            "lr": summary["config"]["train"]["lr"], "tokens": summary["tokens"],
            "parameters": summary["parameters"], "tokens_per_s": summary["tokens_per_s"],
            "wall_time_s": summary["wall_time_s"], **final, "diverged": diverged,
            "diverged_step": summary.get("diverged_step"),
            "emergence_tokens": None if diverged else emergence(curve), "curve": curve,
            "heads_final": {k: summary["final"][k] for k in
                            ("first_mass", "sink_rate", "sink_rate_relative", "value_ratio")},
            "data": summary["data"], "effects": summary.get("interventions"),
            "probe_windows": summary["config"]["data"]["probe_windows"]}


def collect(ctx: Context) -> dict[str, Any]:
    opts = ctx.opts
    runs, screens = [], []
    for rule in opts.rules:
        if opts.quick:
            lr, found = QUICK_LR, None
        else:
            found = search(ctx, rule)
            lr = found.best
            screens.append({"rule": rule, "lr": lr, "at_ladder_end": found.at_ladder_end,
                            "rates": [{"lr": r, "val_loss": v}
                                      for r, v in sorted(found.tried.items())]})
        runs += [run_record(ctx, run_name("runs", rule, s), "contrast", rule)
                 for s in range(opts.n_seeds(rule))]
    variants = []
    if not opts.quick and any((ctx.out / "variants").glob("*")):
        for variant in [*VARIANTS, f"budget_x{BUDGET_FACTOR}"]:
            seeds = opts.budget_seeds if variant.startswith("budget") else opts.variant_seeds
            for s in range(seeds):
                name = f"variants/{variant}_seed{s}"
                if folders.check_complete(ctx.out / name):
                    variants.append({**run_record(ctx, name, variant, "softmax"),
                                     "variant": variant})
    first = runs[0]
    protocol = {**sizes(opts), "quick_lr": QUICK_LR if opts.quick else None,
                "tokens": first["tokens"], "parameters": first["parameters"],
                "corpus": opts.corpus, "data": first["data"], "gu_eps": GU_EPS,
                "sink_rate": SINK_RATE, "loss_margin": LOSS_MARGIN, "ladder": list(LADDER),
                "start": list(START), "screen_share": SCREEN_SHARE, "screen_seed": SCREEN_SEED,
                "budget_factor": BUDGET_FACTOR, "variants": VARIANT_WORDS,
                "harmless": HARMLESS, "cap_eps": CAP_EPS, "window": WINDOW,
                "ablate_heads": len((first["effects"] or {}).get("sink_heads", [])) or ABLATE_HEADS,
                "probe_windows": first["probe_windows"]}
    return {"protocol": protocol, "runs": runs, "screen": screens, "variants": variants,
            "rules": _rule_rows(runs)}


def _rule_rows(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    rows = []
    for rule in dict.fromkeys(r["rule"] for r in runs):
        sel = [r for r in runs if r["rule"] == rule]

        def each(key: str, sel: list[dict[str, Any]] = sel) -> list[Any]:
            return [r[key] for r in sel]

        losses = [v for v in each("val_loss") if v is not None]
        lo, hi = cl.median_bounds(losses) if losses else (-math.inf, math.inf)
        emerged = [t for t in each("emergence_tokens") if t is not None]
        rows.append({"rule": rule, "n": len(sel), "lr": sel[0]["lr"],
                     "diverged": sum(each("diverged")),
                     "val_loss_median": float(np.median(losses)) if losses else None,
                     "val_loss_bounds": [lo, hi] if math.isfinite(lo) else None,
                     "val_loss": losses, "sink_rate": each("sink_rate"),
                     "sink_rate_relative": each("sink_rate_relative"),
                     "first_mass": each("first_mass"), "value_ratio": each("value_ratio"),
                     "resid_ratio_max": each("resid_ratio_max"),
                     "emerged": len(emerged), "emergence_tokens": each("emergence_tokens"),
                     **{key: [(r["effects"] or {}).get(key) for r in sel] for key in EFFECTS},
                     "tokens_per_s": float(np.mean(each("tokens_per_s")))})
    return rows


def rows_of(records: dict[str, Any], rule: str) -> list[dict[str, Any]]:
    return [r for r in records["runs"] if r["rule"] == rule]


# ------------------------------------------------------------------------------- claims

PRIMARY = ("softmax.sink_emerges", "no_sink.rules", "parity.rules", "eviction.softmax_hurts")


def _values(records: dict[str, Any], rule: str, key: str) -> list[float]:
    """The rule's runs' values of ``key``; a run without one (diverged) is left out."""
    return [r[key] for r in rows_of(records, rule) if r[key] is not None]


def _effects(records: dict[str, Any], rule: str, key: str) -> list[float]:
    return [v for v in (((r.get("effects") or {}).get(key)) for r in rows_of(records, rule))
            if v is not None]


def _sink_claim(key: str, sentence: str, values: list[float], above: bool) -> Claim:
    what = (f"per seed, the share of (window, layer, head) whose first-key importance (the "
            f"mean weight on key 0 over the queries that see it) exceeds eps = {GU_EPS:g} at "
            "the end of training")
    if above:
        return cl.median_at_least(key, sentence, values, SINK_RATE, what=what)
    return cl.median_at_most(key, sentence, values, SINK_RATE, what=what)


def claims(records: dict[str, Any], opts: PretrainOptions) -> list[Claim]:
    """The three primary claims (each with a control, and without data, undetermined, where
    --rules leaves their rules out) and a description per rule."""
    rules = [r["rule"] for r in records["rules"]]
    softmax = _values(records, "softmax", "sink_rate")
    no_sink = [r for r in NO_SINK_RULES if r in rules]
    pooled = [v for r in no_sink for v in _values(records, r, "sink_rate")]
    words = ", ".join(no_sink) or "relu, sigmoid, softpick (none trained)"
    claim = _sink_claim("softmax.sink_emerges", "Softmax models form a first-token sink at "
                        "this scale", softmax, above=True)
    control = _sink_claim("softmax.sink_emerges.control", "The same test on the models "
                          f"without normalisation ({words})", pooled, above=True)
    out = [cl.with_control(claim, control, words)]
    parts = [(r, _values(records, r, "sink_rate")) for r in no_sink]
    claim = cl.median_at_most("no_sink.rules", f"Models with {words} attention form no "
                              "first-token sink at this scale", pooled if not parts else None,
                              SINK_RATE, parts=parts or None,
                              what="per seed, the sink rate at the end of training")
    control = _sink_claim("no_sink.rules.control", "The same test on softmax", softmax,
                          above=False)
    out.append(cl.with_control(claim, control, "softmax"))
    losses = _values(records, "softmax", "val_loss")
    reference = float(np.median(losses)) if losses else 0.0
    what = (f"per seed, the final validation loss (nats per token) against softmax's median "
            f"{reference:.4f}, within {LOSS_MARGIN:g}" if losses else "softmax was not trained")
    parts = [(r, _values(records, r, "val_loss")) for r in no_sink]
    claim = cl.median_within("parity.rules", f"Models with {words} attention train to "
                             f"softmax's validation loss within {LOSS_MARGIN:g} nats per token",
                             [] if not (parts and losses) else None, reference, LOSS_MARGIN,
                             parts=parts if parts and losses else None, what=what)
    uniform = _values(records, CONTROL_RULE, "val_loss") if losses else []
    control = cl.median_within("parity.rules.control", "The same test on uniform attention "
                               "(fixed weights, no content attention)", uniform, reference,
                               LOSS_MARGIN, what=what)
    out.append(cl.with_control(claim, control, CONTROL_RULE))
    what = (f"per seed, the mean next-token loss change (nats per token) over the probes when "
            f"StreamingLLM's cache of the {WINDOW} most recent tokens keeps no first token, "
            "against keeping it, at the positions where the cache has dropped keys")
    claim = cl.median_at_least("eviction.softmax_hurts", "Evicting the first token raises "
                               f"softmax models' loss by more than {HARMLESS:g} nats per token",
                               _effects(records, "softmax", "eviction_cost"), HARMLESS,
                               what=what)
    control = cl.median_at_least("eviction.softmax_hurts.control", f"The same test on {words}",
                                 [v for r in no_sink for v in _effects(records, r,
                                                                      "eviction_cost")],
                                 HARMLESS, what=what)
    out.append(cl.with_control(claim, control, words))
    out += factor_claims(records, softmax)
    for rule in rules:
        values = _values(records, rule, "sink_rate")
        if not values:
            continue  # every seed diverged: the per-rule table says so
        times = [r["emergence_tokens"] for r in rows_of(records, rule) if not r["diverged"]]
        out.append(cl.descriptive(
            f"{rule}.sink", f"{rule}: first-token sink rate at the end, and when it emerged",
            f"median sink rate {np.median(values):.3g} over {len(values)} seeds (range "
            f"{min(values):.3g} to {max(values):.3g}); {emergence_text(times)}",
            n=len(values), estimate=float(np.median(values))))
    return out


def emergence_text(times: list[int | None]) -> str:
    """When a sink emerged over seeds, a seed without one counting as later than the budget
    (censored): how many, the median and its one-sided 95% order-statistic bounds where the
    seeds allow them."""
    n = len(times)
    emerged = sum(t is not None for t in times)
    text = f"a sink (rate >= {SINK_RATE:g} to the end) emerged in {emerged} of {n} seeds"
    if not emerged:
        return text
    ordered = sorted(math.inf if t is None else float(t) for t in times)
    median = float(np.median(ordered)) if math.isfinite(ordered[(n - 1) // 2]) and \
        math.isfinite(ordered[n // 2]) else math.inf
    text += (f", at a median of {median:,.0f} tokens" if math.isfinite(median)
             else ", fewer than half of them within the budget")
    j = cl.order_rank(n)
    if j is not None:
        low, high = ordered[j - 1], ordered[n - j]
        high_text = f"{high:,.0f} tokens" if math.isfinite(high) else "past the budget"
        low_text = f"{low:,.0f} tokens" if math.isfinite(low) else "past the budget"
        text += f" (one-sided 95% bounds of the median: {low_text} to {high_text})"
    return text


def factor_claims(records: dict[str, Any], softmax: list[float]) -> list[Claim]:
    """Gu et al.'s factors, each against the contrast's softmax seeds as its control (the same
    test, the factor reversed): weight decay 5.0 and windows of 64 tokens leave no sink (their
    finding), and without a fixed first token the sink rate is at most half of softmax's median
    (theirs fell from 74% to 18%). Without the factors' runs, nothing."""
    by = {v: [r["sink_rate"] for r in records["variants"]
              if r["variant"] == v and r["sink_rate"] is not None] for v in VARIANTS}
    out: list[Claim] = []
    if not softmax or not any(by.values()):
        return out
    for variant in ("weight_decay_5", "window_64"):
        if by[variant]:
            words = VARIANT_WORDS[variant]
            claim = _sink_claim(f"factor.{variant}.no_sink", f"With {words}, softmax models "
                                "form no first-token sink (Gu et al.)", by[variant], above=False)
            control = _sink_claim(f"factor.{variant}.no_sink.control", "The same test on the "
                                  "contrast's softmax seeds", softmax, above=False)
            out.append(cl.with_control(claim, control, "the contrast's softmax seeds"))
    if by["no_fixed_first"]:
        half = 0.5 * float(np.median(softmax))
        what = (f"per seed, the sink rate at the end of training, against half of the contrast's "
                f"softmax median ({half:.3g})")
        claim = cl.median_at_most("factor.no_fixed_first.lower", "Without a fixed first token, "
                                  "softmax models' sink rate is at most half of softmax's with "
                                  "one (Gu et al.)", by["no_fixed_first"], half, what=what)
        control = cl.median_at_most("factor.no_fixed_first.lower.control", "The same test on "
                                    "the contrast's softmax seeds", softmax, half, what=what)
        out.append(cl.with_control(claim, control, "the contrast's softmax seeds"))
    budget = [r for r in records["variants"]
              if r["variant"] == f"budget_x{BUDGET_FACTOR}" and not r["diverged"]]
    if budget:
        rates = [r["sink_rate"] for r in budget]
        sinks = sum(v >= SINK_RATE for v in rates)
        out.append(cl.descriptive(
            "budget.softmax", f"The budget control: softmax at {BUDGET_FACTOR}x the tokens "
            f"({budget[0]['tokens']:,} a run)",
            f"a sink (rate >= {SINK_RATE:g}) in {sinks} of {len(rates)} seeds; median sink rate "
            f"{np.median(rates):.3g} (range {min(rates):.3g} to {max(rates):.3g}), against "
            f"{np.median(softmax):.3g} at the contrast's budget; validation loss median "
            f"{np.median([r['val_loss'] for r in budget]):.4f}; "
            f"{emergence_text([r['emergence_tokens'] for r in budget])}", n=len(rates),
            estimate=float(np.median(rates))))
    return out


# ------------------------------------------------------------------------------ figures


PANELS = (("sink_rate", "sink rate (eps 0.3)"), ("first_mass", "first-token mass"),
          ("val_loss", "validation loss (nats/token)"))


def _draw_groups(axes: Any, groups: list[tuple[str, list[list[dict[str, Any]]]]],
                 log_tokens: bool = False) -> None:
    """Per group (a label and its seeds' curves), the median over seeds of each panel's number
    against tokens, with the band from the lowest to the highest seed."""
    import matplotlib.pyplot as plt  # matplotlib: only where figures are drawn

    colours = plt.get_cmap("tab20")
    for ax, (key, label) in zip(np.ravel(axes), PANELS):
        for i, (name, curves) in enumerate(groups):
            if not curves:
                continue
            n = min(len(c) for c in curves)
            xs = [p["tokens"] for p in curves[0][:n]]
            ys = np.array([[p[key] for p in c[:n]] for c in curves], dtype=float)
            colour = colours(i % 20)
            ax.plot(xs, np.median(ys, 0), color=colour, lw=1.2, label=name)
            ax.fill_between(xs, ys.min(0), ys.max(0), color=colour, alpha=0.15, lw=0)
        if key == "sink_rate":
            ax.axhline(SINK_RATE, color="grey", ls="--", lw=0.8)
        if log_tokens:
            ax.set_xscale("log")
        ax.set_xlabel("training tokens")
        ax.set_ylabel(label)
        ax.legend(fontsize=6, ncol=2)


def _draw_curves(axes: Any, records: dict[str, Any], opts: PretrainOptions) -> None:
    """The contrast: one group per rule, its seeds that did not diverge."""
    _draw_groups(axes, [(rule, [r["curve"] for r in rows_of(records, rule) if not r["diverged"]])
                        for rule in (r["rule"] for r in records["rules"])])


def _draw_variants(axes: Any, records: dict[str, Any], opts: PretrainOptions) -> None:
    """Softmax in the contrast and in each of Gu et al.'s settings and the budget control,
    tokens on a log scale (the budget control runs ten times as long)."""
    groups = [("contrast", [r["curve"] for r in rows_of(records, "softmax")
                            if not r["diverged"]])]
    for variant in dict.fromkeys(r["variant"] for r in records["variants"]):
        words = VARIANT_WORDS.get(variant, f"{BUDGET_FACTOR}x the tokens")
        groups.append((words, [r["curve"] for r in records["variants"]
                                 if r["variant"] == variant and not r["diverged"]]))
    _draw_groups(axes, groups, log_tokens=True)


FIGURES = (FigureSpec("fig_pretrain_curves", _draw_curves, grid=(1, 3), size=(5.0, 4.0)),
           FigureSpec("fig_pretrain_variants", _draw_variants, grid=(1, 3), size=(5.0, 4.0),
                      when=lambda records, opts: bool(records["variants"])))

STUDY = Study(
    name="pretrain",
    title="Pretraining: sinks born on language, one small LM per attention rule",
    help="small language models pretrained on real text, one per attention rule: when a "
         "first-token sink emerges, and what it costs to train without one",
    description="Pretrain the same small causal LM on the BBC News text (or --corpus) with "
                "every attention rule at identical token budgets, each at its own learning "
                "rate found on a short screen; log the validation loss and the first-token sink "
                "metrics as training goes, and decide whether softmax models form a sink, "
                "whether the rules without normalisation do not, and whether they train as "
                "well; then Gu et al.'s factors and a budget control. Writes runs, figures, "
                "records.json, claims.csv, rules.csv and PRETRAIN.md. Rerunning with the same "
                "--out resumes.",
    options=PretrainOptions, template="pretraining.md.j2", collect=collect, cells=cells,
    claims=claims, figures=FIGURES, tables=("rules",), bulk=(), report="PRETRAIN.md",
    docs_example="docs/language.md", default_out="results/pretrain", primary=PRIMARY,
    more_cells=more_cells, more_folders=("runs", "variants"))

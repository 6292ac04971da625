"""``sinklab pretrain``: small language models pretrained on real text, one per attention rule.

Each rule trains the same causal LM (``sinklab.pretrain.network``) on the same text at the same
token budget, at its own learning rate, in rounds that ``sinklab pretrain`` reads off the
finished runs (``Study.more_cells``), so an interrupted study resumes where it stopped:

0. **The pilot** (``pilot/{protocol}_seed{s}/``, ``PILOT`` on ``PILOT_SEEDS``): softmax under
   each protocol, from which ``sinklab.studies.pretrain_pilot.choose`` picks the one the rounds
   below train at (its settings and budget over the preset's); none chosen, none trained.
1. **Screening** (``screen/{rule}_lr{lr}/``, seed ``SCREEN_SEED``, the chosen protocol's whole
   budget; without a pilot, a ``SCREEN_SHARE`` of the preset's): every rate of ``START``; the
   best rate has the lowest final validation loss. While it is the smallest or largest
   screened, the next rate of ``LADDER`` beyond it is screened too, until it is not or the
   ladder ends (the report says so).
2. **The rule contrast** (``runs/{rule}_seed{s}/``): every rule at its rate found, seeds 0 to
   n - 1 (``seeds``; softmax ``softmax_seeds``, the rules proposed since the paper
   ``new_seeds``, ``uniform``, checked beside the loss contrast, ``control_seeds``).
3. **After it** (once every run of the contrast has finished, so that it comes first): Gu et
   al.'s factors on softmax at its rate (``variants/{variant}_seed{s}/``: no fixed first token,
   weight decay 5.0 against the default 0.1, windows of 64 tokens against 256), and the budget
   control, softmax at ``BUDGET_FACTOR`` times the tokens.

Every run logs, every ``log_every`` steps, the validation loss and, per layer and head, the
first token's attention mass, the Gu et al. sink rate at eps = 0.3 (absolute, and with each row
divided by its sum), the first value's norm over the others' and the first token's residual
norm over the others' (``sinklab.pretrain.training.measure``); at its end, ``sinklab lm``'s
interventions through the same code (``sinklab.pretrain.training.intervene``).

The primary claims (``PRIMARY``) are three contrasts of softmax's seeds with those of the
rules without normalisation (relu, sigmoid, softpick, pooled), each decided by one two-sample
test with the checks beside it that could make it come out for another reason: softmax models
end with a higher first-token sink rate; the others train to within ``LOSS_MARGIN`` of
softmax's validation loss (beside it: uniform attention, which cannot attend by content, must
not); evicting the first token costs softmax models more; and a rate claim, that softmax models
form a sink head beyond layer 0 (its control: the same count on the pooled rules). The sink and
eviction contrasts need softmax to form a sink at all in this protocol, checked beside them.
Gu et al.'s factors are secondary contrasts with the contrast's softmax seeds; the budget
control and the emergence of the sink are described.

``--quick`` is a smoke test of the machinery, not a study of sinks (a first-token sink takes
millions of tokens to form): the ``QUICK`` model and budget, ``QUICK_RULES``, ``QUICK_SEEDS``
seeds of each, one rate (``QUICK_LR``), no screening and no factors; the options the user gives
(sizes, tokens, rules, seeds of each rule) win over it and are checked as without --quick. It
says so at the end of its output and at the top of its report.

    sinklab pretrain --out results/pretrain          # the rule contrast, then the rest
    sinklab pretrain --quick --out /tmp/pretrain     # smoke test, under half a minute

This module is the study's declaration (its options, the runs of each round and ``STUDY``),
light enough for the help texts; the rate search, what is read from the runs, the claims (with
``SINK_RATE``, ``LOSS_MARGIN``) and the figures are in ``sinklab.studies.pretrain_analysis``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sinklab import heavy
from sinklab.config import check_count
from sinklab.definitions import HEAD_SINK_RATE, MODEL_SINK_RATE
from sinklab.errors import ConfigError
from sinklab.pretrain.runconfig import PretrainConfig
from sinklab.studies.options import named
from sinklab.studies.study import Cell, Execution, Study

# The rules of the contrast: the paper's two, the rules proposed against sinks before it, and
# (fewer seeds) those proposed since; uniform attention, which cannot attend by content, is
# checked beside the loss contrast (the test must be able to tell it from softmax).
RULES = ("softmax", "relu", "sigmoid", "softmax1", "sink_logit", "gated", "softpick")
NEW_RULES = ("gated_dim", "kv_bias", "clipped_softmax")
CONTROL_RULE = "uniform"
LADDER = (1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2)
START = (3e-4, 1e-3, 3e-3)
SCREEN_SEED = 1000  # not a seed of the contrast
SCREEN_SHARE = 0.25  # of the budget, for each screened rate
BUDGET_FACTOR = 2  # the budget control: softmax at twice the contrast's tokens
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
# Gu et al.'s factors, each a change of softmax's settings at its protocol and rate found
# (``lr_factor`` scales that rate), with the direction their sink rates say it moves softmax's
# against the contrast's (sinklab.studies.reference.FIELD: fixing a token at position 0 raised
# their rate from 18% to 74%; weight decay 0 / 0.1 / 0.5 / 5.0 gave 15.20 / 18.18 / 41.08 /
# 0.01%; rates 1e-4 / 4e-4 / 8e-4 gave 2.90 / 18.18 / 32.23%; windows of 64-128 prevented it)
VARIANTS: dict[str, dict[str, Any]] = {
    "no_fixed_first": {"fixed_first": False},
    "weight_decay_0": {"weight_decay": 0.0},
    "weight_decay_0.5": {"weight_decay": 0.5},
    "weight_decay_5": {"weight_decay": 5.0},
    "lr_third": {"lr_factor": 1 / 3},
    "window_64": {"context": 64},
}
VARIANT_WORDS = {"no_fixed_first": "no fixed first token", "weight_decay_0": "weight decay 0",
                 "weight_decay_0.5": "weight decay 0.5", "weight_decay_5": "weight decay 5.0",
                 "lr_third": "a third of the rate", "window_64": "windows of 64 tokens"}
VARIANT_DIRECTION = {"no_fixed_first": "lower", "weight_decay_0": "lower",
                     "weight_decay_0.5": "higher", "weight_decay_5": "lower",
                     "lr_third": "lower", "window_64": "lower"}
# The pilot (declared before it ran; issue 48): softmax on screening seeds, never seeds of the
# contrast or of a rate screen, under protocols the literature says move sinks. Each protocol
# changes ``PILOT_BASE`` (over the preset); a constant rate read at its logged points gives the
# budget at which a sink appears without training each budget apart. The criterion
# (``sinklab.studies.pretrain_pilot.choose``): the cheapest protocol (its training
# FLOPs up to that point) at which every pilot seed has a sink (rate >= 0.1, held to the end of
# the pilot run), preferring one where every seed has a sink head beyond layer 0 (a head whose
# sink rate is at least PILOT_HEAD_RATE, held likewise); the schedules' arms and float32 are
# compared at their own budget with the base protocol read there.
PILOT_SEEDS = (2000, 2001, 2002)
PILOT_BASE: dict[str, Any] = dict(schedule="constant", lr=1e-2, weight_decay=0.1,
                                  precision="bfloat16", tokens=8_000_000)
PILOT: dict[str, dict[str, Any]] = {
    "base": {},
    "lr_3e-3": {"lr": 3e-3, "tokens": 6_000_000},
    "wd_0.5": {"weight_decay": 0.5, "tokens": 6_000_000},
    "context_512": {"context": 512, "batch_size": 8, "tokens": 6_000_000},
    "cosine": {"schedule": "cosine", "tokens": 4_000_000},
    "wsd": {"schedule": "wsd", "tokens": 4_000_000},
    "6x192": {"d_model": 192, "n_layers": 6, "n_heads": 6, "lr": 5e-3, "tokens": 4_000_000},
    "float32": {"precision": "float32", "tokens": 2_000_000},
    # the second stage, trained only when the first chose no protocol (declared after the
    # first stage's base, context_512, 6x192 and one lr_3e-3 seed had finished, before the
    # rest): longer budgets on text that does not repeat (--corpus english, 41.6M training
    # tokens, so 12M tokens are 0.3 epochs), the two protocols that sank in 2 of 3 seeds, more
    # and narrower heads, and a higher rate (Gu et al.: more sinks)
    "en_base_12M": {"corpus": "english", "tokens": 12_000_000},
    "en_context_512_12M": {"corpus": "english", "context": 512, "batch_size": 8,
                           "tokens": 12_000_000},
    "en_heads_8_12M": {"corpus": "english", "n_heads": 8, "tokens": 12_000_000},
    "en_lr_2e-2_12M": {"corpus": "english", "lr": 2e-2, "tokens": 12_000_000},
}
PILOT_STAGE = {name: 2 if name.startswith("en_") else 1 for name in PILOT}
PILOT_WORDS = {
    "base": "constant rate 0.01, weight decay 0.1, bfloat16",
    "lr_3e-3": "constant rate 0.003", "wd_0.5": "weight decay 0.5",
    "context_512": "windows of 512 tokens (batch 8)",
    "cosine": "cosine decay over 4M tokens", "wsd": "warm-up-stable-decay over 4M tokens",
    "6x192": "6 layers of width 192, 6 heads, rate 0.005",
    "float32": "float32 (the precision check)",
    "en_base_12M": "the base, 12M tokens of the English corpus",
    "en_context_512_12M": "windows of 512, 12M tokens of the English corpus",
    "en_heads_8_12M": "8 heads of width 16, 12M tokens of the English corpus",
    "en_lr_2e-2_12M": "constant rate 0.02, 12M tokens of the English corpus"}
# A model has a first-token sink at SINK_RATE, a head at PILOT_HEAD_RATE (sinklab.definitions)
SINK_RATE = MODEL_SINK_RATE
PILOT_HEAD_RATE = HEAD_SINK_RATE
PRECISION_TOLERANCE = 0.02  # nats per token: bfloat16's validation loss against float32's
PRIMARY = ("sink.softmax_vs_free", "parity.free_vs_softmax", "eviction.softmax_vs_free",
           "sink.deep_softmax")


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
                "proposed against sinks, and uniform, checked beside the loss contrast; "
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
        "help": _seeds_help("control_seeds", "uniform's seeds (checked beside the loss "
                            "contrast)"), "metavar": "N"})
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
        attention = heavy("attention")

        if not self.rules:
            raise ConfigError(f"{named(self, 'rules')} needs at least one rule name.")
        for rule in self.rules:
            if rule not in attention.RULES:
                raise ConfigError(f"{named(self, 'rules')}: {rule!r} is not a known attention "
                                  f"rule: choose from {', '.join(sorted(attention.RULES))}.")
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
        data = heavy("pretrain.data")

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


def screen_cell(opts: PretrainOptions, exe: Execution, rule: str, lr: float,
                protocol: dict[str, Any] | None = None) -> Cell:
    """A screened rate: at ``protocol`` (the pilot's choice) its whole budget, else a
    ``SCREEN_SHARE`` of the preset's."""
    cfg = base_config(opts, rule, lr, SCREEN_SEED, exe.device, **(protocol or {}))
    short = cfg.train.tokens if protocol else max(cfg.train.batch_size * cfg.model.context,
                                                  int(cfg.train.tokens * SCREEN_SHARE))
    return Cell(run_name("screen", rule, lr=lr), cfg.replace(tokens=short),
                group=("screen", rule, lr), label=f"screen {rule} lr {lr:g}")


def cells(opts: PretrainOptions, exe: Execution) -> list[Cell]:
    """The first round: the pilot (quick: every rule's runs at its one rate)."""
    if opts.quick:
        return [run_cell(opts, exe, rule, QUICK_LR, seed) for rule in opts.rules
                for seed in range(opts.n_seeds(rule))]
    return pilot_cells(opts, exe)


def run_cell(opts: PretrainOptions, exe: Execution, rule: str, lr: float, seed: int,
             protocol: dict[str, Any] | None = None) -> Cell:
    return Cell(run_name("runs", rule, seed),
                base_config(opts, rule, lr, seed, exe.device, **(protocol or {})),
                group=("runs", rule, seed), label=rule)


def pilot_cells(opts: PretrainOptions, exe: Execution, stages: tuple[int, ...] = (1,)
                ) -> list[Cell]:
    """The pilot's runs of ``stages`` (``PILOT``, ``PILOT_STAGE``), softmax on
    ``PILOT_SEEDS``, in declaration order."""
    out = []
    for name, changes in PILOT.items():
        if PILOT_STAGE[name] not in stages:
            continue
        settings = {**PILOT_BASE, **changes}
        lr = settings.pop("lr")
        out += [Cell(f"pilot/{name}_seed{s}",
                     base_config(opts, "softmax", lr, s, exe.device, **settings),
                     group=("pilot", name, s), label=f"pilot {name}") for s in PILOT_SEEDS]
    return out


def variant_cells(opts: PretrainOptions, exe: Execution, lr: float,
                  protocol: dict[str, Any] | None = None) -> list[Cell]:
    out = []
    protocol = protocol or {}
    for variant, changes in VARIANTS.items():
        changes = dict(changes)
        rate = lr * changes.pop("lr_factor", 1.0)
        out += [Cell(f"variants/{variant}_seed{s}",
                     base_config(opts, "softmax", rate, s, exe.device, **{**protocol, **changes}),
                     group=("variants", variant, s), label=f"softmax {VARIANT_WORDS[variant]}")
                for s in range(opts.variant_seeds)]
    tokens = protocol.get("tokens", sizes(opts)["tokens"]) * BUDGET_FACTOR
    out += [Cell(f"variants/budget_x{BUDGET_FACTOR}_seed{s}",
                 base_config(opts, "softmax", lr, s, exe.device, **{**protocol,
                                                                   "tokens": tokens}),
                 group=("budget", s), label=f"softmax at {BUDGET_FACTOR}x the tokens")
            for s in range(opts.budget_seeds)]
    return out


STUDY = Study(
    name="pretrain",
    title="Pretraining: sinks born on language, one small LM per attention rule",
    help="small language models pretrained on real text, one per attention rule: when a "
         "first-token sink emerges, and what it costs to train without one",
    description="Pretrain the same small causal LM on the BBC News text (or --corpus) with "
                "every attention rule at identical token budgets, each at its own learning "
                "rate found on a short screen; log the validation loss and the first-token sink "
                "metrics as training goes, and decide whether softmax models form a sink where "
                "the rules without normalisation do not, and whether those train as well; "
                "then Gu et al.'s factors and a budget control. Writes runs, figures, "
                "records.json, claims.csv, rules.csv and PRETRAIN.md. Rerunning with the same "
                "--out resumes.",
    options=PretrainOptions, analysis="sinklab.studies.pretrain_analysis",
    template="pretrain.md.j2", cells=cells, tables=("rules",), bulk=(), report="PRETRAIN.md",
    docs_example="docs/language.md", default_out="results/pretrain", primary=PRIMARY,
    more_folders=("screen", "runs", "variants"))

"""``sinklab zoo``: every attention rule on the task, its learning rate found, BOS given and denied.

Each rule is trained 1x1 and 2x2 under the paper's protocol except the learning rate and the
budget, in three stages that ``sinklab zoo`` runs as rounds (``more_cells``), each stage read
off the finished runs of the one before, so an interrupted study resumes where it stopped:

1. **Screening** (``screen/{config}_{rule}_lr{lr}_seed{s}/``, seeds 0..S-1): every rate of a
   starting grid. The best rate has the largest share of seeds that reach the stop rule, then
   the fewest steps (median, a seed that does not reach counting as infinitely many), then the
   lowest final training L∞ error (median). While the best rate is the grid's smallest or
   largest, the next rate of ``LADDER`` beyond it is screened too, until it is not or the
   ladder ends (the report says where the search stopped at the ladder's end;
   ``sinklab.studies.search``).
2. **Fresh seeds** (``runs/{config}_{rule}_lr{lr}_seed{s}/``, seeds S..S+N-1) at the rate
   found, which decide the claims: how each run ended, where each head's "output zero" comes
   from, whether it sinks on BOS, what hiding BOS does.
3. **BOS denied** (``denied/{config}_{rule}_{setting}_lr{lr}_seed{s}/``, the same fresh seeds
   and rate): BOS removed from every non-trigger row's keys, or its share capped at 1 - eps.

Every run stops at the stop rule, on a plateau (no new best training L∞ error for
``PATIENCE`` steps, ``train.patience``), or at the cap (``CAP``, longer than the reproduction's
slowest runs need); "not reached" always says which. Steps to the stop rule are reported as
cumulative-incidence curves with the plateau as a competing end and the cap as censoring.

One pass over each fresh model (``model_checks``, cached) gives the validation MSE, the errors
with BOS hidden, the relative Gu sink rate with its row floor and, where a capacity argument
applies (``sinklab.theory.capacity``), the error on training sequences that the argument
bounds. The two primary claims are contrasts, each one comparison said once with its size: the
paper's prediction that softmax seeds sink on BOS more often than the paper's ReLU seeds, and,
with BOS denied, that rules with another way to output zero reach the stop rule more often than
rules with no other way; each runs beside it the checks that could make it come out for another
reason (the two sides' shares reaching the stop rule, their errors, their rate searches).

This module is the declaration (options, the runs' settings and names, the first round's cells,
``STUDY``) and needs no torch; ``sinklab.studies.zoo_analysis`` reads the finished runs into
records and figures, ``sinklab.studies.zoo_claims`` decides the claims.

    sinklab zoo --out results/zoo             # 3 fresh seeds; docs/studies.toml sets the docs'
    sinklab zoo --quick --out /tmp/zoo        # smoke test: short budgets, one learning rate
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sinklab import heavy
from sinklab.config import RunConfig, build_run_config, check_count
from sinklab.errors import ConfigError
from sinklab.runs import limits
from sinklab.studies.options import named
from sinklab.studies.study import Cell, Execution, Study

CONFIGS: dict[str, tuple[int, int]] = {"1x1": (1, 1), "2x2": (2, 2)}
# The rates the search may screen, half a decade apart: it starts from START and steps outward
# along the ladder while its best rate is at an edge of those it has screened.
LADDER = (1e-5, 3e-5, 1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 1e-1)
START = {"1x1": (3e-4, 1e-3, 3e-3), "2x2": (1e-4, 3e-4, 1e-3)}
# The cap: the reproduction's slowest runs (2x2 ReLU at the paper's 1e-4) need about 15,000
# steps; a run that stops improving ends earlier by the plateau rule.
CAP = {"1x1": 20_000, "2x2": 30_000}
PATIENCE = 2_000  # train.patience: steps without a new best training L∞ error
# quick: 1x1 runs get the steps that 1x1 softmax and ReLU need at the middle starting rate
# (about 700-900, the reproduction's), so the quick study shows both reaching the stop rule;
# 2x2 runs (thousands of steps) only pass through the machinery
QUICK_CAP = {"1x1": 1500, "2x2": 300}
QUICK_PATIENCE = 200
QUICK_RULES = ("softmax", "relu")  # the paper's two, unless --rules names others
DEFAULT_SEEDS, QUICK_SEEDS = 3, 1  # fresh seeds per (configuration, rule)
DEFAULT_SCREEN, QUICK_SCREEN = 3, 1  # screening seeds per rate
CAPS = (0.01, 0.1)  # model.bos_cap_eps of the capped settings
QUICK_CAPS = CAPS[:1]
LOG_EVERY = 100

# the claims named before the study runs, corrected together by Holm: two contrasts, each one
# comparison pooled over settings by the exact stratified test (``sinklab.contrasts``)
SINKING_RULE = "softmax"  # the paper's rule, predicted to sink: other rules are compared with it
# the paper's ReLU, whose rows need not sum to 1, predicted not to sink
NON_SINKING_RULE = "relu"
# softmax's seeds sink on BOS more often than the paper's ReLU's, 1x1 and 2x2
SINK_CONTRAST = f"{SINKING_RULE}.bos_sink_vs_{NON_SINKING_RULE}"
# with BOS denied, rules with another way to output zero reach the stop rule more often than rules
# with no other way
DENIED_CONTRAST = "denied.other_zero_vs_none"
PRIMARY = (SINK_CONTRAST, DENIED_CONTRAST)


def _rules() -> dict[str, Any]:
    """The registered attention rules (``sinklab.attention.RULES``)."""
    attention = heavy("attention")

    return attention.RULES


def _default_rules() -> tuple[str, ...]:
    """sinklab's own rules: a plugin's rule (sinklab.plugins) is trained when --rules names it,
    so that a loaded plugin never changes what the zoo's report covers."""
    return tuple(sorted(name for name, info in _rules().items() if info.module == "sinklab"))


@dataclass(frozen=True)
class Denial:
    """A way of denying BOS to the non-trigger rows (``model.bos``): removed from their keys, or
    its share capped at 1 - eps."""

    mode: str  # "removed" or "capped"
    eps: float | None = None

    @property
    def name(self) -> str:
        return self.mode if self.eps is None else f"capped {self.eps:g}"

    @property
    def folder(self) -> str:
        return self.name.replace(" ", "")

    def model(self) -> dict[str, Any]:
        extra = {} if self.eps is None else {"bos_cap_eps": self.eps}
        return {"bos": self.mode, **extra}


REMOVED = Denial("removed")


@dataclass
class ZooOptions:
    """What ``sinklab zoo`` trains; checked on creation."""

    seeds: int | None = field(default=None, metadata={
        "help": f"fresh seeds per (configuration, rule) at the rate found, with BOS and with BOS "
                f"denied (default: {DEFAULT_SEEDS}; {QUICK_SEEDS} with --quick); "
                "docs/studies.toml sets the committed report's", "metavar": "N"})
    screen_seeds: int | None = field(default=None, metadata={
        "help": f"seeds per learning rate of the search (default: {DEFAULT_SCREEN}; "
                f"{QUICK_SCREEN} with --quick); the fresh seeds come after them", "metavar": "N"})
    quick: bool = field(default=False, metadata={
        "help": f"smoke test, under half a minute on two idle cores: "
                f"{' and '.join(QUICK_RULES)} (unless --rules says otherwise), {QUICK_SCREEN} "
                f"screening and {QUICK_SEEDS} fresh seed, the middle starting rate only, BOS "
                f"removed and capped at {QUICK_CAPS[0]:g}, at most {QUICK_CAP['1x1']:,} (1x1, "
                f"enough for softmax and ReLU to reach the stop rule) and {QUICK_CAP['2x2']} "
                "(2x2) steps"})
    rules: tuple[str, ...] | None = field(default=None, metadata={
        "help": "attention rules, separated by commas (default: sinklab's own rules, "
                "`sinklab rules`; with --quick "
                f"{', '.join(QUICK_RULES)})", "metavar": "RULES"})

    def __post_init__(self) -> None:
        if self.seeds is None:
            self.seeds = QUICK_SEEDS if self.quick else DEFAULT_SEEDS
        if self.screen_seeds is None:
            self.screen_seeds = QUICK_SCREEN if self.quick else DEFAULT_SCREEN
        check_count(named(self, "seeds"), self.seeds)
        check_count(named(self, "screen_seeds"), self.screen_seeds)
        if self.rules is None:
            self.rules = QUICK_RULES if self.quick else _default_rules()
        self.rules = tuple(self.rules)
        rules = named(self, "rules")
        if not self.rules:
            raise ConfigError(f"{rules} needs at least one rule name.")
        known = _rules()
        for rule in self.rules:
            if rule not in known:
                raise ConfigError(f"{rules}: {rule!r} is not a known attention rule: choose from "
                                  f"{', '.join(sorted(known))}.")
            if self.rules.count(rule) > 1:
                raise ConfigError(f"{rules} lists {rule!r} twice; give each rule once.")
        # checked before the cells are built: a huge --seeds is refused without building them
        # (the most runs the three stages can ask for: every rate of the ladder screened)
        per_rule = (self.screen_seeds * (1 if self.quick else len(LADDER))
                    + self.seeds * (1 + len(denials(self.quick))))
        limits.check_cells(per_rule * len(self.rules) * len(CONFIGS),
                           f"{named(self, 'seeds')} {self.seeds} and "
                           f"{named(self, 'screen_seeds')} {self.screen_seeds}")


def denials(quick: bool) -> tuple[Denial, ...]:
    """The denied settings: BOS removed, and capped at each of ``CAPS`` (quick: at the smaller
    only, the one setting where one softmax layer's failure is not forced by a proof)."""
    return (REMOVED, *(Denial("capped", eps) for eps in (QUICK_CAPS if quick else CAPS)))


def cap(config: str, quick: bool) -> int:
    """The step cap of every run in ``config``."""
    return (QUICK_CAP if quick else CAP)[config]


def patience(quick: bool) -> int:
    return QUICK_PATIENCE if quick else PATIENCE


def start_grid(config: str, quick: bool) -> tuple[float, ...]:
    """The rates the search screens first (quick: the middle one, and no more)."""
    grid = START[config]
    return grid[1:2] if quick else grid


def screen_seeds(opts: ZooOptions) -> range:
    return range(opts.screen_seeds)


def fresh_seeds(opts: ZooOptions) -> range:
    """The seeds that decide the claims: after the screening seeds, never one of them."""
    return range(opts.screen_seeds, opts.screen_seeds + opts.seeds)


def run_config(config: str, rule: str, lr: float, seed: int, quick: bool, device: str,
               denial: Denial | None = None) -> RunConfig:
    """A zoo run: the paper's protocol with the zoo's rate, cap and plateau rule, BOS visible
    or denied."""
    layers, heads = CONFIGS[config]
    return build_run_config({
        "model": {"attention": rule, "n_layers": layers, "n_heads": heads,
                  **(denial.model() if denial is not None else {})},
        "train": {"seed": seed, "lr": lr, "max_steps": cap(config, quick),
                  "patience": patience(quick), "device": device, "log_every": LOG_EVERY},
    })


def run_name(stage: str, config: str, rule: str, lr: float, seed: int,
             denial: Denial | None = None) -> str:
    """A run's folder: ``screen/``, ``runs/`` or ``denied/`` (with the setting)."""
    setting = f"_{denial.folder}" if denial is not None else ""
    return f"{stage}/{config}_{rule}{setting}_lr{lr:g}_seed{seed}"


def screen_cell(opts: ZooOptions, exe: Execution, config: str, rule: str, lr: float,
                seed: int) -> Cell:
    return Cell(run_name("screen", config, rule, lr, seed),
                run_config(config, rule, lr, seed, opts.quick, exe.device),
                group=("screen", config, rule), label=f"{config} {rule} search")


def cells(opts: ZooOptions, exe: Execution) -> list[Cell]:
    """The search's first round: every rule, 1x1 and 2x2, at each starting rate and screening
    seed, one ensemble per (configuration, rule)."""
    return [screen_cell(opts, exe, config, rule, lr, seed)
            for config in CONFIGS for rule in opts.rules for lr in start_grid(config, opts.quick)
            for seed in screen_seeds(opts)]


STUDY = Study(
    name="zoo",
    title="Zoo: which attention rules need a sink",
    help="every attention rule on the task, 1x1 and 2x2: its learning rate found, BOS given "
         "and denied",
    description="Train every attention rule (or --rules) 1x1 and 2x2: search each one's "
                "learning rate on screening seeds (extending the grid while the best rate is "
                "at its edge), train fresh seeds at the rate found with BOS and with BOS "
                "removed or capped, and report how each run ended (the stop rule, a plateau or "
                "the cap), where each rule's \"output zero\" comes from, whether it sinks on "
                "BOS and whether it needs BOS, with the claims decided by stated tests. Writes "
                "runs, figures, records.json, claims.csv, entries.csv, runs.csv, screen.csv, "
                "denied.csv and ZOO.md. Rerunning with the same --out resumes: finished runs "
                "are kept and the search goes on from them.",
    options=ZooOptions, analysis="sinklab.studies.zoo_analysis", template="zoo.md.j2",
    cells=cells, tables=("entries", "runs", "screen", "denied"), report="ZOO.md",
    docs_example="docs/zoo.md", default_out="results/zoo", primary=PRIMARY,
    more_folders=("runs", "denied"))

"""``sinklab zoo``: every attention rule on the task, its learning rate found, BOS given and denied.

Each rule is trained 1x1 and 2x2 under the paper's protocol except the learning rate and the
budget, in three stages that ``sinklab zoo`` runs as rounds (``Study.more_cells``), each stage
read off the finished runs of the one before, so an interrupted study resumes where it stopped:

1. **Screening** (``screen/{config}_{rule}_lr{lr}_seed{s}/``, seeds 0..S-1): every rate of a
   starting grid. The best rate has the largest share of seeds that reach the stop rule, then
   the fewest steps (median, a seed that does not reach counting as infinitely many), then the
   lowest final training L∞ error (median). While the best rate is the grid's smallest or
   largest, the next rate of ``LADDER`` beyond it is screened too, until it is not or the
   ladder ends (the report says where the search stopped at the ladder's end).
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
applies, the error on training sequences that the argument bounds. The primary claims: the
paper's two predictions (softmax sinks on BOS, the paper's ReLU does not, each the other's
control) and, with BOS removed, that rules with no other way to output zero fail while rules
with another one reach the stop rule (each the other's control).

    sinklab zoo --out results/zoo             # 3 fresh seeds; docs/studies.toml sets the docs'
    sinklab zoo --quick --out /tmp/zoo        # smoke test: short budgets, one learning rate
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from sinklab import claims as cl
from sinklab.claims import Claim
from sinklab.config import RunConfig, build_run_config, check_count
from sinklab.definitions import GU_EPS, OFF_ROW, default_source
from sinklab.errors import ConfigError, ResultsError
from sinklab.runs import folders, limits
from sinklab.runs.files import read_json
from sinklab.studies.base import Cell, Context, Execution, FigureSpec, Study, named

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
VALIDATION_SEED = 1  # the test set is eval.seed = 0
SOURCES = ("BOS", "sink logit", "learned key", "closed gate", "clipped to zero", "zero row",
           "content")
ON_SOURCES = ("BOS", "content")  # sources of heads whose non-trigger rows are on
SINK_SHARE = 0.9  # a head sinks on BOS when its rows are on and this share of them is on BOS
# The relative Gu rate ignores a row whose sum is below this fraction of its head's mean
# trigger-row sum: the report's one definition of a row that is off (``default_source``). Such
# a row writes less than a fifth of what the head writes where it must write the average;
# divided by its own small sum it would count as much as a row that is on.
GU_ROW_FLOOR = OFF_ROW
CAPACITY_SEQUENCES = 2000  # training-distribution sequences the capacity check is measured on
ABLATION_KEYS = ("linf_trigger", "linf_nontrigger", "mse_trigger", "mse_nontrigger")
CACHE_VERSION = 3  # bump when model_checks computes something else
# how a run ended (``summary["status"]``), as the report says it
ENDS = {"converged": "reached the stop rule", "plateau": "plateau", "max_steps": "cap",
        "diverged": "diverged"}


def _rules() -> dict[str, Any]:
    """The registered attention rules (``sinklab.attention.RULES``)."""
    from sinklab.attention import RULES  # torch: the rules are torch functions; not for --help

    return RULES


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


def _screen_cell(opts: ZooOptions, exe: Execution, config: str, rule: str, lr: float,
                 seed: int) -> Cell:
    return Cell(run_name("screen", config, rule, lr, seed),
                run_config(config, rule, lr, seed, opts.quick, exe.device),
                group=("screen", config, rule), label=f"{config} {rule} search")


def cells(opts: ZooOptions, exe: Execution) -> list[Cell]:
    """The search's first round: every rule, 1x1 and 2x2, at each starting rate and screening
    seed, one ensemble per (configuration, rule)."""
    return [_screen_cell(opts, exe, config, rule, lr, seed)
            for config in CONFIGS for rule in opts.rules for lr in start_grid(config, opts.quick)
            for seed in screen_seeds(opts)]


# ------------------------------------------------------------------ the learning-rate search


def rate_score(runs: list[dict[str, Any]]) -> tuple[float, float, float]:
    """How good a rate's screening runs are, smaller is better: minus the share that reached
    the stop rule, the median steps (a run that did not reach counts as infinitely many), the
    median final training L∞ error (a diverged run's as infinite)."""
    share = sum(r["converged"] for r in runs) / len(runs)
    steps = float(np.median([r["steps"] if r["converged"] else math.inf for r in runs]))
    linf = float(np.median([r["train_linf"] if r["train_linf"] is not None
                            and math.isfinite(r["train_linf"]) else math.inf for r in runs]))
    return -share, steps, linf


def best_rate(tried: dict[float, list[dict[str, Any]]]) -> float:
    """The best screened rate by ``rate_score`` (ties: the smaller rate)."""
    return min(tried, key=lambda lr: (*rate_score(tried[lr]), lr))


def next_rate(tried: list[float], best: float,
              ladder: tuple[float, ...] | None = None) -> float | None:
    """The ladder's next rate beyond the edge where the best rate sits, or None: the best is
    inside the screened rates, or at the ladder's end (``ladder``: the zoo's by default)."""
    ladder = LADDER if ladder is None else ladder
    at = ladder.index(best)
    if best == min(tried) and at > 0:
        return ladder[at - 1]
    if best == max(tried) and at < len(ladder) - 1:
        return ladder[at + 1]
    return None


@dataclass
class Search:
    """Where the learning-rate search of one (configuration, rule) stands: the screened rates
    with their runs' summaries, the rates still to screen, and the best rate once none are."""

    tried: dict[float, list[dict[str, Any]]]
    pending: list[float]
    best: float | None
    at_ladder_end: bool  # the best rate is at an edge of the screened rates and of the ladder


def _finished_summary(ctx: Context, name: str) -> dict[str, Any] | None:
    path = ctx.out / name
    return ctx.summary(name) if folders.check_complete(path) else None


def search(ctx: Context, config: str, rule: str) -> Search:
    """Replay the search of (config, rule) from its finished screening runs."""
    opts = ctx.opts
    tried: dict[float, list[dict[str, Any]]] = {}
    queue = list(start_grid(config, opts.quick))
    while queue:
        lr = queue.pop(0)
        runs = [_finished_summary(ctx, run_name("screen", config, rule, lr, s))
                for s in screen_seeds(opts)]
        if any(r is None for r in runs):
            return Search(tried, [lr, *queue], None, False)
        tried[lr] = runs  # type: ignore[assignment]
        if queue or opts.quick:
            continue
        best = best_rate(tried)
        more = next_rate(list(tried), best)
        if more is not None:
            queue.append(more)
    best = best_rate(tried)
    edge = best in (min(tried), max(tried)) and len(tried) > 1
    return Search(tried, [], best, edge and next_rate(list(tried), best) is None)


def more_cells(ctx: Context) -> list[Cell]:
    """The runs each (configuration, rule) needs so far: the rates its search has screened past
    the starting grid and the rate it still has to screen or, once it has found a rate, its
    fresh seeds there, with BOS and with BOS denied. The study trains the ones not finished
    and asks again, until none is new."""
    opts, exe = ctx.opts, ctx.exe
    out: list[Cell] = []
    for config in CONFIGS:
        for rule in opts.rules:
            found = search(ctx, config, rule)
            # the rates screened past the starting grid (finished: counted, not trained again)
            # and the rate still to screen
            out += [_screen_cell(opts, exe, config, rule, lr, s)
                    for lr in [*found.tried, *found.pending]
                    if lr not in start_grid(config, opts.quick) for s in screen_seeds(opts)]
            if found.best is None:
                continue
            lr = found.best
            out += [Cell(run_name("runs", config, rule, lr, s),
                         run_config(config, rule, lr, s, opts.quick, exe.device),
                         group=("zoo", config, rule), label=f"{config} {rule} fresh seeds")
                    for s in fresh_seeds(opts)]
            out += [Cell(run_name("denied", config, rule, lr, s, d),
                         run_config(config, rule, lr, s, opts.quick, exe.device, d),
                         group=("denied", config, rule, d.name),
                         label=f"{config} {rule} BOS {d.name}")
                    for d in denials(opts.quick) for s in fresh_seeds(opts)]
    return out


# ------------------------------------------------------------------ the capacity argument


@dataclass(frozen=True)
class Capacity:
    """A proof that a rule cannot express the task in a configuration; its full text is in the
    report template (``zoo.md.j2``), under ``key``. ``measured``: the argument bounds an error
    that ``capacity_mse`` measures on the trained models (a check of its numbers)."""

    key: str
    why: str  # the argument in one clause, for tables
    measured: bool = False
    # the argument holds for a stack of attention-only layers of any depth, residual or not
    # (not only for the 1x1 setting)
    any_depth: bool = False


POSITION_FREE = Capacity(
    "position_free",
    "its weights at the trigger row do not depend on the trigger's position j, so they cannot "
    "give the 1/j average", measured=True)
FIXED_WEIGHTS = Capacity(
    "fixed_weights",
    "its weights ignore the scores, so the model is linear and cannot both null every "
    "non-trigger row and average at the trigger row")

LINEAR_STACK = Capacity(
    "linear_stack",
    "its weights ignore the scores, so a stack of its layers is linear in the input: the row at "
    "the first trigger position gives x_1 one weight, which must be 1/j when that row is the "
    "trigger's and 0 when it is not", any_depth=True)

POLE_GAP = Capacity(
    "pole_gap",
    "its weights see the trigger's position j only through the bias -log(j + 1), which puts the "
    "pole of each content weight at or left of j = -1 where the average's 1/j has it at 0; "
    "three trigger positions turn that into an error floor")

CLIP_OFFSET = Capacity(
    "clip_offset",
    "its trigger row's clipped content weight 1.03 / (j + r) - 0.03 keeps an offset that no one "
    "scale turns into 1/j at every trigger position (at its default zeta and gamma)")

# the arguments whose sequences are written down (``expressivity.argument_errors``): a trained
# model's error on them is checked against the floor
SEQUENCE_ARGUMENTS = (POLE_GAP, CLIP_OFFSET)

# (configuration, rule) -> the argument that the rule cannot express the task there. The
# position-dependent arguments are 1x1 only: from two layers on, a first layer can write the
# query's position (or its prefix's mean) into the residual stream, and they no longer hold
# (relu_len and relu_raw get 5-10x closer at 2x2). Uniform's weights are fixed at any depth, so
# its stack stays linear. Sigmoid with bias -log n sees the row's length through n, but only
# as a pole left of -1 (``sinklab.theory.expressivity.SIGMOID_1X1_ARGUMENT``), at 1x1.
CAPACITY: dict[tuple[str, str], Capacity] = {
    ("1x1", "relu_len"): POSITION_FREE,  # ReLU(S_ik) / L: L is the same for every query
    ("1x1", "relu_raw"): POSITION_FREE,  # ReLU(S_ik): no division at all
    ("1x1", "uniform"): FIXED_WEIGHTS,  # 1 / (i + 1) whatever the scores
    ("2x2", "uniform"): LINEAR_STACK,  # the same weights in every layer: a linear stack
    ("1x1", "sigmoid"): POLE_GAP,  # the bias -log(j + 1) is all its weights know of j
    ("1x1", "clipped_softmax"): CLIP_OFFSET,  # two layers can (expressivity's construction)
}


def capacity_applies(cfg: RunConfig, argument: Capacity | None = None) -> bool:
    """Whether a run's settings are those the arguments need: attention-only layers with BOS
    visible, the rule's default arguments (sigmoid's bias -log n), one trigger per sequence at
    positions from 2 (so that key 1 is a content token, and row 1 a non-trigger row, at every
    trigger position) over at least two positions (three for ``POLE_GAP`` and ``CLIP_OFFSET``,
    which also needs two content coordinates); and, unless the
    ``argument`` holds at any depth (``Capacity.any_depth``), one layer with the plain
    target."""
    task = cfg.task
    shape = (argument is not None and argument.any_depth) or \
        (cfg.model.n_layers == 1 and not cfg.residual)
    defaults = not _rules()[cfg.model.attention].non_default(cfg.model.attention_args)
    return (shape and defaults and cfg.model.block == "attention"
            and cfg.model.bos == "visible" and task.single_trigger
            and task.train_trigger_min >= 2
            and task.train_trigger_max - task.train_trigger_min >= (
                2 if argument in (POLE_GAP, CLIP_OFFSET) else 1)
            and (argument is not CLIP_OFFSET or task.d_model >= 5))


def capacity_bounds(cfg: RunConfig) -> dict[str, Any]:
    """The arguments' numbers for a run's task (the proofs are in the report).

    ``position_free``: with the trigger position j uniform over the training range, every
    weights' expected squared error in each content coordinate at the trigger row is at least
    Var(1/j) / 3 (``mse_floor``), and some sequences of the training distribution err by at
    least (1/j_min - 1/j_max) / 2 there (``sup_floor``). ``fixed_weights``: some sequences with
    the trigger at j_min err by at least (j + 1) / (j (j + 3)), j = j_min (``sup_floor``).
    ``linear_stack``: some sequences err by at least 1 / (2 j_min) at row j_min, at any depth
    (``sup_floor``). ``pole_gap``: some sequences err by at least the floor of
    ``sinklab.theory.expressivity.sigmoid_floor`` (``sup_floor``, with its three trigger
    positions and their Lagrange weights; None with fewer than three positions).
    ``clip_offset``: some sequences err by at least ``expressivity.clipped_floor`` (``sup_floor``,
    with the best fit found, its score gap r and scale mu; None where it does not apply)."""
    from sinklab.theory.expressivity import clipped_floor, sigmoid_floor  # torch: not for --help

    task = cfg.task
    j = np.arange(task.train_trigger_min, task.train_trigger_max + 1, dtype=float)
    var = float(np.var(1 / j))  # over the uniform trigger position (population variance)
    mse_floor = var / 3  # Var(u) = 1/3 for u ~ Uniform(-1, 1)
    tol = cfg.train.tol
    lo = j[0]
    common = {"j_min": int(lo), "j_max": int(j[-1]), "tol": tol}
    pole, clip = sigmoid_floor(task), clipped_floor(task)
    return {
        "position_free": {**common, "var_inv_j": var, "mse_floor": mse_floor,
                          "rms_floor": math.sqrt(mse_floor), "sup_floor": (1 / lo - 1 / j[-1]) / 2,
                          "mse_floor_over_tol2": mse_floor / tol ** 2,
                          "content_coordinates": task.d_model - 3,
                          "sequences": CAPACITY_SEQUENCES},
        "fixed_weights": {**common, "w_best": 2 * (lo + 1) / (lo * (lo + 3)),
                          "sup_floor": (lo + 1) / (lo * (lo + 3))},
        "linear_stack": {**common, "sup_floor": 1 / (2 * lo)},
        "pole_gap": None if pole is None else {
            **common, "sup_floor": pole.floor, "exact": str(pole.exact),
            "nodes": list(pole.nodes), "weights": [str(w) for w in pole.weights]},
        "clip_offset": None if clip is None else {
            **common, "sup_floor": clip.floor, "r": clip.r, "mu": clip.mu,
            "attained": clip.attained, "intervals": clip.n_intervals},
    }


def ends_text(ends: dict[str, int]) -> str:
    """How the runs that did not reach the stop rule ended: "2 plateau, 1 cap"."""
    words = [f"{ends[key]} {ENDS[key]}" for key in ("plateau", "max_steps", "diverged")
             if ends.get(key)]
    return ", ".join(words) if words else "none"


def outcome(ends: dict[str, int], n: int, steps_cap: int, capacity: Capacity | None) -> str:
    """How a (configuration, rule) ended over its n seeds: how many reached the stop rule (one
    training batch's L∞ error under the tolerance, which is not to say that their test or
    worst-case errors are under it) and how the others ended (plateau, the cap, diverged)."""
    converged = ends.get("converged", 0)
    if n and converged == n:
        return f"reached the stop rule ({n} of {n})"
    others = f"{ends_text(ends)}; cap {steps_cap:,} steps"
    if converged:
        return f"mixed ({converged} of {n} reached the stop rule; the others: {others})"
    if capacity is not None:
        return f"cannot express (argument in the report; {others})"
    return f"not reached ({others})"


def count_ends(runs: list[dict[str, Any]]) -> dict[str, int]:
    """How many runs ended each way (``ENDS``' keys)."""
    return {key: sum(r["status"] == key for r in runs) for key in ENDS}


def share_label(k: int, n: int) -> str:
    """'yes (n of n)', 'no (0 of n)' or 'mixed (k of n)': seeds that disagree are mixed; 'n/a'
    without seeds to count."""
    if n == 0:
        return "n/a (no seed to count)"
    if k == n:
        return f"yes ({k} of {n})"
    if k == 0:
        return f"no (0 of {n})"
    return f"mixed ({k} of {n})"


def no_other_zero(rule: str) -> bool:
    """Whether the rule has no way to output zero but BOS: a row that sees one key (row 1 with
    BOS removed) puts exactly 1 on it whatever its score and the rule's parameters. Softmax,
    clipped softmax and uniform do; a rule with free rows, an implicit or learned sink key or a
    gate can put less. Computed by calling the rule, so a plugin's rule is classed too."""
    import torch  # torch: the rules are torch functions; not for --help

    from sinklab.attention import build_rule

    mask = torch.tensor([[True, False], [False, True]])[None]  # row 1 sees key 1 alone
    generator = torch.Generator().manual_seed(0)
    for _ in range(4):  # four draws of the rule's parameters
        built = build_rule(rule, 1, 1, 4)
        with torch.no_grad():
            built.init_member(0, generator, 1.0)
        x = torch.randn(1, 1, 2, 4, generator=generator)
        for score in (-30.0, -1.0, 0.0, 1.0, 30.0):
            scores = torch.full((1, 2, 2), score)
            with torch.no_grad():
                if built.value_side:
                    q = torch.randn(1, 1, 2, 1, 4, generator=generator)
                    weights = built(scores, mask, x, q)
                    mixed = torch.ones(1, 1, 2, 1, 4)
                    passed = built.passed(mixed, built.mix(mixed, weights, x, q))
                    if passed is not None and float(passed[0, 0, 1, 0]) != 1.0:
                        return False
                else:
                    weights = built(scores, mask, x)
            if float(weights[0, 1, 1]) != 1.0:
                return False
    return True


# ------------------------------------------------------------------- the pass over models


def model_digest(path: Any) -> str:
    """The SHA-256 of a finished run's model, from its completion record: what a cached
    evaluation of the model depends on besides its settings."""
    marker = folders.read_marker(path) or {}
    return marker["complete"]["files"]["model.pt"]["sha256"]


def model_checks(ctx: Context, name: str, capacity: bool) -> dict[str, Any]:
    """One pass over a trained model (cached in ``cache/``): validation MSE, the test errors
    with BOS hidden, the relative Gu rate with its row floor and, with ``capacity``, the error
    the capacity argument bounds."""
    path = ctx.out / name
    settings = {"version": CACHE_VERSION, "model": model_digest(path),
                "validation_seed": VALIDATION_SEED, "gu_eps": GU_EPS, "floor": GU_ROW_FLOOR,
                "capacity": capacity, "capacity_sequences": CAPACITY_SEQUENCES}

    def compute() -> dict[str, Any]:
        from sinklab import measure  # torch: the declaration also serves the help texts

        return measure.zoo_checks(path, validation_seed=VALIDATION_SEED,
                                  capacity_sequences=CAPACITY_SEQUENCES if capacity else None,
                                  ablation_keys=ABLATION_KEYS, eps=GU_EPS, floor=GU_ROW_FLOOR)

    return ctx.cached(name.replace("runs/", "zoo_"), settings, compute)


def argument_error(ctx: Context, name: str, key: str) -> float:
    """A trained 1x1 model's largest error on the sequences of the argument ``key`` that has
    them (``POLE_GAP``'s, ``CLIP_OFFSET``'s, or "bos_denied" for a denied run a proof forces to
    err: ``expressivity.argument_errors``; cached)."""
    path = ctx.out / name
    settings = {"version": 1, "model": model_digest(path), "argument": key}

    def compute() -> dict[str, Any]:
        from sinklab.theory.expressivity import argument_errors  # torch: not for --help
        from sinklab.train import load_model

        cfg, model = load_model(path)
        return {"error": argument_errors(model, cfg.task, key)[0]}

    return ctx.cached(f"argument_{name.replace('/', '_')}", settings, compute)["error"]


# ------------------------------------------------------------------------------- records


def head_sources(summary: dict[str, Any], rule: str) -> list[list[str]]:
    """Where each head's zero comes from, [layer][head] (``sinklab.definitions.default_source``)."""
    kind = _rules()[rule].row_kind
    return [[default_source(b, rn, rt, kind) for b, rn, rt in zip(bl, rnl, rtl)]
            for bl, rnl, rtl in zip(summary["bos_mass_nontrigger"],
                                    summary["row_sum_nontrigger"], summary["row_sum_trigger"])]


def bos_shares(summary: dict[str, Any]) -> list[list[float | None]]:
    """Each head's BOS share of its non-trigger rows (BOS weight / row sum), [layer][head];
    None where the rows sum to zero."""
    return [[b / rn if rn > 0 else None for b, rn in zip(bl, rnl)]
            for bl, rnl in zip(summary["bos_mass_nontrigger"], summary["row_sum_nontrigger"])]


def sinks(shares: list[list[float | None]], sources: list[list[str]]) -> bool:
    """Whether some head parks its non-trigger rows on BOS (the theorem's sink): its rows are
    on, at least half on BOS ("BOS" source), and at least ``SINK_SHARE`` of them on BOS.

    Judged by BOS's share of the row, so a gated head whose half-open gate scales a softmax on
    BOS sinks; an all-zero ReLU row does not."""
    return any(src == "BOS" and share is not None and share >= SINK_SHARE
               for sl, srcl in zip(shares, sources) for share, src in zip(sl, srcl))


def _largest(values: list[list[float | None]], keep: list[list[bool]]) -> float | None:
    chosen = [v for vl, kl in zip(values, keep) for v, k in zip(vl, kl) if k and v is not None]
    return max(chosen) if chosen else None


def run_record(ctx: Context, config: str, rule: str, lr: float, seed: int) -> dict[str, Any]:
    """One fresh run: its summary's numbers, where its zero comes from, the model checks."""
    from sinklab.metrics import in_shares  # torch: the declaration also serves the help texts

    name = run_name("runs", config, rule, lr, seed)
    s = in_shares(ctx.summary(name))  # a summary's rates are shares, an older one's percent
    argument = CAPACITY.get((config, rule))
    cfg = build_run_config(read_json(ctx.out / name / "config.json"))
    applies = argument is not None and capacity_applies(cfg, argument)
    checks = model_checks(ctx, name, applies and argument.measured)
    sources = head_sources(s, rule)
    shares = bos_shares(s)
    on = [[src in ON_SOURCES for src in layer] for layer in sources]
    gu = checks["gu"]
    return {
        "config": config, "rule": rule, "lr": lr, "seed": seed, "status": s["status"],
        "converged": s["converged"], "steps": s["steps"], "train_linf": s["train_linf"],
        "test_linf": s["linf_error"], "mse": s["mse"], "linf_trigger": s["linf_trigger"],
        "linf_nontrigger": s["linf_nontrigger"], "mse_trigger": s["mse_trigger"],
        "mse_nontrigger": s["mse_nontrigger"],
        "bos_mass_nontrigger": s["bos_mass_nontrigger"],  # absolute weight on BOS, per head
        "bos_share_nontrigger": shares,  # BOS's share of the row, per head
        "row_sum_nontrigger": s["row_sum_nontrigger"], "row_sum_trigger": s["row_sum_trigger"],
        "sources": sources, "sinks": sinks(shares, sources),
        "bos_weight_max": float(np.max(s["bos_mass_nontrigger"])),
        "bos_share_max_on": _largest(shares, on),
        # the zoo's records and report keep the sink rates in percent, as they always had them
        "sink_rate": 100 * s["sink_rate"],  # Gu et al., absolute, percent
        "sink_rate_relative": gu["rate"],  # relative, rows under the floor ignored, percent
        "sink_rate_relative_no_floor": 100 * s["sink_rate_relative"],
        "gu_rows_ignored": gu["rows_ignored"], "gu_rows_zero": gu["rows_zero"],
        "gu_rows": gu["rows"],
        "validation_mse": checks["validation_mse"],
        "ablated": checks["ablated"], "capacity_applies": applies,
        "capacity_mse": checks["capacity_mse"],
        "argument_error": argument_error(ctx, name, argument.key)
        if applies and argument in SEQUENCE_ARGUMENTS else None,
    }


def denied_floor(config: str, rule: str, denial: Denial, tol: float) -> float | None:
    """The error a proof forces on one layer of ``rule`` with BOS denied so, when it is above
    the stop rule's tolerance ``tol`` (``expressivity.denied_floor``: softmax, clipped softmax
    and uniform with BOS removed, softmax capped at eps >= 0.03), else None: such runs are a
    check of the proof, not evidence."""
    from sinklab.theory.expressivity import denied_floor as floor_of  # torch: not for --help

    floor = floor_of(rule, denial.mode, denial.eps) if config == "1x1" else None
    return floor if floor is not None and floor > tol else None


def short_record(ctx: Context, name: str, denial: Denial | None = None,
                 **keys: Any) -> dict[str, Any]:
    """A screening or denied run: how it ended and its errors (and, for a denied run a proof
    forces to err, ``denied_floor``, its error on the argument's sequences)."""
    s = ctx.summary(name)
    cfg = build_run_config(read_json(ctx.out / name / "config.json"))
    floor = None
    if denial is not None and not _rules()[keys["rule"]].non_default(cfg.model.attention_args):
        floor = denied_floor(keys["config"], keys["rule"], denial, cfg.train.tol)
    return {**keys, "forced": floor is not None, "floor": floor,
            "denied_error": argument_error(ctx, name, "bos_denied") if floor is not None
            else None,
            "status": s["status"], "converged": s["converged"], "steps": s["steps"],
            "train_linf": s["train_linf"], "test_linf": s["linf_error"],
            "linf_nontrigger": s["linf_nontrigger"], "linf_trigger": s["linf_trigger"],
            "bos_weight_max": float(np.max(s["bos_mass_nontrigger"])),
            "row_sum_nontrigger": float(np.mean(s["row_sum_nontrigger"]))}


def incidence(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Steps to the stop rule as cumulative incidence (``claims.cumulative_incidence``): the
    plateau and divergence compete with it, the cap censors."""
    causes = [None if r["status"] == "max_steps" else r["status"] for r in runs]
    curves = cl.cumulative_incidence([r["steps"] for r in runs], causes)
    return {"n": len(runs), "converged": curves.get("converged", []),
            "plateau": curves.get("plateau", []), "diverged": curves.get("diverged", []),
            "censored": sorted(r["steps"] for r in runs if r["status"] == "max_steps")}


def screen_record(config: str, rule: str, found: Search, steps_cap: int) -> dict[str, Any]:
    """One (configuration, rule)'s search: every screened rate with how its seeds ended."""
    rates = []
    for lr in sorted(found.tried):
        runs = found.tried[lr]
        _, med_steps, med_linf = rate_score(runs)
        rates.append({"lr": lr, "n": len(runs), "converged": sum(r["converged"] for r in runs),
                      "ends": count_ends(runs), "steps": [r["steps"] for r in runs],
                      "median_steps": med_steps if math.isfinite(med_steps) else None,
                      "median_train_linf": med_linf if math.isfinite(med_linf) else None})
    return {"config": config, "rule": rule, "rates": rates, "lr": found.best,
            "at_ladder_end": found.at_ladder_end, "cap": steps_cap,
            "extended": len(found.tried) > len(START[config])}


def entry(config: str, rule: str, chosen: list[dict[str, Any]], found: Search,
          denied: list[dict[str, Any]], opts: ZooOptions) -> dict[str, Any]:
    """One (configuration, rule): the rate found, its fresh seeds' numbers with BOS and how its
    denied runs ended."""
    n, converged = len(chosen), sum(r["converged"] for r in chosen)
    argument = CAPACITY.get((config, rule))
    applies = argument is not None and all(r["capacity_applies"] for r in chosen)
    capacity = argument if applies else None
    steps_cap = cap(config, opts.quick)
    ends = count_ends(chosen)
    solved = [r for r in chosen if r["converged"]]
    sources = [src for r in chosen for layer in r["sources"] for src in layer]
    counts = {src: sources.count(src) for src in SOURCES if src in sources}
    k_sink = sum(r["sinks"] for r in solved)
    kind = _rules()[rule].row_kind

    def each(key: str) -> list[Any]:
        return [r[key] for r in chosen]

    by_setting = {}
    for d in denials(opts.quick):
        runs = [r for r in denied if r["setting"] == d.name]
        lost_ends = count_ends(runs)
        by_setting[d.name] = {
            "n": len(runs), "converged": sum(r["converged"] for r in runs), "ends": lost_ends,
            "outcome": outcome(lost_ends, len(runs), steps_cap, None),
            "test_linf": [r["test_linf"] for r in runs], "steps": [r["steps"] for r in runs],
            "forced": bool(runs) and all(r["forced"] for r in runs),
            "floor": runs[0]["floor"] if runs else None,
            "denied_error": [r["denied_error"] for r in runs],
            "incidence": incidence(runs)}
    implicit = kind in ("implicit sink", "learned key")
    return {
        "config": config, "rule": rule, "row_kind": kind, "lr": found.best,
        "at_ladder_end": found.at_ladder_end, "n": n, "converged": converged, "cap": steps_cap,
        "ends": ends, "outcome": outcome(ends, n, steps_cap, capacity),
        "capacity": capacity.key if capacity else None,
        "capacity_why": capacity.why if capacity else None,
        "against_argument": bool(capacity and converged),
        "solves": 2 * converged >= n > 0,  # at least half its fresh seeds reach the stop rule
        "no_other_zero": no_other_zero(rule),
        "bos_sinks": k_sink, "n_solved": len(solved),
        "sinks_label": share_label(k_sink, len(solved)),
        "sources": counts, "n_heads": len(sources),
        "main_source": max(counts, key=lambda src: counts[src]) if counts else None,
        "seeds": each("seed"), "steps": each("steps"), "test_linf": each("test_linf"),
        "mse": each("mse"), "bos_weight_max": each("bos_weight_max"),
        "bos_share_max_on": each("bos_share_max_on"),
        "row_sum_nontrigger": [float(np.mean(r["row_sum_nontrigger"])) for r in chosen],
        "row_sum_trigger": [float(np.mean(r["row_sum_trigger"])) for r in chosen],
        # the weight an implicit or learned sink key holds at non-trigger rows: its own source
        "sink_key_mass": [1 - float(np.mean(r["row_sum_nontrigger"])) for r in chosen]
        if implicit else None,
        "sink_rate": each("sink_rate"), "sink_rate_relative": each("sink_rate_relative"),
        "gu_rows_ignored": sum(each("gu_rows_ignored")), "gu_rows_zero": sum(each("gu_rows_zero")),
        "gu_rows": sum(each("gu_rows")), "capacity_mse": each("capacity_mse"),
        "argument_error": each("argument_error"),
        "ablation": {key: {"intact": each(key), "ablated": [r["ablated"][key] for r in chosen]}
                     for key in ABLATION_KEYS},
        "incidence": incidence(chosen), "denied": by_setting,
    }


def protocol(opts: ZooOptions, exe: Execution) -> dict[str, Any]:
    """The settings the report quotes, read from the runs' own configs."""
    cfg = run_config("1x1", "softmax", START["1x1"][1], 0, opts.quick, exe.device)
    return {"beta1": cfg.train.beta1, "beta2": cfg.train.beta2,
            "batch_size": cfg.train.batch_size, "tol": cfg.train.tol,
            "cap": {c: cap(c, opts.quick) for c in CONFIGS}, "patience": cfg.train.patience,
            "start": {c: list(start_grid(c, opts.quick)) for c in CONFIGS},
            "ladder": list(LADDER), "screen_seeds": list(screen_seeds(opts)),
            "fresh_seeds": list(fresh_seeds(opts)),
            "denials": [d.name for d in denials(opts.quick)],
            "eval_sequences": cfg.eval.n_sequences, "eval_trigger": cfg.task.eval_trigger,
            "validation_seed": VALIDATION_SEED, "seq_len": cfg.task.seq_len,
            "d_model": cfg.task.d_model, "train_trigger_min": cfg.task.train_trigger_min,
            "train_trigger_max": cfg.task.train_trigger_max, "sink_share": SINK_SHARE,
            "gu_row_floor": GU_ROW_FLOOR, "log_every": LOG_EVERY,
            "paper_cap": build_run_config({}).train.max_steps}


def expressivity(ctx: Context, config: str, rule: str) -> dict[str, Any]:
    """What the rule can express in ``config`` (``sinklab.theory.expressivity.EXPRESSIVITY``):
    the verdict, on what grounds, and for a construction its measured worst error (cached)."""
    from sinklab.theory import expressivity as ex  # torch: not for --help

    verdict = ex.EXPRESSIVITY.get((config, rule))
    if verdict is None:
        return {"config": config, "rule": rule, "verdict": "unknown", "how": "open",
                "construction": None, "why": "not in sinklab's table (a rule of a plugin)",
                "check": None}
    check = None
    if verdict.construction is not None:
        check = ctx.cached(f"expressivity_{config}_{rule}",
                           {"version": 1, "config": config, "rule": rule, "how": verdict.how},
                           lambda: ex.check_construction(config, rule))
    return {"config": config, "rule": rule, "verdict": verdict.verdict, "how": verdict.how,
            "construction": verdict.construction, "why": verdict.why, "check": check}


def collect(ctx: Context) -> dict[str, Any]:
    opts = ctx.opts
    runs, denied, screens, entries = [], [], [], []
    for config in CONFIGS:
        for rule in opts.rules:
            found = search(ctx, config, rule)
            lr = found.best
            screens.append(screen_record(config, rule, found, cap(config, opts.quick)))
            chosen = [run_record(ctx, config, rule, lr, s) for s in fresh_seeds(opts)]
            lost = [short_record(ctx, run_name("denied", config, rule, lr, s, d), d,
                                 config=config, rule=rule, setting=d.name, lr=lr, seed=s)
                    for d in denials(opts.quick) for s in fresh_seeds(opts)]
            runs += chosen
            denied += lost
            entries.append(entry(config, rule, chosen, found, lost, opts))
    capacity = None
    if any(e["capacity"] for e in entries):
        capacity = capacity_bounds(run_config("1x1", "softmax", START["1x1"][1], 0, opts.quick,
                                              ctx.exe.device))
    return {"protocol": protocol(opts, ctx.exe), "runs": runs, "entries": entries,
            "screen": screens, "denied": denied, "capacity": capacity,
            "expressivity": [expressivity(ctx, config, rule) for config in CONFIGS
                             for rule in opts.rules],
            "capacity_table": [{"config": c, "rule": r, "argument": a.key, "why": a.why,
                                "measured": a.measured} for (c, r), a in CAPACITY.items()]}


# -------------------------------------------------------------------------------- claims

SINKING_RULE = "softmax"  # the paper's rule, predicted to sink: the control of a "no sink" claim
# the paper's ReLU, whose rows need not sum to 1, predicted not to sink: softmax's claim's control
NON_SINKING_RULE = "relu"
# the claims named before the study runs, corrected together by Holm: the paper's two
# predictions, pooled over 1x1 and 2x2, and with BOS removed, rules with no other way to output
# zero fail while rules with another way reach the stop rule
NO_OTHER_ZERO_FAILS = "denied.no_other_zero.fails"
OTHER_ZERO_REACHES = "denied.other_zero.reaches"
PRIMARY = (f"{SINKING_RULE}.bos_sink", f"{NON_SINKING_RULE}.no_bos_sink", NO_OTHER_ZERO_FAILS,
           OTHER_ZERO_REACHES)
# why a rule could output zero without a sink on BOS, by the kind of its rows
ESCAPE = {
    "free": "its rows need not sum to 1, so a row can be all zero",
    "implicit sink": "its implicit sink key can take the weight BOS would hold",
    "gated": "its gate can close",
    "learned key": "its learned key can take the weight BOS would hold",
    "clipped": "its small weights are clipped to exactly 0",
}
SINK_WORDS = (f"sink on BOS (a head whose non-trigger rows are on and hold at least "
              f"{SINK_SHARE:g} of their weight on BOS)")


def fixed_weight_rules() -> set[str]:
    """Rules whose weights ignore the scores (``FIXED_WEIGHTS`` or ``LINEAR_STACK`` in
    ``CAPACITY``): uniform puts 1/(i + 1) on BOS at row i, at most 1/2 on a non-trigger row, so
    it cannot sink by construction and its "no sink" is a check of the sink measure, not
    evidence."""
    return {rule for (_config, rule), argument in CAPACITY.items()
            if argument in (FIXED_WEIGHTS, LINEAR_STACK)}


def sink_parts(entries: list[dict[str, Any]], rule: str) -> list[tuple[str, int, int]]:
    """(configuration, seeds sinking on BOS, seeds) of ``rule`` in each configuration it was
    trained in, counting the seeds that reached the stop rule only: how a model that does not
    solve the task outputs its errors says nothing about how the task's zero is made."""
    return [(e["config"], e["bos_sinks"], e["n_solved"]) for config in CONFIGS for e in entries
            if (e["config"], e["rule"]) == (config, rule)]


def _reached(entries: list[dict[str, Any]], rule: str) -> str:
    """How many of a pooled rule's seeds reached the stop rule, for the claim's data."""
    k = sum(e["n_solved"] for e in entries if e["rule"] == rule)
    n = sum(e["n"] for e in entries if e["rule"] == rule)
    return f"(counting the {k} of {n} seeds that reached the stop rule)"


def _control_rule(rules: list[str]) -> str:
    """softmax's control: the paper's ReLU, or else the first trained rule whose rows need not
    sum to 1 (its name is the setting shown), or the paper's ReLU untrained (0 seeds)."""
    if NON_SINKING_RULE in rules:
        return NON_SINKING_RULE
    free = [r for r in rules if _rules()[r].row_kind == "free"]
    return free[0] if free else NON_SINKING_RULE


def _sinks_claim(entries: list[dict[str, Any]], rules: list[str]) -> Claim:
    """The paper's prediction for softmax: its seeds sink on BOS (rate above r0), pooled over
    the configurations; the control is a rule whose rows need not sum to 1 through the same
    test."""
    rule, control = SINKING_RULE, _control_rule(rules)

    def test(key: str, name: str) -> Claim:
        return cl.rate_at_least(
            key, f"{name} seeds that reach the stop rule sink on BOS at a rate above {cl.R0:g}",
            None, None, f"sink on BOS {_reached(entries, name)}", parts=sink_parts(entries, name))

    claim = test(f"{rule}.bos_sink", rule)
    claim = replace(claim, sentence=(
        f"Softmax attention sinks on BOS: the rate of softmax seeds that reach the stop rule and "
        f"{SINK_WORDS} is above {cl.R0:g}, pooled over 1x1 (one attention layer without a "
        f"residual stream, the theorem's setting) and 2x2 (residual, the paper's multi-layer "
        f"setting)"))
    return cl.with_control(claim, test(f"{control}.bos_sink", control),
                           f"{control} (rows need not sum to 1), the same configurations")


def _no_sink_claim(entries: list[dict[str, Any]], rule: str) -> Claim:
    """A rule's seeds that reach the stop rule do not sink on BOS (rate below 1 - r0), pooled
    over the configurations; the control is softmax's seeds of the same configurations through
    the same test."""
    kind = _rules()[rule].row_kind
    why = ESCAPE.get(kind)

    def test(key: str, name: str) -> Claim:
        return cl.rate_at_most(
            key, f"{name} seeds that reach the stop rule sink on BOS at a rate below "
                 f"{1 - cl.R0:.2g}", None, None, f"sink on BOS {_reached(entries, name)}",
            parts=sink_parts(entries, name))

    claim = test(f"{rule}.no_bos_sink", rule)
    escape = f" (it could output zero another way: {why})" if why else ""
    claim = replace(claim, sentence=(
        f"{rule} attention does not sink on BOS{escape}: the rate of {rule} seeds that reach "
        f"the stop rule and sink on BOS is below {1 - cl.R0:.2g}, pooled over 1x1 and 2x2"))
    return cl.with_control(claim, test(f"{SINKING_RULE}.no_bos_sink", SINKING_RULE),
                           f"{SINKING_RULE} (rows sum to 1, no escape), the same configurations")


def _sinks_described(entries: list[dict[str, Any]], rule: str) -> Claim:
    """How many of a rule's solving seeds sink on BOS, where its rows need not sum to 1 (a zero
    row is always open to it): described, not tested against softmax."""
    parts = sink_parts(entries, rule)
    k, n = sum(p[1] for p in parts), sum(p[2] for p in parts)
    words = ", ".join(f"{c}: {kk}/{nn}" for c, kk, nn in parts)
    return cl.descriptive(
        f"{rule}.no_bos_sink",
        f"{k} of {n} {rule} seeds that reached the stop rule sink on BOS (its rows need not sum "
        f"to 1, so an all-zero row is always open to it: described, not tested against softmax)",
        f"{k} of {n} seeds ({words})", n=n, estimate=k / n if n else None)


def _reached_claim(e: dict[str, Any]) -> Claim:
    """How many seeds of a (configuration, rule) reached the stop rule: the protocol's outcome,
    resting on our own budget, so descriptive (no control could test it)."""
    c, r, k, n = e["config"], e["rule"], e["converged"], e["n"]
    lo, hi = cl.clopper_pearson(k, n)
    linf = np.asarray(e["test_linf"], dtype=float)
    data = (f"{k} of {n} seeds reached the stop rule (two-sided {cl.CONFIDENCE} Clopper-Pearson "
            f"interval of the rate [{lo:.2f}, {hi:.2f}]); the others: {ends_text(e['ends'])}; "
            f"test L∞ error median {np.median(linf):.2e} (range {linf.min():.2e} to "
            f"{linf.max():.2e}); steps {min(e['steps']):,} to {max(e['steps']):,}" if n
            else "no seeds")
    if e.get("capacity"):
        data += "; a proof in the report shows that no weights express the task here"
    return cl.descriptive(
        f"{c}.{r}.reached_stop_rule",
        f"{k} of {n} {c} {r} seeds reached the stop rule within {e['cap']:,} steps at the "
        f"learning rate the search found ({e['lr']:g})",
        data, n=n, estimate=k / n if n else None, interval=(lo, hi))


def _denied_claim(e: dict[str, Any], setting: str) -> Claim:
    """How many fresh seeds of a (configuration, rule) reached the stop rule with BOS denied
    (descriptive: one rule in one setting, no control)."""
    d = e["denied"][setting]
    c, r, k, n = e["config"], e["rule"], d["converged"], d["n"]
    return cl.descriptive(
        f"{c}.{r}.{setting.replace(' ', '_')}.reached_stop_rule",
        f"{k} of {n} {c} {r} seeds reached the stop rule with BOS {setting} at the rate found "
        f"with BOS ({e['lr']:g})",
        f"{k} of {n} reached it; the others: {ends_text(d['ends'])}" if n else "no seeds",
        n=n, estimate=k / n if n else None)


def denied_parts(entries: list[dict[str, Any]], other_zero: bool
                 ) -> list[tuple[str, int, int]]:
    """(config rule setting, seeds that reached the stop rule with BOS denied so, seeds) of
    every (configuration, rule) that solves the task with BOS and has (``other_zero``) or has
    not another way to output zero (``no_other_zero``), in every denied setting but those where
    a proof forces the failure (``denied_floor``: a check, not evidence)."""
    return [(f"{e['config']} {e['rule']} {setting}", d["converged"], d["n"])
            for e in entries if e["solves"] and e["no_other_zero"] != other_zero
            for setting, d in e["denied"].items() if not d.get("forced")]


def _floor_check(e: dict[str, Any], suffix: str, values: list[float | None], floor: float,
                 sentence: str) -> Claim:
    """Trained models' measured errors against a floor a proof gives for any weights: a check
    of the argument and its numbers, not evidence (seeds without a value are left out)."""
    values = [v for v in values if v is not None]
    k = sum(v >= floor for v in values)
    lowest = f" (lowest {min(values):.3g})" if values else ""
    return cl.check_all(f"{e['config']}.{e['rule']}.{suffix}", sentence, k, len(values),
                        f"seeds are at or above the floor{lowest}")


def _denied_check(e: dict[str, Any], setting: str) -> Claim:
    """A 1x1 denied setting that a proof forces to err: the runs' errors on the argument's
    sequences against its floor (a check of the argument, not evidence)."""
    d = e["denied"][setting]
    return _floor_check(
        e, f"{setting.replace(' ', '').replace('.', '_')}.denied_floor", d["denied_error"],
        d["floor"],
        f"With BOS {setting}, the trained {e['config']} {e['rule']} models err by at least "
        f"{d['floor']:.3g} on the argument's sequences, the floor it proves for any weights of "
        f"one layer of this rule (a check, not evidence that the rule needs BOS)")


def _class_words(entries: list[dict[str, Any]], other_zero: bool) -> str:
    rules = sorted({e["rule"] for e in entries if e["solves"] and e["no_other_zero"] != other_zero})
    return ", ".join(rules) if rules else "none of the rules trained"


def _denied_claims(entries: list[dict[str, Any]]) -> list[Claim]:
    """With BOS denied to the non-trigger rows: rules with no other way to output zero do not
    reach the stop rule, rules with another way do; each pooled over the (configuration, rule)
    pairs that solve the task with BOS and the denied settings not forced by a proof, each the
    other's control."""
    def fails(key: str, other_zero: bool) -> Claim:
        return cl.rate_at_most(key, "seeds reach the stop rule with BOS denied at a rate below "
                               f"{1 - cl.R0:.2g}", None, None,
                               "reached the stop rule with BOS denied",
                               parts=denied_parts(entries, other_zero) or [("none", 0, 0)])

    def reaches(key: str, other_zero: bool) -> Claim:
        return cl.rate_at_least(key, "seeds reach the stop rule with BOS denied at a rate above "
                                f"{cl.R0:g}", None, None, "reached the stop rule with BOS denied",
                                parts=denied_parts(entries, other_zero) or [("none", 0, 0)])

    forced = replace(fails(NO_OTHER_ZERO_FAILS, False), sentence=(
        f"Rules with no other way to output zero than BOS (a row with one visible key puts "
        f"exactly 1 on it: {_class_words(entries, False)}) do not reach the stop rule when BOS "
        f"is denied to the non-trigger rows (removed, or its share capped): the rate of their "
        f"seeds that reach it is below {1 - cl.R0:.2g}, pooled over the configurations where "
        f"they solve the task with BOS and the denied settings, leaving out one layer with BOS "
        f"removed, where a proof forces the failure (checked below)"))
    free = replace(reaches(OTHER_ZERO_REACHES, True), sentence=(
        f"Rules with another way to output zero (an all-zero row, an implicit or learned sink "
        f"key, a closed gate: {_class_words(entries, True)}) reach the stop rule when BOS is "
        f"denied to the non-trigger rows (removed, or its share capped): the rate of their seeds "
        f"that reach it is above {cl.R0:g}, pooled over the configurations where they solve the "
        f"task with BOS and the denied settings"))
    return [cl.with_control(forced, fails(f"{NO_OTHER_ZERO_FAILS}.control", True),
                            "the rules with another way to output zero, the same test"),
            cl.with_control(free, reaches(f"{OTHER_ZERO_REACHES}.control", False),
                            "the rules with no other way, the same test")]


def _fixed_weights_check(entries: list[dict[str, Any]], rule: str) -> Claim:
    """A rule whose weights ignore the scores cannot sink: a check of the sink measure."""
    chosen = [e for e in entries if e["rule"] == rule]
    n = sum(e["n"] for e in chosen)
    k = n - sum(sum(1 for v in e["bos_share_max_on"] if v is not None and v >= SINK_SHARE)
                for e in chosen)
    shares = [v for e in chosen for v in e["bos_share_max_on"] if v is not None]
    largest = f"; largest BOS share of a row that is on {max(shares):.3f}" if shares else ""
    return cl.check_all(
        f"{rule}.no_bos_sink",
        f"{rule} attention puts 1/(i + 1) on BOS at row i, at most 1/2 on a non-trigger row, so "
        f"by construction none of its seeds can reach the sinking share {SINK_SHARE:g} (1x1 and "
        f"2x2; a check of the sink measure, not evidence)",
        k, n, f"seeds do not sink on BOS{largest}")


def _capacity_check(e: dict[str, Any], floor: float) -> Claim:
    """The trained models' error on training sequences against the floor the capacity argument
    proves for any weights: a check of the argument's numbers, not evidence."""
    return _floor_check(
        e, "capacity_floor", e["capacity_mse"], floor,
        f"The trained {e['config']} {e['rule']} models' trigger-row error on training sequences "
        f"(MSE over the content coordinates) is at or above the floor Var(1/j)/3 = {floor:.3g} "
        f"that the argument proves for any weights (a check of its numbers)")


def _argument_check(e: dict[str, Any], floor: float) -> Claim:
    """The trained models' error on the sequences of their rule's argument against the floor it
    proves for any weights: a check of the argument and its numbers, not evidence."""
    return _floor_check(
        e, "argument_floor", e.get("argument_error") or [], floor,
        f"The trained {e['config']} {e['rule']} models err by at least {floor:.5g}, the floor the "
        f"argument ({e['capacity']}) proves for any weights, on its own sequences (a check of "
        f"the argument's numbers)")


def claims(records: dict[str, Any], opts: ZooOptions) -> list[Claim]:
    """The zoo's claims: the four primary ones (softmax sinks on BOS; the paper's ReLU does
    not; with BOS removed rules without another zero fail and rules with one reach the stop
    rule), each with its control; whether each rule with an implicit or learned sink key, a
    gate or a clip avoids a BOS sink (softmax's seeds as the control), described for the other
    rules whose rows need not sum to 1; how many seeds reached the stop rule, with BOS and
    denied (descriptive); and the checks: a rule whose weights ignore the scores cannot sink,
    the trained models stay above the proven capacity floor."""
    entries = records["entries"]
    rules = list(dict.fromkeys(e["rule"] for e in entries))
    fixed = fixed_weight_rules()
    out: list[Claim] = [_sinks_claim(entries, rules), _no_sink_claim(entries, NON_SINKING_RULE),
                        *_denied_claims(entries)]
    for rule in rules:
        if rule in (SINKING_RULE, NON_SINKING_RULE):
            continue
        if rule in fixed:
            out.append(_fixed_weights_check(entries, rule))
        elif _rules()[rule].row_kind == "free":
            out.append(_sinks_described(entries, rule))
        else:
            out.append(_no_sink_claim(entries, rule))
    out += [_reached_claim(e) for e in entries]
    out += [_denied_claim(e, setting) for e in entries for setting in e["denied"]]
    out += [_denied_check(e, setting) for e in entries
            for setting, d in e["denied"].items() if d.get("forced")]
    bounds = records["capacity"]
    if bounds is not None:
        floor = bounds[POSITION_FREE.key]["mse_floor"]
        out += [_capacity_check(e, floor) for e in entries if e["capacity"] == POSITION_FREE.key]
        for argument in SEQUENCE_ARGUMENTS:
            if bounds.get(argument.key) is not None:
                out += [_argument_check(e, bounds[argument.key]["sup_floor"]) for e in entries
                        if e["capacity"] == argument.key]
    return out


def relabel(records: dict[str, Any], opts: ZooOptions) -> dict[str, Any]:
    """The records with each entry's outcome label written again from its counts (``outcome``),
    so that a report rendered from older records says what the code says; nothing else
    changes. Records from before the zoo searched its learning rates (no ``screen``) cannot be
    rendered by this template: a ResultsError of one sentence says how to regenerate them."""
    if "screen" not in records:
        raise ResultsError(
            "these zoo records were written before the zoo searched each rule's learning rate "
            "and denied BOS to every rule, so this sinklab cannot render them: regenerate them "
            "with `sinklab zoo --config docs/studies.toml --out results/docs-zoo-search --docs "
            "docs/zoo.md` (resumable) or render them with the sinklab that wrote them.")
    entries = []
    for e in records["entries"]:
        argument = CAPACITY.get((e["config"], e["rule"]))
        capacity = argument if argument is not None and e["capacity"] == argument.key else None
        entries.append({**e, "outcome": outcome(e["ends"], e["n"], e["cap"], capacity)})
    return {**records, "entries": entries}


# ------------------------------------------------------------------------------- figures


def _sel(records: dict[str, Any], config: str) -> list[dict[str, Any]]:
    return [e for e in records["entries"] if e["config"] == config]


def _draw_sources(axes: Any, records: dict[str, Any], opts: ZooOptions) -> None:
    for ax, config in zip(axes[0], CONFIGS):
        sel = _sel(records, config)
        xs = np.arange(len(sel))
        bottom = np.zeros(len(sel))
        for source in SOURCES:
            share = np.array([e["sources"].get(source, 0) / max(e["n_heads"], 1) for e in sel])
            ax.bar(xs, share, bottom=bottom, label=source)
            bottom += share
        for x, e in zip(xs, sel):
            ax.annotate(f"{e['converged']}/{e['n']}", (x, 1.02), ha="center", fontsize=7)
        ax.set_xticks(xs, [e["rule"] for e in sel], rotation=45, ha="right")
        ax.set_ylim(0, 1.12)
        ax.set_ylabel("share of heads (fresh seeds at the rate found)")
        ax.set_title(f"{config}: where \"output zero\" comes from (seeds that reached the "
                     "stop rule on top)", fontsize=9)
        ax.legend(fontsize=7)


def _draw_bos(axes: Any, records: dict[str, Any], opts: ZooOptions) -> None:
    for ax, config in zip(axes[0], CONFIGS):
        sel = _sel(records, config)
        for x, e in enumerate(sel):
            ax.scatter([x] * e["n"], e["bos_weight_max"], color="tab:blue", s=14,
                       label="BOS weight (absolute), most-BOS head" if x == 0 else None)
            shares = [v for v in e["bos_share_max_on"] if v is not None]
            ax.scatter([x + 0.2] * len(shares), shares, color="tab:green", marker="^", s=14,
                       label="BOS share of the row, most-BOS head that is on"
                       if x == 0 else None)
            ax.scatter([x] * e["n"], np.clip(e["test_linf"], 0, 1), color="tab:red",
                       marker="x", s=14, label="test L∞ (clipped at 1)" if x == 0 else None)
        ax.axhline(SINK_SHARE, color="grey", ls="--", lw=0.8)
        ax.set_xticks(range(len(sel)), [e["rule"] for e in sel], rotation=45, ha="right")
        ax.set_ylim(-0.05, 1.05)
        ax.set_title(f"{config}: per fresh seed, at the rate found", fontsize=9)
        ax.legend(fontsize=7)


def _draw_incidence(axes: Any, records: dict[str, Any], opts: ZooOptions) -> None:
    """Cumulative incidence of the stop rule (solid) and of the plateau (dotted) per rule,
    fresh seeds with BOS (top) and with BOS removed (bottom), 1x1 left and 2x2 right."""
    import matplotlib.pyplot as plt  # matplotlib: only where figures are drawn

    colours = plt.get_cmap("tab20")
    rules = list(dict.fromkeys(e["rule"] for e in records["entries"]))
    for row, setting in enumerate((None, REMOVED.name)):
        for ax, config in zip(axes[row], CONFIGS):
            for e in _sel(records, config):
                inc = e["incidence"] if setting is None else e["denied"].get(setting, {}).get(
                    "incidence")
                if not inc:
                    continue
                colour = colours(rules.index(e["rule"]) % 20)
                for key, style in (("converged", "-"), ("plateau", ":")):
                    points = inc[key]
                    if points:
                        xs = [0, *[t for t, _ in points], e["cap"]]
                        ys = [0, *[f for _, f in points], points[-1][1]]
                        ax.step(xs, ys, where="post", ls=style, color=colour, lw=1.2,
                                label=e["rule"] if key == "converged" else None)
            ax.set_xscale("symlog", linthresh=100)
            ax.set_ylim(-0.02, 1.02)
            ax.set_xlabel("step")
            ax.set_ylabel("share of seeds")
            where = "BOS visible" if setting is None else f"BOS {setting}"
            ax.set_title(f"{config}, {where}: reached (solid), plateau (dotted)", fontsize=9)
            if ax.get_legend_handles_labels()[0]:
                ax.legend(fontsize=6, ncol=2)


def _draw_screen(axes: Any, records: dict[str, Any], opts: ZooOptions) -> None:
    """The search's every screened rate: the share of its screening seeds that reached the stop
    rule, per rule, with the rate found marked."""
    for ax, config in zip(axes[0], CONFIGS):
        screens = [s for s in records["screen"] if s["config"] == config]
        for i, sc in enumerate(screens):
            lrs = [r["lr"] for r in sc["rates"]]
            shares = [r["converged"] / r["n"] for r in sc["rates"]]
            offset = 0.02 * (i - len(screens) / 2)  # rules apart where their shares coincide
            line, = ax.plot(lrs, [v + offset for v in shares], marker="o", ms=3, lw=1,
                            label=sc["rule"])
            found = next(r for r in sc["rates"] if r["lr"] == sc["lr"])
            ax.plot([sc["lr"]], [found["converged"] / found["n"] + offset], marker="*", ms=10,
                    color=line.get_color())
        ax.set_xscale("log")
        ax.set_ylim(-0.15, 1.15)
        ax.set_xlabel("learning rate")
        ax.set_ylabel("share of screening seeds that reached the stop rule")
        ax.set_title(f"{config}: the search (star: the rate found)", fontsize=9)
        ax.legend(fontsize=6, ncol=2)


FIGURES = (
    FigureSpec("fig_zoo_sources", _draw_sources, grid=(1, 2), size=(6.0, 4.2)),
    FigureSpec("fig_zoo_bos", _draw_bos, grid=(1, 2), size=(6.0, 4.2)),
    FigureSpec("fig_zoo_incidence", _draw_incidence, grid=(2, 2), size=(6.0, 4.2)),
    FigureSpec("fig_zoo_search", _draw_screen, grid=(1, 2), size=(6.0, 4.2)),
)


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
    options=ZooOptions, template="zoo.md.j2", collect=collect, cells=cells, claims=claims,
    figures=FIGURES, tables=("entries", "runs", "screen", "denied"), report="ZOO.md",
    docs_example="docs/zoo.md", default_out="results/zoo", primary=PRIMARY, complete=relabel,
    more_cells=more_cells, more_folders=("runs", "denied"))

"""``sinklab zoo``: every attention rule on the task, with a fair budget and a shared LR grid.

Each rule is trained 1x1 and 2x2 under the paper's protocol except the learning rate: every rate
of a small shared grid, every seed, the same step budget and stop rule for all, into
``runs/{1x1,2x2}_{rule}_lr{lr}_seed{s}/``. Per (configuration, rule) the rate with the lowest
mean MSE on *validation* sequences (a separate draw from the test set) is kept and its seeds are
reported: how each run ended (``outcome``: reached the stop rule, mixed, not reached in the
budget, or cannot express, where a capacity argument proves it), where each head's "output zero"
comes from, and whether it sinks on BOS. One pass over the trained models (``model_checks``,
cached) gives the validation MSE, the errors with BOS hidden, the relative Gu sink rate with its
row floor and, where a capacity argument applies, the error on training sequences that the
argument bounds. The primary claims are the paper's two predictions, pooled over 1x1 and 2x2:
softmax sinks on BOS, the paper's ReLU does not, each the other's control.

    sinklab zoo --out results/zoo             # 3 seeds; docs/studies.toml sets the docs' 9
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
from sinklab.errors import ConfigError
from sinklab.runs import folders, limits
from sinklab.runs.files import read_json
from sinklab.studies.base import Cell, Context, Execution, FigureSpec, Study, named

CONFIGS: dict[str, tuple[int, int]] = {"1x1": (1, 1), "2x2": (2, 2)}
LR_GRID = {"1x1": (3e-4, 1e-3, 3e-3), "2x2": (1e-4, 3e-4, 1e-3)}
STEPS = {"1x1": 3000, "2x2": 6000}  # the same budget for every rule
QUICK_STEPS = {"1x1": 600, "2x2": 300}
DEFAULT_SEEDS, QUICK_SEEDS = 3, 1
LOG_EVERY = 10  # fine training logs: the extensions read sink-emergence curves from them
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
CACHE_VERSION = 2  # bump when model_checks computes something else


def _rules() -> dict[str, Any]:
    """The registered attention rules (``sinklab.attention.RULES``)."""
    from sinklab.attention import RULES  # torch: the rules are torch functions; not for --help

    return RULES


def _default_rules() -> tuple[str, ...]:
    """sinklab's own rules: a plugin's rule (sinklab.plugins) is trained when --rules names it,
    so that a loaded plugin never changes what the zoo's report covers."""
    return tuple(sorted(name for name, info in _rules().items() if info.module == "sinklab"))


@dataclass
class ZooOptions:
    """What ``sinklab zoo`` trains; checked on creation."""

    seeds: int | None = field(default=None, metadata={
        "help": f"seeds per (configuration, rule, learning rate) (default: {DEFAULT_SEEDS}; "
                f"{QUICK_SEEDS} with --quick); docs/studies.toml sets the committed report's",
        "metavar": "N"})
    quick: bool = field(default=False, metadata={
        "help": f"smoke test: {QUICK_SEEDS} seed, the middle learning rate only, at most "
                f"{QUICK_STEPS['1x1']} (1x1) and {QUICK_STEPS['2x2']} (2x2) steps"})
    rules: tuple[str, ...] = field(default_factory=_default_rules, metadata={
        "help": "attention rules, separated by commas (default: sinklab's own rules, "
                "`sinklab rules`)", "metavar": "RULES"})

    def __post_init__(self) -> None:
        if self.seeds is None:
            self.seeds = QUICK_SEEDS if self.quick else DEFAULT_SEEDS
        check_count(named(self, "seeds"), self.seeds)
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
        limits.check_cells(self.seeds * len(self.rules)
                           * sum(len(lrs(c, self.quick)) for c in CONFIGS),
                           f"{named(self, 'seeds')} {self.seeds}")


def steps(config: str, quick: bool) -> int:
    """The step budget of every rule in ``config``."""
    return (QUICK_STEPS if quick else STEPS)[config]


def lrs(config: str, quick: bool) -> tuple[float, ...]:
    """The learning-rate grid of ``config`` (quick: its middle rate only)."""
    grid = LR_GRID[config]
    return grid[1:2] if quick else grid


def middle_lr(config: str) -> float:
    """The middle rate of the grid, the one quick mode (and the extensions) use."""
    return LR_GRID[config][1]


def run_config(config: str, rule: str, lr: float, seed: int, quick: bool, device: str,
               task: dict[str, Any] | None = None, model: dict[str, Any] | None = None
               ) -> RunConfig:
    """A zoo run: the paper's protocol with the zoo's budget and logging, plus any task or
    model settings (the extensions' sweeps)."""
    layers, heads = CONFIGS[config]
    return build_run_config({
        "task": dict(task or {}),
        "model": {"attention": rule, "n_layers": layers, "n_heads": heads, **(model or {})},
        "train": {"seed": seed, "lr": lr, "max_steps": steps(config, quick), "device": device,
                  "log_every": LOG_EVERY},
    })


def run_name(config: str, rule: str, lr: float, seed: int, setting: str = "") -> str:
    """A run's folder; ``setting`` names what differs from the plain zoo run (``_L32``: the
    extensions), so that the folder names of every sinklab version stay the same."""
    return f"runs/{config}_{rule}_lr{lr:g}{setting}_seed{seed}"


def members(opts: ZooOptions, config: str) -> list[tuple[float, int]]:
    return [(lr, seed) for lr in lrs(config, opts.quick) for seed in range(opts.seeds)]


def cells(opts: ZooOptions, exe: Execution) -> list[Cell]:
    """Every rule, 1x1 and 2x2: one ensemble per (configuration, rule) over the grid and seeds."""
    return [Cell(run_name(config, rule, lr, seed),
                 run_config(config, rule, lr, seed, opts.quick, exe.device),
                 group=("zoo", config, rule), label=f"{config} {rule} lr grid")
            for config in CONFIGS for rule in opts.rules for lr, seed in members(opts, config)]


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

# (configuration, rule) -> the argument that the rule cannot express the task there. The
# position-dependent arguments are 1x1 only: from two layers on, a first layer can write the
# query's position (or its prefix's mean) into the residual stream, and they no longer hold
# (relu_len and relu_raw get 5-10x closer at 2x2). Uniform's weights are fixed at any depth, so
# its stack stays linear. Sigmoid with bias -log n sees the row's length through n, so it is
# not here.
CAPACITY: dict[tuple[str, str], Capacity] = {
    ("1x1", "relu_len"): POSITION_FREE,  # ReLU(S_ik) / L: L is the same for every query
    ("1x1", "relu_raw"): POSITION_FREE,  # ReLU(S_ik): no division at all
    ("1x1", "uniform"): FIXED_WEIGHTS,  # 1 / (i + 1) whatever the scores
    ("2x2", "uniform"): LINEAR_STACK,  # the same weights in every layer: a linear stack
}


def capacity_applies(cfg: RunConfig, argument: Capacity | None = None) -> bool:
    """Whether a run's settings are those the arguments need: attention-only layers with BOS
    visible, one trigger per sequence at positions from 2 (so that key 1 is a content token,
    and row 1 a non-trigger row, at every trigger position) over at least two positions; and,
    unless the ``argument`` holds at any depth (``Capacity.any_depth``), one layer with the
    plain target."""
    task = cfg.task
    shape = (argument is not None and argument.any_depth) or \
        (cfg.model.n_layers == 1 and not cfg.residual)
    return (shape and cfg.model.block == "attention"
            and cfg.model.bos == "visible" and task.single_trigger
            and task.train_trigger_min >= 2 and task.train_trigger_max > task.train_trigger_min)


def capacity_bounds(cfg: RunConfig) -> dict[str, Any]:
    """The arguments' numbers for a run's task (the proofs are in the report).

    ``position_free``: with the trigger position j uniform over the training range, every
    weights' expected squared error in each content coordinate at the trigger row is at least
    Var(1/j) / 3 (``mse_floor``), and some sequences of the training distribution err by at
    least (1/j_min - 1/j_max) / 2 there (``sup_floor``). ``fixed_weights``: some sequences with
    the trigger at j_min err by at least (j + 1) / (j (j + 3)), j = j_min (``sup_floor``).
    ``linear_stack``: some sequences err by at least 1 / (2 j_min) at row j_min, at any depth
    (``sup_floor``)."""
    task = cfg.task
    j = np.arange(task.train_trigger_min, task.train_trigger_max + 1, dtype=float)
    var = float(np.var(1 / j))  # over the uniform trigger position (population variance)
    mse_floor = var / 3  # Var(u) = 1/3 for u ~ Uniform(-1, 1)
    tol = cfg.train.tol
    lo = j[0]
    common = {"j_min": int(lo), "j_max": int(j[-1]), "tol": tol}
    return {
        "position_free": {**common, "var_inv_j": var, "mse_floor": mse_floor,
                          "rms_floor": math.sqrt(mse_floor), "sup_floor": (1 / lo - 1 / j[-1]) / 2,
                          "mse_floor_over_tol2": mse_floor / tol ** 2,
                          "content_coordinates": task.d_model - 3,
                          "sequences": CAPACITY_SEQUENCES},
        "fixed_weights": {**common, "w_best": 2 * (lo + 1) / (lo * (lo + 3)),
                          "sup_floor": (lo + 1) / (lo * (lo + 3))},
        "linear_stack": {**common, "sup_floor": 1 / (2 * lo)},
    }


def outcome(converged: int, n: int, budget: int, capacity: Capacity | None) -> str:
    """How a (configuration, rule) ended over its n seeds at the chosen learning rate: how many
    reached the stop rule (one training batch's L∞ error under the tolerance), which is not to
    say that their test or worst-case errors are under it."""
    if n and converged == n:
        return f"reached the stop rule ({n} of {n})"
    if converged:
        return f"mixed ({converged} of {n} reached the stop rule)"
    if capacity is not None:
        return "cannot express (argument in the report)"
    return f"not reached in {budget:,} steps"


def share_label(k: int, n: int) -> str:
    """'yes (n of n)', 'no (0 of n)' or 'mixed (k of n)': seeds that disagree are mixed."""
    if n and k == n:
        return f"yes ({k} of {n})"
    if k == 0:
        return f"no (0 of {n})"
    return f"mixed ({k} of {n})"


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
    """One zoo run: its summary's numbers, where its zero comes from, the model checks."""
    name = run_name(config, rule, lr, seed)
    s = ctx.summary(name)
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
        "sink_rate": s["sink_rate"],  # Gu et al., absolute, percent
        "sink_rate_relative": gu["rate"],  # relative, rows under the floor ignored, percent
        "sink_rate_relative_no_floor": s["sink_rate_relative"],
        "gu_rows_ignored": gu["rows_ignored"], "gu_rows_zero": gu["rows_zero"],
        "gu_rows": gu["rows"],
        "validation_mse": checks["validation_mse"],
        "ablated": checks["ablated"], "capacity_applies": applies,
        "capacity_mse": checks["capacity_mse"],
    }


def _score(runs: list[dict[str, Any]]) -> float:
    """The mean validation MSE of a learning rate's seeds (a diverged seed counts as inf)."""
    values = [r["validation_mse"] for r in runs]
    return float(np.mean([v if v is not None and math.isfinite(v) else math.inf
                          for v in values]))


def entry(config: str, rule: str, runs: list[dict[str, Any]], opts: ZooOptions
          ) -> dict[str, Any]:
    """One (configuration, rule): the chosen learning rate and its seeds' numbers."""
    grid = lrs(config, opts.quick)
    scores = [{"lr": lr, "validation_mse": _score([r for r in runs if r["lr"] == lr])}
              for lr in grid]
    best = min(scores, key=lambda s: s["validation_mse"])["lr"]
    chosen = [r for r in runs if r["lr"] == best]
    n, converged = len(chosen), sum(r["converged"] for r in chosen)
    argument = CAPACITY.get((config, rule))
    applies = argument is not None and all(r["capacity_applies"] for r in chosen)
    capacity = argument if applies else None
    budget = steps(config, opts.quick)
    sources = [src for r in chosen for layer in r["sources"] for src in layer]
    counts = {src: sources.count(src) for src in SOURCES if src in sources}
    k_sink = sum(r["sinks"] for r in chosen)

    def each(key: str) -> list[Any]:
        return [r[key] for r in chosen]

    return {
        "config": config, "rule": rule, "row_kind": _rules()[rule].row_kind, "lr": best,
        "validation_mse_by_lr": scores, "n": n, "converged": converged, "budget": budget,
        "outcome": outcome(converged, n, budget, capacity),
        "capacity": capacity.key if capacity else None,
        "capacity_why": capacity.why if capacity else None,
        "against_argument": bool(capacity and converged),
        "bos_sinks": k_sink, "sinks_label": share_label(k_sink, n),
        "sources": counts, "n_heads": len(sources),
        "main_source": max(counts, key=lambda src: counts[src]) if counts else None,
        "seeds": each("seed"), "steps": each("steps"), "test_linf": each("test_linf"),
        "mse": each("mse"), "bos_weight_max": each("bos_weight_max"),
        "bos_share_max_on": each("bos_share_max_on"),
        "row_sum_nontrigger": [float(np.mean(r["row_sum_nontrigger"])) for r in chosen],
        "row_sum_trigger": [float(np.mean(r["row_sum_trigger"])) for r in chosen],
        "sink_rate": each("sink_rate"), "sink_rate_relative": each("sink_rate_relative"),
        "gu_rows_ignored": sum(each("gu_rows_ignored")), "gu_rows_zero": sum(each("gu_rows_zero")),
        "gu_rows": sum(each("gu_rows")), "capacity_mse": each("capacity_mse"),
        "ablation": {key: {"intact": each(key), "ablated": [r["ablated"][key] for r in chosen]}
                     for key in ABLATION_KEYS},
    }


def protocol(opts: ZooOptions, exe: Execution) -> dict[str, Any]:
    """The settings the report quotes, read from the runs' own configs."""
    cfg = run_config("1x1", "softmax", middle_lr("1x1"), 0, opts.quick, exe.device)
    return {"beta1": cfg.train.beta1, "beta2": cfg.train.beta2,
            "batch_size": cfg.train.batch_size, "tol": cfg.train.tol,
            "steps": {c: steps(c, opts.quick) for c in CONFIGS},
            "lr_grid": {c: list(lrs(c, opts.quick)) for c in CONFIGS},
            "eval_sequences": cfg.eval.n_sequences, "eval_trigger": cfg.task.eval_trigger,
            "validation_seed": VALIDATION_SEED, "seq_len": cfg.task.seq_len,
            "d_model": cfg.task.d_model, "train_trigger_min": cfg.task.train_trigger_min,
            "train_trigger_max": cfg.task.train_trigger_max, "sink_share": SINK_SHARE,
            "gu_row_floor": GU_ROW_FLOOR, "log_every": LOG_EVERY}


def collect(ctx: Context) -> dict[str, Any]:
    opts = ctx.opts
    runs = [run_record(ctx, config, rule, lr, seed)
            for config in CONFIGS for rule in opts.rules for lr, seed in members(opts, config)]
    entries = [entry(config, rule, [r for r in runs if (r["config"], r["rule"]) == (config, rule)],
                     opts) for config in CONFIGS for rule in opts.rules]
    capacity = None
    if any(e["capacity"] for e in entries):
        capacity = capacity_bounds(run_config("1x1", "softmax", middle_lr("1x1"), 0, opts.quick,
                                              ctx.exe.device))
    return {"protocol": protocol(opts, ctx.exe), "runs": runs, "entries": entries,
            "capacity": capacity,
            "capacity_table": [{"config": c, "rule": r, "argument": a.key, "why": a.why,
                                "measured": a.measured} for (c, r), a in CAPACITY.items()]}


# -------------------------------------------------------------------------------- claims

SINKING_RULE = "softmax"  # the paper's rule, predicted to sink: the control of a "no sink" claim
# the paper's ReLU, whose rows need not sum to 1, predicted not to sink: softmax's claim's control
NON_SINKING_RULE = "relu"
# the paper's two predictions the zoo tests, pooled over 1x1 and 2x2 (Holm over the two)
PRIMARY = (f"{SINKING_RULE}.bos_sink", f"{NON_SINKING_RULE}.no_bos_sink")
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
    trained in: the parts a pooled sink claim counts ([] when it was not trained)."""
    return [(e["config"], e["bos_sinks"], e["n"]) for config in CONFIGS for e in entries
            if (e["config"], e["rule"]) == (config, rule)]


def _reached(entries: list[dict[str, Any]], rule: str) -> str:
    """How many of a pooled rule's seeds reached the stop rule, for the claim's data."""
    k = sum(e["converged"] for e in entries if e["rule"] == rule)
    return f"({k} of them reached the stop rule)"


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
            key, f"{name} seeds sink on BOS at a rate above {cl.R0:g}",
            None, None, f"sink on BOS {_reached(entries, name)}", parts=sink_parts(entries, name))

    claim = test(f"{rule}.bos_sink", rule)
    claim = replace(claim, sentence=(
        f"Softmax attention sinks on BOS: the rate of softmax seeds that {SINK_WORDS} is above "
        f"{cl.R0:g}, pooled over 1x1 (one attention layer without a residual stream, the "
        f"theorem's setting) and 2x2 (residual, the paper's multi-layer setting)"))
    return cl.with_control(claim, test(f"{control}.bos_sink", control),
                           f"{control} (rows need not sum to 1), the same configurations")


def _no_sink_claim(entries: list[dict[str, Any]], rule: str) -> Claim:
    """A rule's seeds do not sink on BOS (rate below 1 - r0), pooled over the configurations;
    the control is softmax's seeds of the same configurations through the same test."""
    kind = _rules()[rule].row_kind
    why = ESCAPE.get(kind)

    def test(key: str, name: str) -> Claim:
        return cl.rate_at_most(key, f"{name} seeds sink on BOS at a rate below {1 - cl.R0:.2g}",
                               None, None, f"sink on BOS {_reached(entries, name)}",
                               parts=sink_parts(entries, name))

    claim = test(f"{rule}.no_bos_sink", rule)
    escape = f" (it could output zero another way: {why})" if why else ""
    claim = replace(claim, sentence=(
        f"{rule} attention does not sink on BOS{escape}: the rate of {rule} seeds that sink on "
        f"BOS is below {1 - cl.R0:.2g}, pooled over 1x1 and 2x2"))
    return cl.with_control(claim, test(f"{SINKING_RULE}.no_bos_sink", SINKING_RULE),
                           f"{SINKING_RULE} (rows sum to 1, no escape), the same configurations")


def _reached_claim(e: dict[str, Any]) -> Claim:
    """How many seeds of a (configuration, rule) reached the stop rule: the protocol's outcome,
    resting on our own learning-rate choice, so descriptive (no control could test it)."""
    c, r, k, n = e["config"], e["rule"], e["converged"], e["n"]
    lo, hi = cl.clopper_pearson(k, n)
    linf = np.asarray(e["test_linf"], dtype=float)
    data = (f"{k} of {n} seeds reached the stop rule (two-sided {cl.CONFIDENCE} Clopper-Pearson "
            f"interval of the rate [{lo:.2f}, {hi:.2f}]); test L∞ error median "
            f"{np.median(linf):.2e} (range {linf.min():.2e} to {linf.max():.2e}); steps "
            f"{min(e['steps']):,} to {max(e['steps']):,}" if n else "no seeds")
    if e.get("capacity"):
        data += "; a proof in the report shows that no weights express the task here"
    return cl.descriptive(
        f"{c}.{r}.reached_stop_rule",
        f"{k} of {n} {c} {r} seeds reached the stop rule within {e['budget']:,} steps at the "
        f"learning rate chosen on validation ({e['lr']:g})",
        data, n=n, estimate=k / n if n else None, interval=(lo, hi))


def _fixed_weights_check(entries: list[dict[str, Any]], rule: str) -> Claim:
    """A rule whose weights ignore the scores cannot sink: a check of the sink measure."""
    chosen = [e for e in entries if e["rule"] == rule]
    n = sum(e["n"] for e in chosen)
    k = n - sum(e["bos_sinks"] for e in chosen)
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
    values = [v for v in e["capacity_mse"] if v is not None]
    k = sum(v >= floor for v in values)
    lowest = f" (lowest {min(values):.3g})" if values else ""
    return cl.check_all(
        f"{e['config']}.{e['rule']}.capacity_floor",
        f"The trained {e['config']} {e['rule']} models' trigger-row error on training sequences "
        f"(MSE over the content coordinates) is at or above the floor Var(1/j)/3 = {floor:.3g} "
        f"that the argument proves for any weights (a check of its numbers)",
        k, len(values), f"seeds are at or above the floor{lowest}")


def claims(records: dict[str, Any], opts: ZooOptions) -> list[Claim]:
    """The zoo's claims: the paper's two predictions (softmax sinks on BOS; the paper's ReLU
    does not), primary and pooled over 1x1 and 2x2, each with the other rule as its control;
    whether each other rule's seeds avoid a BOS sink (softmax's seeds as the control); how many
    seeds reached the stop rule (descriptive); and the checks: a rule whose weights ignore the
    scores cannot sink, and the trained models stay above the proven capacity floor."""
    entries = records["entries"]
    rules = list(dict.fromkeys(e["rule"] for e in entries))
    fixed = fixed_weight_rules()
    out: list[Claim] = [_sinks_claim(entries, rules), _no_sink_claim(entries, NON_SINKING_RULE)]
    for rule in rules:
        if rule in (SINKING_RULE, NON_SINKING_RULE):
            continue
        out.append(_fixed_weights_check(entries, rule) if rule in fixed
                   else _no_sink_claim(entries, rule))
    out += [_reached_claim(e) for e in entries]
    bounds = records["capacity"]
    if bounds is not None:
        floor = bounds[POSITION_FREE.key]["mse_floor"]
        out += [_capacity_check(e, floor) for e in entries if e["capacity"] == POSITION_FREE.key]
    return out


def relabel(records: dict[str, Any], opts: ZooOptions) -> dict[str, Any]:
    """The records with each entry's outcome label written again from its counts (``outcome``),
    so that a report rendered from older records says "reached the stop rule" as the code does;
    nothing else changes."""
    entries = []
    for e in records["entries"]:
        argument = CAPACITY.get((e["config"], e["rule"]))
        capacity = argument if argument is not None and e["capacity"] == argument.key else None
        entries.append({**e, "outcome": outcome(e["converged"], e["n"], e["budget"], capacity)})
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
        ax.set_ylabel("share of heads (the chosen rate's seeds)")
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
        ax.set_title(f"{config}: per seed, at the chosen learning rate", fontsize=9)
        ax.legend(fontsize=7)


FIGURES = (
    FigureSpec("fig_zoo_sources", _draw_sources, grid=(1, 2), size=(6.0, 4.2)),
    FigureSpec("fig_zoo_bos", _draw_bos, grid=(1, 2), size=(6.0, 4.2)),
)


STUDY = Study(
    name="zoo",
    title="Zoo: which attention rules need a sink",
    help="every attention rule on the task, 1x1 and 2x2, with a shared learning-rate grid",
    description="Train every attention rule (or --rules) 1x1 and 2x2 with the same budget over "
                "a shared learning-rate grid, keep the rate with the lowest validation MSE per "
                "rule, and report how each rule ends, where its \"output zero\" comes from, "
                "whether it sinks on BOS and what hiding BOS does, with the claims decided by "
                "stated tests. Writes runs, figures, records.json, claims.csv, entries.csv, "
                "runs.csv and ZOO.md. Rerunning with the same --out resumes: finished runs are "
                "kept.",
    options=ZooOptions, template="zoo.md.j2", collect=collect, cells=cells, claims=claims,
    figures=FIGURES, tables=("entries", "runs"), report="ZOO.md",
    docs_example="docs/zoo.md", default_out="results/zoo", primary=PRIMARY, complete=relabel)

"""``sinklab reproduce``: the paper's experiments on many seeds, decided claim by claim.

Trains 1x1, 2x2 and 4x4 models with softmax and ReLU attention under the paper's protocol into
``runs/{1x1,2x2,4x4}_{softmax,relu}_seed{s}/``, then records every run's numbers, summarises the
heads of each layer by statistics that do not depend on head order (heads are interchangeable
between seeds), and decides the paper's claims with stated tests (``sinklab.claims``).

This module is the study's declaration (its options, its runs and ``STUDY``), light enough for
the help texts; what is read from the runs, the claims and the figures are in
``sinklab.studies.reproduce_analysis``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from sinklab import heavy, stats
from sinklab.config import EXPERIMENTS, RunConfig, build_run_config, check_count
from sinklab.runs import limits
from sinklab.studies.options import named
from sinklab.studies.study import Cell, Execution, Study

RULES = ("softmax", "relu")
# quick caps multi-layer runs here: they need thousands of steps and only pass through the
# machinery, while the 1x1 runs (about 800 steps) reach the stop rule and show the effect
QUICK_MAX_STEPS = 500
# the primary claim: softmax models sink at a higher rate than ReLU models, pooled over
# EXPERIMENTS: one contrast, said once (not a claim per rule with the other rule as control)
CONTRAST = "sinks.softmax_vs_relu"
PRIMARY = (CONTRAST,)
MAX_DEFAULT_SEEDS = 10  # the default never trains more than this per configuration


def agreeing_p(seeds: int, n_configurations: int = len(EXPERIMENTS)) -> float:
    """The exact stratified p-value of the contrast when every seed agrees (every softmax seed
    sinks, no ReLU seed does) on ``seeds`` of each rule in each of ``n_configurations``.

    Each configuration's table is then as extreme as its margins allow, so the p-value is the
    product of each table's hypergeometric chance of it, 1 / C(2s, s): what
    `sinklab.stats.stratified_exact_p` computes for these tables (a test checks that they
    agree), here without scipy so that the help texts stay light."""
    return float(math.comb(2 * seeds, seeds)) ** -n_configurations


def decisive_seeds(n_primary: int = len(PRIMARY), n_configurations: int = len(EXPERIMENTS)
                   ) -> int:
    """The fewest seeds per configuration at which, if every seed reaches the stop rule and
    agrees, one stratified contrast pooling ``n_configurations`` configurations is supported at
    its Holm level among ``n_primary`` primary claims (p below ALPHA / n_primary, the level of
    the last of equal p-values) with at least ``stats.MIN_N`` seeds of each rule pooled, capped
    at ``MAX_DEFAULT_SEEDS`` (which it is when no number up to it would do)."""
    level = stats.ALPHA / n_primary
    for seeds in range(1, MAX_DEFAULT_SEEDS + 1):
        if (seeds * n_configurations >= stats.MIN_N
                and agreeing_p(seeds, n_configurations) < level):
            return seeds
    return MAX_DEFAULT_SEEDS


DEFAULT_SEEDS, QUICK_SEEDS = decisive_seeds(), 1


@dataclass
class ReproduceOptions:
    """What ``sinklab reproduce`` trains; checked on creation."""

    seeds: int | None = field(default=None, metadata={
        "help": f"seeds per configuration (default: {DEFAULT_SEEDS}, the fewest, up to "
                f"{MAX_DEFAULT_SEEDS}, at which the primary contrast (softmax against ReLU), "
                f"pooling the {len(EXPERIMENTS)} configurations, is decided when every seed "
                f"reaches the stop rule and agrees: it needs {stats.MIN_N} seeds of each rule "
                f"pooled and an exact stratified p below {stats.ALPHA / len(PRIMARY):g}, and "
                f"{DEFAULT_SEEDS} of each give p = {agreeing_p(DEFAULT_SEEDS):.2g}; "
                f"{QUICK_SEEDS} with --quick)",
        "metavar": "N"})
    quick: bool = field(default=False, metadata={
        "help": f"smoke test, under half a minute on two idle cores: {QUICK_SEEDS} seed, "
                f"multi-layer runs capped at {QUICK_MAX_STEPS} steps"})

    def __post_init__(self) -> None:
        if self.seeds is None:
            self.seeds = QUICK_SEEDS if self.quick else DEFAULT_SEEDS
        check_count(named(self, "seeds"), self.seeds)
        # the size limit, from the count alone (before any cell is built)
        limits.check_cells(self.seeds * len(EXPERIMENTS) * len(RULES),
                           f"{named(self, 'seeds')} {self.seeds}")


def run_config(experiment: str, rule: str, seed: int, opts: ReproduceOptions,
               device: str) -> RunConfig:
    """The paper protocol for one run (quick caps multi-layer runs' steps)."""
    layers, heads = EXPERIMENTS[experiment]
    train: dict[str, Any] = {"seed": seed, "device": device}
    if opts.quick and layers > 1:
        train["max_steps"] = QUICK_MAX_STEPS
    return build_run_config({"model": {"attention": rule, "n_layers": layers, "n_heads": heads},
                             "train": train})


def run_name(experiment: str, rule: str, seed: int) -> str:
    return f"runs/{experiment}_{rule}_seed{seed}"


def cells(opts: ReproduceOptions, exe: Execution) -> list[Cell]:
    """Every (configuration, rule, seed). Every seed of a (configuration, rule) shares one
    ensemble, except the big models on a CPU: a 4x4 step is arithmetic-bound there, so an
    ensemble saves nothing, and one job per seed balances the worker processes better. On a
    GPU the seeds of a 4x4 configuration train as one ensemble on the device too."""
    train = heavy("train")

    on_cpu = train.resolve_device(exe.device, "--device").type == "cpu"
    out = []
    for experiment, (layers, heads) in EXPERIMENTS.items():
        for rule in RULES:
            for seed in range(opts.seeds):
                out.append(Cell(run_name(experiment, rule, seed),
                                run_config(experiment, rule, seed, opts, exe.device),
                                group=(experiment, rule), label=f"{experiment} {rule}",
                                chunk=1 if on_cpu and layers * heads > 4 else None))
    return out


STUDY = Study(
    name="reproduce",
    title="sinklab reproduction report",
    help="reproduce the paper: 1x1, 2x2, 4x4, softmax and ReLU, several seeds",
    description="Train 1x1, 2x2 and 4x4 models with softmax and ReLU attention under the "
                "paper's protocol on several seeds (by default the fewest that can decide its "
                "primary contrast; see --seeds), summarise their heads by order-invariant "
                "statistics, and decide the paper's claims with stated tests. Writes runs, "
                "figures, records.json, claims.csv and REPORT.md. Rerunning with the same --out "
                "resumes: finished runs are kept.",
    options=ReproduceOptions, analysis="sinklab.studies.reproduce_analysis",
    template="reproduce.md.j2", cells=cells, primary=PRIMARY,
    tables=("runs", "groups", "layers"), bulk=("maps",),
    docs_example="docs/reproduction.md", default_out="results/reproduce")

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
SINKS, NO_SINK = "softmax.sinks", "relu.no_sink"  # the primary claims, pooled over EXPERIMENTS
PRIMARY = (SINKS, NO_SINK)
MAX_DEFAULT_SEEDS = 10  # the default never trains more than this per configuration


def decisive_seeds(n_primary: int = len(PRIMARY), n_configurations: int = len(EXPERIMENTS)
                   ) -> int:
    """The fewest seeds per configuration at which, if every seed reaches the stop rule and
    agrees, each of ``n_primary`` rate claims pooling ``n_configurations`` configurations is
    decided at its Holm-corrected level (at least ``stats.MIN_N`` pooled, too), capped at
    ``MAX_DEFAULT_SEEDS``. Each claim's control, the other rule on as many seeds, is judged
    uncorrected, so it is decided by then as well."""
    pooled = stats.seeds_all_agreeing(n_primary)
    if pooled is None:  # beyond stats.MAX_SEEDS: no default decides them; train the most
        return MAX_DEFAULT_SEEDS
    return min(MAX_DEFAULT_SEEDS, math.ceil(max(pooled, stats.MIN_N) / n_configurations))


DEFAULT_SEEDS, QUICK_SEEDS = decisive_seeds(), 1


@dataclass
class ReproduceOptions:
    """What ``sinklab reproduce`` trains; checked on creation."""

    seeds: int | None = field(default=None, metadata={
        "help": f"seeds per configuration (default: {DEFAULT_SEEDS}, the fewest, up to "
                f"{MAX_DEFAULT_SEEDS}, at which the {len(PRIMARY)} primary claims, pooling the "
                f"{len(EXPERIMENTS)} configurations, are decided when every seed reaches the "
                f"stop rule and agrees: under Holm's correction they need "
                f"{stats.seeds_all_agreeing(len(PRIMARY))} seeds in all; {QUICK_SEEDS} with "
                "--quick)",
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
                "primary claims; see --seeds), summarise their heads by order-invariant "
                "statistics, and decide the paper's claims with stated tests. Writes runs, "
                "figures, records.json, claims.csv and REPORT.md. Rerunning with the same --out "
                "resumes: finished runs are kept.",
    options=ReproduceOptions, analysis="sinklab.studies.reproduce_analysis",
    template="reproduce.md.j2", cells=cells, primary=PRIMARY,
    tables=("runs", "groups", "layers"), bulk=("maps",),
    docs_example="docs/reproduction.md", default_out="results/reproduce")

"""``sinklab theory``: the paper's theorem checked numerically, every verdict a stated test.

Constructions (an exact ReLU solution with no sink, the softmax sink family); worst-case errors
of trained 1x1 models over every input, attacked and certified, with ReLU's zero rows certified
and the necessity bound of docs/theory.md checked at every saved checkpoint
(``studies.bounds``); 1x1 models trained to a plateau with their sink denied; 2x2 and 4x4 stacks
with plain targets, the theorem's multi-layer setting (``studies.stacks``); the error-BOS
frontier of the reproduction's models and what the heads of 4x4 softmax models write at
non-trigger rows. Writes into its own folder (``--out``) only::

    denied/{rule}_{setting}_seed{s}/    1x1 runs with BOS removed or its share capped
    frontier/{rule}_seed{s}/            1x1 runs of the paper's protocol with checkpoints/
    plain/{2x2,4x4}_{rule}_seed{s}/     stacks with plain targets, no residual stream
    plain-grid/{shape}_{rule}_std{v}_lr{v}_seed{s}/  their protocol search
    runs/{1x1,2x2,4x4}_{rule}_seed{s}/  the reproduction's runs, trained here only without
                                        --reproduce (the names and configs of
                                        ``sinklab reproduce``, from ``studies.reproduction``)
    cache/                              the attacks and certificates, kept per settings
    figures/, records.json, claims.csv, one CSV per table, THEORY.md

With ``--reproduce DIR`` the frontier and the heads come from DIR, a finished ``sinklab
reproduce`` folder that is only read (never locked or written). Rerunning with the same ``--out``
keeps every finished run, and the cached measurements.

    sinklab theory --reproduce results/reproduce --out results/theory
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from sinklab import claims as cl
from sinklab.claims import Claim
from sinklab.config import check_count
from sinklab.definitions import SINK_HEAD_THRESHOLD
from sinklab.errors import ConfigError, ResultsError
from sinklab.runs import folders, limits
from sinklab.runs.files import read_log
from sinklab.studies import reproduction
from sinklab.studies.base import (
    Cell,
    Context,
    Execution,
    FigureSpec,
    Study,
    named,
    read_records,
)
from sinklab.theory import verdicts

RULES = ("softmax", "relu")
GAPS = tuple(float(c) for c in range(0, 17))  # logit gaps of the softmax sink family
RELU_SIZES = ((4, 4), (5, 7), (16, 16), (33, 12), (64, 32), (128, 64))  # (seq_len, d_model)
DEFAULT_SEEDS, QUICK_SEEDS = 3, 1  # quick: one model per rule to certify, within ~2 minutes
DENIED_STEPS = 10_000  # the denied-sink runs' step cap; they stop earlier on a plateau
QUICK_DENIED_STEPS = 1200
PLAIN_STEPS, QUICK_PLAIN_STEPS = 30_000, 100  # step caps of the plain multi-layer stacks
SAVE_EVERY, QUICK_SAVE_EVERY = 50, 250  # checkpoint interval of the frontier runs
CERTIFY_SECONDS, QUICK_CERTIFY_SECONDS = 30.0, 2.0  # time cap of one model's certificate
ATTACK_STEPS, QUICK_ATTACK_STEPS = 100, 20  # projected-gradient steps of the attacks
ATTACK_RESTARTS = 8  # random starts per (trigger, row) of the attacks on final models
CHECKPOINT_ATTACK_STEPS = 30  # the cheap attack at every checkpoint (trigger at L - 1)
DENIED_RESTARTS = 4  # random starts per (trigger, row) of the attacks on denied-sink runs
WORST_GAPS, QUICK_WORST_GAPS = GAPS[::2], (4.0, 12.0)  # family gaps certified (a slope needs 2)
QUICK_EPS = (0.01, 0.1)  # quick: a cap where one layer could still solve it, and one where not
QUICK_PLAIN_RESTARTS = 1  # quick: the attack on the plain stacks (100 steps: a smoke test)
HEAD_SEQUENCES, QUICK_HEAD_SEQUENCES = 1000, 200  # test sequences of the head measurements

# The bounds and levels the claims are decided at (the report quotes them from the records).
RELU_BOUND = {"float64": 1e-12, "float32": 1e-5}  # largest error an "exact" construction may have
FAMILY_SLOPE = 1.0  # error proportional to the mass off BOS: log-log slope 1
FAMILY_SLOPE_TOL = 0.1
FRONTIER_LOW = verdicts.ERROR_BINS[-1][1]  # a checkpoint has "low error" below this batch L∞
FRONTIER_MIN_RANGE = 0.1  # a rank correlation needs the max BOS mass to span more than this
CONSTANT_SHARE = 0.5  # "most of what a head writes is a constant": its share of the squares
CANCEL_SHARE = 0.01  # "cancels": the output keeps at most this share of the stream's excursion
IDENTITY_REL = 1e-3  # two float32 paths to the same error agree to this relative difference
HEAD_FIGURE_SEEDS = 4  # seeds drawn in the head figure (every seed is in the records)

# The theorem's predictions this study tests, named before it runs and corrected together (Holm):
# denying the sink keeps a softmax model from the stop rule; at low error a softmax model has a
# sink; a plain-target softmax stack (the theorem's multi-layer setting) that reaches the stop
# rule has a sink head.
PRIMARY = ("denied.softmax.reaches_stop", "frontier.softmax.low_error_needs_sink",
           "plain.softmax.some_head_sinks")


@dataclass
class TheoryOptions:
    """What ``sinklab theory`` computes and trains; checked on creation."""

    seeds: int | None = field(default=None, metadata={
        "help": f"seeds of each denied-sink setting, of the 1x1 frontier runs and of the plain "
                f"stacks, and of the reproduction it trains without --reproduce (default: "
                f"{DEFAULT_SEEDS}; {QUICK_SEEDS} with --quick); a rate claim with every seed "
                f"agreeing needs {cl.seeds_all_agreeing(1)} seeds alone and "
                f"{cl.seeds_all_agreeing(len(PRIMARY))} as one of this study's {len(PRIMARY)} "
                "primary claims (the denied-sink claims pool every setting's seeds)",
        "metavar": "N"})
    steps: int | None = field(default=None, metadata={
        "help": f"step cap of the denied-sink runs, which stop earlier on a plateau (no new "
                f"best training-batch L∞ in {verdicts.PLATEAU_PATIENCE} steps) (default: "
                f"{DENIED_STEPS}; {QUICK_DENIED_STEPS} with --quick)", "metavar": "N"})
    plain_steps: int | None = field(default=None, metadata={
        "help": f"step cap of the 2x2 and 4x4 stacks trained with plain targets, which stop "
                f"earlier on the same plateau after {verdicts.PLAIN_LR_DROPS} drops of the "
                f"learning rate; their protocol search's cap is the smaller of this and "
                f"{verdicts.PLAIN_GRID_STEPS} (default: {PLAIN_STEPS}; {QUICK_PLAIN_STEPS} with "
                "--quick)", "metavar": "N"})
    plain_grid_seeds: int | None = field(default=None, metadata={
        "help": f"seeds 0..N-1 of the plain stacks' protocol search, which trains every initial "
                f"weight scale in {', '.join(f'{v:g}' for v in verdicts.PLAIN_GRID_STD)} with "
                f"every learning rate in {', '.join(f'{v:g}' for v in verdicts.PLAIN_GRID_LR)}"
                f" per shape and rule, N at most {verdicts.PLAIN_GRID_SEEDS}; 0: no search "
                f"(default: {verdicts.PLAIN_GRID_SEEDS}; {verdicts.QUICK_PLAIN_GRID_SEEDS} with "
                f"--quick). The plain stacks the claims read use seeds "
                f"{verdicts.PLAIN_FIRST_SEED} on, none of the search's", "metavar": "N"})
    save_every: int | None = field(default=None, metadata={
        "help": f"save the 1x1 frontier runs' weights every N steps, for the checkpoint checks "
                f"(default: {SAVE_EVERY}; {QUICK_SAVE_EVERY} with --quick)", "metavar": "N"})
    attack_steps: int | None = field(default=None, metadata={
        "help": f"projected-gradient steps of the worst-case attacks (default: {ATTACK_STEPS}; "
                f"{QUICK_ATTACK_STEPS} with --quick)", "metavar": "N"})
    certify_seconds: float | None = field(default=None, metadata={
        "help": f"time cap of one model's certified bound, in seconds; the report gives the gap "
                f"left when it is reached (default: {CERTIFY_SECONDS:g}; "
                f"{QUICK_CERTIFY_SECONDS:g} with --quick)", "metavar": "S"})
    eps: tuple[float, ...] | None = field(default=None, metadata={
        "help": "BOS share caps 1 - eps to train with, each eps in (0, 1) (default: "
                f"{','.join(f'{e:g}' for e in verdicts.DENIED_EPS)}; "
                f"{','.join(f'{e:g}' for e in QUICK_EPS)} with --quick)", "metavar": "E1,E2,..."})
    reproduce: Path | None = field(default=None, metadata={
        "help": "a finished `sinklab reproduce` folder whose runs the frontier and the head "
                "measurements read (only read; default: train the reproduction's runs in this "
                "study's own folder, under runs/)", "metavar": "DIR"})
    seq_len: int = field(default=16, metadata={
        "help": "sequence length of the softmax family, also checked for the ReLU "
                "construction (default: 16; at least 4)", "metavar": "N"})
    d_model: int = field(default=16, metadata={
        "help": "width of both constructions (default: 16; at least 4)", "metavar": "N"})
    quick: bool = field(default=False, metadata={
        "help": f"smoke test, about a minute on two idle cores: {QUICK_SEEDS} seed (one 1x1 "
                "softmax and one ReLU model attacked and certified, the sink it forces bounded), "
                f"denied-sink runs of {QUICK_DENIED_STEPS} steps at eps "
                f"{','.join(f'{e:g}' for e in QUICK_EPS)}, plain stacks of "
                f"{QUICK_PLAIN_STEPS} steps without their protocol search, a quick "
                "reproduction"})

    def __post_init__(self) -> None:
        # torch: not for the help texts
        from sinklab.theory import constructions as theory

        if self.seeds is None:
            self.seeds = QUICK_SEEDS if self.quick else DEFAULT_SEEDS
        check_count(named(self, "seeds"), self.seeds)
        for name, value in (("seq_len", self.seq_len), ("d_model", self.d_model)):
            if not (isinstance(value, int) and value >= 4):
                raise ConfigError(f"{named(self, name)}={value!r} is not allowed: the "
                                  "constructions need an integer >= 4 (BOS, trigger, content "
                                  "and bias flag).")
        for name, full, quick in (("steps", DENIED_STEPS, QUICK_DENIED_STEPS),
                                  ("plain_steps", PLAIN_STEPS, QUICK_PLAIN_STEPS),
                                  ("save_every", SAVE_EVERY, QUICK_SAVE_EVERY),
                                  ("attack_steps", ATTACK_STEPS, QUICK_ATTACK_STEPS)):
            if getattr(self, name) is None:
                setattr(self, name, quick if self.quick else full)
            check_count(named(self, name), getattr(self, name))
        from sinklab.theory import attack  # torch: not for the help texts

        attack.check_budget(named(self, "attack_steps"), self.attack_steps, attack.MAX_STEPS)
        if self.plain_grid_seeds is None:
            self.plain_grid_seeds = verdicts.QUICK_PLAIN_GRID_SEEDS if self.quick \
                else verdicts.PLAIN_GRID_SEEDS
        grid_seeds = self.plain_grid_seeds
        if not (isinstance(grid_seeds, int) and not isinstance(grid_seeds, bool)
                and 0 <= grid_seeds <= verdicts.PLAIN_GRID_SEEDS):
            raise ConfigError(f"{named(self, 'plain_grid_seeds')}={grid_seeds!r} is not "
                              f"allowed: it must be an integer in 0..{verdicts.PLAIN_GRID_SEEDS} "
                              f"(the search's seeds come before the plain stacks' seed "
                              f"{verdicts.PLAIN_FIRST_SEED}).")
        if self.certify_seconds is None:
            self.certify_seconds = QUICK_CERTIFY_SECONDS if self.quick else CERTIFY_SECONDS
        if not (isinstance(self.certify_seconds, (int, float))
                and not isinstance(self.certify_seconds, bool)
                and 0 < self.certify_seconds <= 3600):
            raise ConfigError(f"{named(self, 'certify_seconds')}={self.certify_seconds!r} is "
                              "not allowed: it must be a number of seconds in (0, 3600].")
        if self.eps is None:
            self.eps = QUICK_EPS if self.quick else verdicts.DENIED_EPS
        self.eps = tuple(self.eps)
        eps_given = named(self, "eps")
        if not self.eps:
            raise ConfigError(f"{eps_given} needs at least one value in (0, 1).")
        for eps in self.eps:
            if not 0 < eps < 1:
                raise ConfigError(f"{eps_given} value {eps!r} is not allowed: every eps must lie "
                                  "in (0, 1), the BOS share being capped at 1 - eps.")
        if len(set(self.eps)) != len(self.eps):
            twice = next(e for e in self.eps if self.eps.count(e) > 1)
            raise ConfigError(f"{eps_given} lists {twice!r} twice; give each cap once.")
        own = len(RULES) * (len(theory.denied_settings(self.eps)) + 1) \
            + len(verdicts.PLAIN_EXPERIMENTS) * len(verdicts.PLAIN_RULES)
        trained = len(reproduction.EXPERIMENTS) * len(reproduction.RULES) \
            if self.reproduce is None else 0
        grid = len(verdicts.grid_runs(self.plain_grid_seeds))
        limits.check_cells(self.seeds * (own + trained) + grid,
                           f"{named(self, 'seeds')} {self.seeds}")

    def reproduce_options(self) -> reproduction.ReproduceOptions:
        """The reproduction this study trains itself when no --reproduce folder is given."""
        return reproduction.ReproduceOptions(seeds=self.seeds, quick=self.quick)


# ------------------------------------------------------------------------------- cells


def denied_name(rule: str, setting: str, seed: int) -> str:
    return f"denied/{rule}_{setting}_seed{seed}"


def cells(opts: TheoryOptions, exe: Execution) -> list[Cell]:
    """The denied-sink runs (one ensemble of seeds per rule and setting), and without
    --reproduce the reproduction's runs under their own names."""
    # torch: not for the help texts
    from sinklab.theory import constructions as theory

    out = [Cell(denied_name(rule, setting, seed),
                theory.denied_config(rule, setting, eps, seed, opts.steps, exe.device),
                group=("denied", rule, setting), label=f"denied 1x1 {rule} {setting}")
           for rule in RULES for setting, eps in theory.denied_settings(opts.eps)
           for seed in range(opts.seeds)]
    out += frontier_cells(opts.seeds, opts.save_every, exe)
    out += plain_cells(opts.seeds, opts.plain_steps, exe)
    out += grid_cells(opts.plain_grid_seeds, opts.plain_steps, exe)
    if opts.reproduce is None:
        out += reproduction.cells(opts.reproduce_options(), exe)
    return out


def frontier_cells(seeds: int, save_every: int, exe: Execution) -> list[Cell]:
    """The 1x1 runs of the paper's protocol whose checkpoints the worst-case section reads."""
    # torch: not for the help texts
    from sinklab.theory import bounds

    return [Cell(bounds.frontier_name(rule, s),
                 bounds.frontier_config(rule, s, save_every, exe.device),
                 group=("frontier", rule), label=f"1x1 {rule} with checkpoints")
            for rule in verdicts.RULES for s in range(seeds)]


def plain_cells(seeds: int, max_steps: int, exe: Execution) -> list[Cell]:
    """Every (experiment, rule, seed), seeds from ``PLAIN_FIRST_SEED`` (fresh: the protocol
    search uses the ones before); one ensemble of seeds per experiment and rule."""
    # torch: not for the help texts
    from sinklab.theory import stacks

    first = verdicts.PLAIN_FIRST_SEED
    return [Cell(stacks.plain_name(e, rule, seed),
                 stacks.plain_config(e, rule, seed, max_steps, exe.device),
                 group=("plain", e, rule), label=f"plain {e} {rule}")
            for e in verdicts.PLAIN_EXPERIMENTS for rule in verdicts.PLAIN_RULES
            for seed in range(first, first + seeds)]


def grid_cells(seeds: int, max_steps: int, exe: Execution) -> list[Cell]:
    """The protocol search: every (experiment, rule, init_std, lr) on seeds 0..seeds-1, at a
    constant rate and a step cap of at most ``PLAIN_GRID_STEPS``; one ensemble per experiment,
    rule and init_std (its learning rates and seeds)."""
    # torch: not for the help texts
    from sinklab.theory import stacks

    steps = min(max_steps, verdicts.PLAIN_GRID_STEPS)
    return [Cell(stacks.grid_name(e, rule, std, lr, seed),
                 stacks.plain_config(e, rule, seed, steps, exe.device, (std, lr), lr_drops=0),
                 group=("plain-grid", e, rule, std), label=f"plain search {e} {rule} std {std:g}")
            for e, rule, std, lr, seed in verdicts.grid_runs(seeds)]


def construction_bytes(opts: TheoryOptions) -> int:
    """Memory of the largest construction check (the ReLU construction's test set in float64,
    the softmax family's)."""
    # torch: not for the help texts
    from sinklab.theory import constructions as theory

    sizes = [*RELU_SIZES, (opts.seq_len, opts.d_model)]
    return max([limits.forward_bytes(theory.construction_config("softmax", n, d), 256,
                                     itemsize=8) for n, d in sizes]
               + [limits.forward_bytes(theory.construction_config("softmax", opts.seq_len,
                                                                  opts.d_model), 2000,
                                       itemsize=8)])


def check_reproduce(rdir: Path) -> dict[str, Any]:
    """The records of ``rdir``, a finished reproduce folder that no process is writing, whose
    every run has finished; one sentence (ResultsError) otherwise. Reads only."""
    rdir = Path(rdir)
    hint = f"run `sinklab reproduce --out {rdir}` first, or leave out --reproduce"
    if not rdir.exists():
        raise ResultsError(f"--reproduce {rdir} is not a finished reproduce folder: it does not "
                           f"exist ({hint}).")
    if not rdir.is_dir():
        raise ResultsError(f"--reproduce {rdir} is a file, not a reproduce folder.")
    if folders.kind_of(rdir) != "reproduce":
        raise ResultsError(f"--reproduce {rdir} is not a sinklab reproduce folder (its "
                           f"{folders.MARKER} does not say so).")
    if (holder := folders.writer(rdir)) is not None:
        raise ResultsError(f"--reproduce {rdir} is being written by {holder}; wait for it to "
                           "finish, then run this command again.")
    result = read_records(rdir, "reproduce")
    for run in result["records"]["runs"]:
        path = rdir / reproduction.run_name(run["experiment"], run["rule"], run["seed"])
        if not folders.check_complete(path):
            raise ResultsError(f"{path} has not finished; run `sinklab reproduce --out {rdir}` "
                               "again to finish it.")
    return result


def check(opts: TheoryOptions, exe: Execution, out: Path) -> None:
    """Before anything is written: the constructions fit in memory, --reproduce is usable and
    --out is not inside it (a study writes only into its own folder)."""
    limits.check_memory(construction_bytes(opts), f"checking the constructions at --seq-len "
                        f"{opts.seq_len} and --d-model {opts.d_model}")
    if opts.reproduce is not None:
        check_reproduce(opts.reproduce)
        rdir, target = Path(opts.reproduce).resolve(), Path(out).resolve()
        if target == rdir or rdir in target.parents:
            raise ResultsError(f"--out {out} is inside the --reproduce folder {opts.reproduce}, "
                               "which this study only reads; choose an --out outside it.")


# ----------------------------------------------------------------------------- records


def _values(rows: list[dict[str, Any]], key: str) -> list[float]:
    return [float(r[key]) for r in rows if r[key] is not None and np.isfinite(r[key])]


def denied_records(ctx: Context) -> list[dict[str, Any]]:
    """One row per denied-sink run: reached the stop rule?, its best training-batch errors
    over the logged checkpoints, its test errors and BOS mass."""
    # torch: not for the help texts
    from sinklab.theory import constructions as theory

    rows = []
    for rule in RULES:
        for setting, eps in theory.denied_settings(ctx.opts.eps):
            for seed in range(ctx.opts.seeds):
                name = denied_name(rule, setting, seed)
                summary = ctx.summary(name)
                best = theory.floor(read_log(ctx.out / name / "metrics.jsonl"))
                rows.append({
                    "rule": rule, "setting": setting, "eps": eps, "seed": seed,
                    "converged": summary["converged"], "status": summary["status"],
                    "steps": summary["steps"], "best_train_linf": best["best_linf"],
                    "best_train_mse": best["best_mse"], "test_linf": summary["linf_error"],
                    "test_mse": summary["mse"],
                    "bos_mass_nontrigger": summary["bos_mass_nontrigger"][0][0],
                })
    return rows


def denied_settings(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per rule and setting, over seeds: how many reached the stop rule, and the errors."""
    out = []
    for rule in RULES:
        for setting in dict.fromkeys(r["setting"] for r in rows):
            sel = [r for r in rows if r["rule"] == rule and r["setting"] == setting]
            best = _values(sel, "best_train_linf")
            eps = sel[0]["eps"]
            out.append({
                "rule": rule, "setting": setting, "eps": eps, "n": len(sel),
                "converged": sum(r["converged"] for r in sel),
                "best_train_linf": best, "best_train_mse": _values(sel, "best_train_mse"),
                "best_over_eps": [b / eps for b in best] if eps else None,
                "test_linf": _values(sel, "test_linf"),
                "bos_mass_nontrigger": _values(sel, "bos_mass_nontrigger"),
            })
    return out


def reproduction_runs(ctx: Context) -> tuple[Path, list[dict[str, Any]], dict[str, Any]]:
    """Where the reproduction's runs are, which runs (experiment, rule, seed, converged) and
    what it was run with (seeds, quick, and the --reproduce folder or None)."""
    opts = ctx.opts
    if opts.reproduce is not None:
        result = check_reproduce(opts.reproduce)  # again: it may have changed meanwhile
        runs = [{k: r[k] for k in ("experiment", "rule", "seed", "converged")}
                for r in result["records"]["runs"]]
        return Path(opts.reproduce), runs, {
            "folder": str(opts.reproduce), "seeds": result["options"]["seeds"],
            "quick": result["options"]["quick"], "command": result["meta"]["command"]}
    runs = []
    for e in reproduction.EXPERIMENTS:
        for r in reproduction.RULES:
            for s in range(opts.seeds):
                summary = ctx.summary(reproduction.run_name(e, r, s))
                runs.append({"experiment": e, "rule": r, "seed": s,
                             "converged": summary["converged"]})
    return ctx.out, runs, {"folder": None, "seeds": opts.seeds, "quick": opts.quick,
                           "command": None}


def _low_error(points: list[dict[str, float]]) -> list[dict[str, float]]:
    return [p for p in points if p["train_linf"] < FRONTIER_LOW]


def frontier_records(rdir: Path, runs: list[dict[str, Any]]
                     ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Every logged checkpoint of every reproduction run as (training-batch L∞, min and max
    non-trigger BOS mass over heads), and per (experiment, rule) their summary."""
    # torch: not for the help texts
    from sinklab.theory import constructions as theory

    per_run = []
    for run in runs:
        path = rdir / reproduction.run_name(run["experiment"], run["rule"], run["seed"])
        points = theory.frontier_points(read_log(path / "metrics.jsonl"))
        low = _low_error(points)
        per_run.append({**run, "points": points, "n_low": len(low),
                        "n_low_sink": sum(p["bos_max"] >= SINK_HEAD_THRESHOLD for p in low)})
    groups = []
    for e in reproduction.EXPERIMENTS:
        for rule in reproduction.RULES:
            sel = [r for r in per_run if r["experiment"] == e and r["rule"] == rule]
            if not sel:
                continue
            every = [p for r in sel for p in r["points"]]
            low = _low_error(every)
            groups.append({
                "experiment": e, "rule": rule, "n_runs": len(sel),
                **theory.frontier_summary(every, min_bos_range=FRONTIER_MIN_RANGE),
                "n_low": len(low),
                "low_bos_max_min": min((p["bos_max"] for p in low), default=None),
                "low_bos_max_max": max((p["bos_max"] for p in low), default=None),
            })
    return per_run, groups


def head_records(rdir: Path, runs: list[dict[str, Any]], n_sequences: int
                 ) -> list[dict[str, Any]]:
    """What every head of every 4x4 softmax reproduction model writes at non-trigger rows,
    split into its constant and its variation (``theory.head_split``)."""
    # torch: not for the help texts
    import torch

    from sinklab.theory import constructions as theory
    from sinklab.train import load_model

    found = []
    for run in runs:
        if run["experiment"] != "4x4" or run["rule"] != "softmax":
            continue
        cfg, model = load_model(rdir / reproduction.run_name("4x4", "softmax", run["seed"]))
        batch = theory.all_triggers_batch(cfg, n_sequences, seed=0, dtype=torch.float32)
        found.append({"seed": run["seed"], "converged": run["converged"],
                      **theory.head_split(model, batch)})
    return found


def constant_share(entry: dict[str, Any]) -> float:
    """The share of the summed squares of a model's head outputs that is their constant part:
    sum of const^2 over every head / sum of rms^2."""
    heads = [h for layer in entry["layers"] for h in layer["heads"]]
    total = sum(h["rms"] ** 2 for h in heads)
    return sum(h["const"] ** 2 for h in heads) / total if total > 0 else float("nan")


def excursion(entry: dict[str, Any]) -> float:
    """How far the layers move the stream at non-trigger rows: the largest RMS, over layers,
    of what layers 1..l have added."""
    return max(layer["cumulative"]["rms"] for layer in entry["layers"])


def head_rows(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (seed, layer, head): every head of every seed, as measured."""
    return [{"seed": e["seed"], "converged": e["converged"], "layer": li + 1, "head": hi + 1,
             **h} for e in entries for li, layer in enumerate(e["layers"])
            for hi, h in enumerate(layer["heads"])]


def head_layers(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per layer, over seeds, statistics that do not depend on head order (heads are
    interchangeable between seeds): sink heads per seed, the heads' summed squares and their
    constant share, the split of sink and other heads pooled, of the layer's sum and of the
    stream so far; each as mean, smallest and largest over seeds (or over the pooled heads)."""
    if not entries:
        return []
    out = []
    for li in range(len(entries[0]["layers"])):
        layers = [e["layers"][li] for e in entries]
        heads = [h for layer in layers for h in layer["heads"]]
        sinks = [h for h in heads if h["bos_mass_nontrigger"] >= SINK_HEAD_THRESHOLD]
        others = [h for h in heads if h["bos_mass_nontrigger"] < SINK_HEAD_THRESHOLD]
        counts = [sum(h["bos_mass_nontrigger"] >= SINK_HEAD_THRESHOLD for h in layer["heads"])
                  for layer in layers]
        out.append({
            "layer": li + 1, "n": len(layers),
            "sink_heads_distribution": {str(k): v for k, v in sorted(Counter(counts).items())},
            "head_rms": verdicts.spread([h["rms"] for h in heads]),
            "sink_const": verdicts.spread([h["const"] for h in sinks]),
            "sink_var": verdicts.spread([h["var"] for h in sinks]),
            "other_const": verdicts.spread([h["const"] for h in others]),
            "other_var": verdicts.spread([h["var"] for h in others]),
            "n_sink": len(sinks), "n_other": len(others),
            "layer_const": verdicts.spread([layer["layer"]["const"] for layer in layers]),
            "layer_var": verdicts.spread([layer["layer"]["var"] for layer in layers]),
            "cumulative_const": verdicts.spread([layer["cumulative"]["const"] for layer in layers]),
            "cumulative_var": verdicts.spread([layer["cumulative"]["var"] for layer in layers]),
        })
    return out


def protocol(opts: TheoryOptions, exe: Execution) -> dict[str, Any]:
    """The settings the report quotes, read from a denied-sink run's own config."""
    # torch: not for the help texts
    from sinklab.theory import constructions as theory
    from sinklab.train import plateau_rule_text

    cfg = theory.denied_config("softmax", "removed", None, 0, opts.steps, exe.device)
    return {"tol": cfg.train.tol, "lr": cfg.train.lr, "beta1": cfg.train.beta1,
            "beta2": cfg.train.beta2, "batch_size": cfg.train.batch_size,
            "denied_steps": opts.steps, "log_every": cfg.train.log_every,
            "eval_sequences": cfg.eval.n_sequences, "eval_trigger": cfg.task.eval_trigger,
            "seq_len": cfg.task.seq_len, "d_model": cfg.task.d_model,
            "train_trigger_min": cfg.task.train_trigger_min,
            "train_trigger_max": cfg.task.train_trigger_max,
            "seeds": opts.seeds, "eps": list(opts.eps), "quick": opts.quick,
            "patience": cfg.train.patience, "plateau_rule": plateau_rule_text(cfg.train.patience),
            "save_every": opts.save_every,
            "relu_sizes": [list(s) for s in dict.fromkeys(
                [*RELU_SIZES, (opts.seq_len, opts.d_model)])]}


def thresholds() -> dict[str, Any]:
    return {"relu_bound": RELU_BOUND, "family_slope": FAMILY_SLOPE,
            "family_slope_tol": FAMILY_SLOPE_TOL, "frontier_low": FRONTIER_LOW,
            "frontier_min_range": FRONTIER_MIN_RANGE, "constant_share": CONSTANT_SHARE,
            "cancel_share": CANCEL_SHARE, "identity_rel": IDENTITY_REL,
            "sink_head": SINK_HEAD_THRESHOLD, "head_figure_seeds": HEAD_FIGURE_SEEDS,
            "error_bins": [[lo, None if hi == float("inf") else hi]
                           for lo, hi in verdicts.ERROR_BINS]}


def worst_records(ctx: Context) -> dict[str, Any]:
    """The worst-case sections (``studies.bounds``): each heavy part kept in the study's cache
    under the settings it depends on."""
    # torch: not for the help texts
    from sinklab.theory import bounds, certify
    from sinklab.theory import constructions as theory

    opts = ctx.opts
    base = {"seeds": opts.seeds, "save_every": opts.save_every,
            "attack_steps": opts.attack_steps, "certify_seconds": opts.certify_seconds,
            "quick": opts.quick}
    ctx.log("theory: worst-case errors of the 1x1 models (attack and certificate)")
    finals = ctx.cached("worst_finals", {**base, "restarts": ATTACK_RESTARTS,
                                         "witnesses": True}, lambda: {
        "rows": bounds.final_records(ctx, opts.seeds, opts.attack_steps, ATTACK_RESTARTS,
                                     opts.certify_seconds)})["rows"]
    ctx.log("theory: the necessity bound at every saved checkpoint")
    checkpoints = ctx.cached("worst_checkpoints", {**base, "steps": CHECKPOINT_ATTACK_STEPS},
                             lambda: {"rows": bounds.checkpoint_records(
                                 ctx, opts.seeds, CHECKPOINT_ATTACK_STEPS)})["rows"]
    gaps = list(QUICK_WORST_GAPS if opts.quick else WORST_GAPS)
    family = ctx.cached("worst_family", {"gaps": gaps, "seq_len": opts.seq_len,
                                         "d_model": opts.d_model,
                                         "attack_steps": opts.attack_steps,
                                         "certify_seconds": opts.certify_seconds},
                        lambda: {"rows": bounds.family_records(
                            gaps, opts.seq_len, opts.d_model, opts.attack_steps,
                            opts.certify_seconds)})["rows"]
    construction = bounds.construction_record(opts.seq_len, opts.d_model, opts.certify_seconds)
    ctx.log("theory: worst-case errors of the denied-sink runs")
    names = [(rule, setting, eps, seed, denied_name(rule, setting, seed))
             for rule in RULES for setting, eps in theory.denied_settings(opts.eps)
             for seed in range(opts.seeds)]
    denied = ctx.cached("worst_denied", {**base, "eps": list(opts.eps), "steps": opts.steps},
                        lambda: {"rows": bounds.denied_worst(ctx, names, opts.attack_steps,
                                                             DENIED_RESTARTS)})["rows"]
    checkpoints, family = bounds.with_checks(checkpoints), bounds.with_checks(family)
    finals = bounds.with_checks(finals)
    return {"finals": finals, "checkpoints": checkpoints, "family": family,
            "construction": construction, "denied": denied,
            "table": verdicts.worst_table(finals),
            "settings": {**base, "restarts": ATTACK_RESTARTS, "denied_restarts": DENIED_RESTARTS,
                         "checkpoint_restarts": verdicts.CHECKPOINT_RESTARTS,
                         "checkpoint_attack_steps": CHECKPOINT_ATTACK_STEPS,
                         "sampled": verdicts.SAMPLED, "factor": verdicts.FACTOR,
                         "understates": verdicts.UNDERSTATES, "stronger": verdicts.STRONGER,
                         "rounding": verdicts.ROUNDING,
                         "rtol": certify.RTOL, "margin": certify.MARGIN}}


def collect(ctx: Context) -> dict[str, Any]:
    # torch: not for the help texts
    from sinklab.theory import constructions as theory
    from sinklab.theory import stacks

    opts = ctx.opts
    ctx.log("theory: ReLU construction and softmax sink family")
    sizes = list(dict.fromkeys([*RELU_SIZES, (opts.seq_len, opts.d_model)]))
    relu = theory.relu_exactness(sizes)
    family = theory.family_sweep(list(GAPS), seq_len=opts.seq_len, d_model=opts.d_model)
    denied = denied_records(ctx)
    rdir, runs, source = reproduction_runs(ctx)
    ctx.log(f"theory: frontier and heads from the reproduction's runs in {rdir}")
    per_run, groups = frontier_records(rdir, runs)
    n_seq = QUICK_HEAD_SEQUENCES if source["quick"] else HEAD_SEQUENCES
    heads = head_records(rdir, runs, n_seq)
    for entry in heads:
        entry["constant_share"] = constant_share(entry)
        entry["excursion"] = excursion(entry)
    worst = worst_records(ctx)
    ctx.log("theory: where the plain-target stacks sink")
    n_plain = verdicts.QUICK_PLAIN_SEQUENCES if opts.quick else verdicts.PLAIN_SEQUENCES
    plain_restarts = QUICK_PLAIN_RESTARTS if opts.quick else verdicts.PLAIN_ATTACK_RESTARTS
    plain = ctx.cached("plain", {"seeds": opts.seeds, "plain_steps": opts.plain_steps,
                                 "grid_seeds": opts.plain_grid_seeds, "sequences": n_plain,
                                 "attack_steps": opts.attack_steps,
                                 "restarts": plain_restarts},
                       lambda: stacks.plain_collect(ctx, opts.seeds, opts.plain_steps, n_plain,
                                                    opts.plain_grid_seeds, opts.attack_steps,
                                                    plain_restarts))
    return {
        "protocol": protocol(opts, ctx.exe), "thresholds": thresholds(),
        "worst": worst, "plain": plain,
        "reproduction": {**source, "head_sequences": n_seq},
        "relu_construction": relu, "family": family,
        "denied": denied, "denied_settings": denied_settings(denied),
        "frontier_runs": per_run, "frontier": groups,
        "heads": heads, "head_rows": head_rows(heads), "head_layers": head_layers(heads),
    }


# ------------------------------------------------------------------------------ claims


def relu_claims(records: dict[str, Any]) -> list[Claim]:
    """The hand-built ReLU construction: exact, and no weight on BOS (checks)."""
    relu = records["relu_construction"]
    sizes = ", ".join(f"({n}, {d})" for n, d in records["protocol"]["relu_sizes"])
    out = []
    for dtype in ("float64", "float32"):
        rows = [r for r in relu if r["dtype"] == dtype]
        out.append(cl.check(
            f"relu.exact_{dtype}",
            f"The hand-built ReLU weights solve the task exactly in {dtype}: 1x1 and 2x2, "
            f"(seq_len, d_model) in {sizes}, every trigger position",
            max(r["linf"] for r in rows), RELU_BOUND[dtype],
            f"largest L∞ error over {len(rows)} checks"))
    out.append(cl.check(
        "relu.no_bos_weight",
        "The ReLU construction puts weight 0 on BOS at each row of each check (no sink)",
        max(r["bos_weight_max"] for r in relu), 0.0,
        f"largest BOS weight at any row over {len(relu)} checks"))
    return out


def family_claims(records: dict[str, Any]) -> list[Claim]:
    """The softmax sink family: its error falls with the gap, in proportion to the mass off
    BOS (checks of a construction)."""
    fam = records["family"]
    errors = [p["linf_nontrigger"] for p in fam["points"]]
    rise = max(b - a for a, b in zip(errors, errors[1:]))
    gaps = [p["c"] for p in fam["points"]]
    return [
        cl.check("family.error_never_rises",
                 f"In the softmax sink family the non-trigger L∞ error falls as the logit gap c "
                 f"grows from {gaps[0]:g} to {gaps[-1]:g} and the BOS mass rises",
                 rise, 0.0, "largest change of the error from one gap to the next"),
        cl.check("family.error_proportional",
                 f"The family's non-trigger error is proportional to 1 - BOS mass (log-log slope "
                 f"{FAMILY_SLOPE:g} within {FAMILY_SLOPE_TOL:g}), so it falls to 0 only as the "
                 "BOS mass goes to 1",
                 abs(fam["slope_linf"] - FAMILY_SLOPE), FAMILY_SLOPE_TOL,
                 f"|fitted slope {fam['slope_linf']:.3f} - {FAMILY_SLOPE:g}|"),
    ]


def _setting_words(setting: str, eps: float | None) -> str:
    return "BOS removed" if eps is None else f"BOS share capped at 1 - {eps:g}"


def denied_claims(records: dict[str, Any]) -> list[Claim]:
    """The denied-sink runs, each claim pooled over the settings (one prediction): softmax
    reaches the stop rule at a rate below 1 - r0 (control: the denied ReLU runs), ReLU at a
    rate above r0 (control: the denied softmax runs), and the softmax worst case stays above
    the stop rule (control: the denied ReLU runs, which it does not tell apart)."""
    tol = records["protocol"]["tol"]
    steps = records["protocol"]["denied_steps"]
    settings = records["denied_settings"]
    n_settings = len({s["setting"] for s in settings})
    parts = {rule: [(s["setting"], s["converged"], s["n"]) for s in settings
                    if s["rule"] == rule] for rule in RULES}
    stop = (f"(training-batch L∞ below {tol:g}, before the plateau rule or the cap of {steps:,} "
            "steps ends the run)")
    pooled = f"pooled over the {n_settings} denied-sink settings (BOS removed, or its share capped)"
    out = []
    for rule, other, build, r0 in (("softmax", "relu", cl.rate_at_most, 1 - cl.R0),
                                   ("relu", "softmax", cl.rate_at_least, cl.R0)):
        key = f"denied.{rule}.reaches_stop"
        side = "below" if build is cl.rate_at_most else "above"
        name = verdicts.NAMES[rule]
        sentence = (f"{name[:1].upper()}{name[1:]} 1x1 runs with their sink denied reach the "
                    f"stop rule at a rate {side} {r0:.2g} {stop}; {pooled}")
        claim, control = (build(k, sentence, None, None, "reached the stop rule",
                                parts=parts[r])
                          for k, r in ((key, rule), (f"{key}.control", other)))
        out.append(cl.with_control(
            claim, control, f"the denied {verdicts.NAMES[other]} 1x1 runs (same settings, seeds "
                            "and protocol)"))
    worst = {rule: verdicts.denied_parts(records["worst"]["denied"], rule,
                                         lambda r: max(r["row1"], r["others"], r["trigger"]))
             for rule in RULES}
    if worst["softmax"]:
        sentence = (f"Softmax 1x1 models with their sink denied: the worst-case L∞ error over "
                    f"every input (attacked, a lower bound; every row type) stays above the stop "
                    f"rule's {tol:g}: the median over seeds, {pooled}")
        what = ("attacked worst-case error over every row type (row 1, the other non-trigger rows "
                "and the trigger rows), per seed")
        claim, control = (cl.median_at_least(k, sentence, None, tol, what=what, parts=worst[r])
                          for k, r in (("denied.softmax.worst_above_stop", "softmax"),
                                       ("denied.softmax.worst_above_stop.control", "relu")))
        out.append(cl.with_control(claim, control, verdicts.DENIED_CONTROL))
    return out


def _frontier_parts(records: dict[str, Any], rule: str, sinks: bool
                    ) -> tuple[list[tuple[str, int, int]], int, int]:
    """Per experiment, over ``rule``'s runs with a checkpoint below FRONTIER_LOW: how many have
    a sink head at every such checkpoint (``sinks``) or at none of them (not ``sinks``), of how
    many; and the checkpoints that do so, of the low-error checkpoints in all."""
    runs = [r for r in records["frontier_runs"] if r["rule"] == rule and r["n_low"]]
    experiments = dict.fromkeys(r["experiment"] for r in records["frontier_runs"])

    def ok(r: dict[str, Any]) -> bool:
        return r["n_low_sink"] == r["n_low"] if sinks else r["n_low_sink"] == 0

    parts = [(e, sum(ok(r) for r in runs if r["experiment"] == e),
              sum(r["experiment"] == e for r in runs)) for e in experiments]
    n_low = sum(r["n_low"] for r in runs)
    hits = sum(r["n_low_sink"] for r in runs)
    return parts, (hits if sinks else n_low - hits), n_low


def frontier_claims(records: dict[str, Any]) -> list[Claim]:
    """The error-BOS frontier of the reproduction's runs, pooled over the configurations: at
    low error softmax runs have a sink head at every checkpoint (control: the ReLU runs through
    the same test), ReLU runs at none (control: the softmax runs)."""
    thr, low = SINK_HEAD_THRESHOLD, FRONTIER_LOW
    configs = ", ".join(dict.fromkeys(r["experiment"] for r in records["frontier_runs"]))
    where = ("the theorem predicts this for the single-layer models, which have no residual "
             "stream; the residual multi-layer stacks are outside its setting, and for them it is "
             "the paper's observation")
    out = []
    for rule, other, sinks in (("softmax", "relu", True), ("relu", "softmax", False)):
        key = ("frontier.softmax.low_error_needs_sink" if sinks else
               "frontier.relu.low_error_without_sink")
        if sinks:
            sentence = (f"Softmax runs of the reproduction ({configs}) have a head at non-trigger "
                        f"BOS mass >= {thr:g} at each of their checkpoints with training-batch "
                        f"L∞ below {low:g}, at a rate above {cl.R0:g}; pooled over the "
                        f"configurations; {where}")
            have = f"have such a head at each checkpoint below L∞ {low:g}"
        else:
            sentence = (f"ReLU needs no sink: ReLU runs of the reproduction ({configs}) have all "
                        f"heads at non-trigger BOS mass below {thr:g} at each of their "
                        f"checkpoints with training-batch L∞ below {low:g}, at a rate above "
                        f"{cl.R0:g}; pooled over the configurations")
            have = f"have no such head at any checkpoint below L∞ {low:g}"
        pair = []
        for k, r in ((key, rule), (f"{key}.control", other)):
            parts, hits, n_low = _frontier_parts(records, r, sinks)
            pair.append(cl.rate_at_least(
                k, sentence, None, None,
                f"(of the {verdicts.NAMES[r]} runs with a checkpoint there) {have} ({hits} of "
                f"{n_low} checkpoints do)", parts=parts))
        out.append(cl.with_control(pair[0], pair[1], f"the {verdicts.NAMES[other]} runs of "
                                                      "the same configurations and seeds"))
    return out


def head_claims(records: dict[str, Any]) -> list[Claim]:
    """What the heads of the trained 4x4 softmax models write at non-trigger rows: mostly a
    constant, and it cancels (control: the same models at the paper's initialisation, before
    any update, ``records["heads_untrained"]``, which ``complete`` adds); and the bookkeeping
    identity (a check)."""
    entries = records["heads"]
    conv = [e for e in entries if e["converged"]]
    untrained = records["heads_untrained"]
    gaps = [abs(e["layers"][-1]["cumulative"]["rms"] - e["error"]["rms"])
            / max(e["error"]["rms"], 1e-30) for e in entries]
    n_layers = len(entries[0]["layers"])
    setting = ("the same 4x4 softmax models at the paper's initialisation (same seeds, before "
               "any update; the same test sequences)")
    const = (f"In the trained 4x4 softmax models that reached the stop rule, most of what the "
             f"heads write at non-trigger rows is a constant: the heads' constant parts hold more "
             f"than {CONSTANT_SHARE:g} of their summed squared outputs (median over seeds)")
    cancel = (f"What the layers write at non-trigger rows cancels on the way to the output: the "
              f"output's RMS error there is below {CANCEL_SHARE:g} of the largest RMS by which "
              f"the layers have moved the stream (median over the seeds that reached the stop "
              "rule)")

    def ratio(e: dict[str, Any]) -> float:
        return e["error"]["rms"] / e["excursion"]

    out = []
    for key, sentence, build, threshold, value, what in (
            ("heads.mostly_constant", const, cl.median_at_least, CONSTANT_SHARE,
             lambda e: e["constant_share"], "constant share of the heads' summed squares"),
            ("heads.cancel", cancel, cl.median_at_most, CANCEL_SHARE, ratio,
             "output RMS error over the largest RMS the layers moved the stream")):
        claim = build(key, sentence, [value(e) for e in conv], threshold, what=what)
        control = build(f"{key}.control", sentence, [value(e) for e in untrained], threshold,
                        what=f"{what}, untrained")
        out.append(cl.with_control(claim, control, setting))
    out.append(cl.check(
        "heads.error_is_what_remains",
        f"What layers 1..{n_layers} have added at non-trigger rows is the model's error there "
        "(the target is x): the two, computed by separate passes, agree (an identity)",
        max(gaps) if gaps else float("nan"), IDENTITY_REL,
        f"largest relative difference over {len(entries)} models"))
    return out


def claims(records: dict[str, Any], opts: TheoryOptions) -> list[Claim]:
    """The theory's claims, each with its kind, test and (empirical ones) control; decided
    together by ``STUDY.decide``, the ``PRIMARY`` ones corrected by Holm."""
    return [*relu_claims(records), *family_claims(records), *verdicts.worst_claims(records),
            *verdicts.necessity_claims(records), *denied_claims(records),
            *verdicts.denied_worst_claims(records),
            *verdicts.plain_claims(records["plain"]["runs"]), *frontier_claims(records),
            *(head_claims(records) if records["heads"] else [])]


def untrained_head_records(seeds: list[int], n_sequences: int, quick: bool
                           ) -> list[dict[str, Any]]:
    """``head_split`` of the reproduction's 4x4 softmax models at the paper's initialisation
    (``train.build_ensemble``: the weights the trained run of each seed started from), on the
    test sequences the trained ones are measured on; on the CPU, about 0.1 s a seed."""
    # torch: not for the help texts
    import torch

    from sinklab.theory import constructions as theory
    from sinklab.train import build_ensemble

    rep = reproduction.ReproduceOptions(seeds=max(seeds) + 1, quick=quick)
    out = []
    for seed in seeds:
        cfg = reproduction.run_config("4x4", "softmax", seed, rep, "cpu")
        model = build_ensemble([cfg], torch.device("cpu"))
        batch = theory.all_triggers_batch(cfg, n_sequences, seed=0, dtype=torch.float32)
        with torch.no_grad():
            entry = {"seed": seed, "step": 0, **theory.head_split(model, batch)}
        out.append({**entry, "constant_share": constant_share(entry),
                    "excursion": excursion(entry)})
    return out


def complete(records: dict[str, Any], opts: TheoryOptions) -> dict[str, Any]:
    """The records with the head claims' control added when absent: ``heads_untrained``, the
    untrained 4x4 softmax models of the seeds in ``heads`` (``untrained_head_records``)."""
    if not records.get("heads") or "heads_untrained" in records:
        return records
    rp = records["reproduction"]
    return {**records, "heads_untrained": untrained_head_records(
        [e["seed"] for e in records["heads"]], rp["head_sequences"], rp["quick"])}


# ----------------------------------------------------------------------------- figures

COLORS = {"softmax": "tab:blue", "relu": "tab:orange"}
MARKERS = ("o", "s", "^", "v", "D")  # one per seed, cycling


def _draw_family(ax: Any, records: dict[str, Any], opts: TheoryOptions) -> None:
    fam = records["family"]
    pts = fam["points"]
    gap = [p["one_minus_bos"] for p in pts]
    for key, label, slope in (("linf_nontrigger", "L∞ error, non-trigger rows",
                               fam["slope_linf"]),
                              ("mse_nontrigger", "MSE, non-trigger rows", fam["slope_mse"])):
        ax.loglog(gap, [p[key] for p in pts], "o-", label=f"{label} (slope {slope:.2f})")
    for p in pts[::4]:
        ax.annotate(f"c={p['c']:g}", (p["one_minus_bos"], p["linf_nontrigger"]), fontsize=7,
                    textcoords="offset points", xytext=(4, 4))
    ax.set_xlabel("1 - non-trigger BOS mass")
    ax.set_ylabel("error")
    ax.set_title("Softmax sink family: error falls only as BOS mass -> 1")
    ax.legend(fontsize=8)


def _experiments(records: dict[str, Any]) -> list[str]:
    return list(dict.fromkeys(g["experiment"] for g in records["frontier"]))


def _draw_frontier(axes: Any, records: dict[str, Any], opts: TheoryOptions) -> None:
    low = records["thresholds"]["frontier_low"]
    for row, experiment in enumerate(_experiments(records)):
        for col, (key, what) in enumerate((("bos_min", "min"), ("bos_max", "max"))):
            ax = axes[row, col]
            for rule in RULES:
                runs = [r for r in records["frontier_runs"]
                        if r["experiment"] == experiment and r["rule"] == rule]
                for i, run in enumerate(runs):
                    pts = run["points"]
                    ax.scatter([p["train_linf"] for p in pts], [p[key] for p in pts], s=5,
                               alpha=0.4, color=COLORS[rule], marker=MARKERS[i % len(MARKERS)],
                               label=f"{rule} ({len(runs)} seeds, a marker each)" if i == 0
                               else None)
            ax.axvline(low, color="grey", ls=":", linewidth=1)
            ax.axhline(SINK_HEAD_THRESHOLD, color="grey", ls="--", linewidth=1)
            ax.set_xscale("log")
            ax.set_ylim(-0.05, 1.05)
            ax.set_xlabel("training-batch L∞ error at the checkpoint")
            ax.set_ylabel(f"{what} BOS mass over heads")
            ax.set_title(f"{experiment}: {what} over heads and layers", fontsize=9)
            ax.legend(fontsize=6, markerscale=2)


def _frontier_grid(records: dict[str, Any], opts: TheoryOptions) -> tuple[int, int]:
    return (len(_experiments(records)), 2)


def _drawn_heads(records: dict[str, Any]) -> list[dict[str, Any]]:
    return records["heads"][:HEAD_FIGURE_SEEDS]


def _draw_heads(axes: Any, records: dict[str, Any], opts: TheoryOptions) -> None:
    row = np.asarray(axes, dtype=object).reshape(1, -1)[0]  # one Axes when one seed is drawn
    for ax, entry in zip(row, _drawn_heads(records)):
        layers = entry["layers"]
        n_heads = len(layers[0]["heads"])
        width = 0.8 / (n_heads + 1)
        xs = np.arange(len(layers))
        for h in range(n_heads):
            const = [layer["heads"][h]["const"] for layer in layers]
            var = [layer["heads"][h]["var"] for layer in layers]
            ax.bar(xs + h * width, const, width, color="tab:blue",
                   label="head: constant" if h == 0 else None)
            ax.bar(xs + h * width, var, width * 0.45, color="tab:red",
                   label="head: variation" if h == 0 else None)
        ax.bar(xs + n_heads * width, [layer["cumulative"]["rms"] for layer in layers], width,
               color="grey", label="layers 1..l so far (RMS)")
        ax.set_xticks(xs + 0.4 - width / 2, [f"L{i + 1}" for i in range(len(layers))])
        ax.set_ylabel("RMS at non-trigger rows")
        ax.set_title(f"4x4 softmax, seed {entry['seed']}", fontsize=9)
        ax.legend(fontsize=6)


def _heads_grid(records: dict[str, Any], opts: TheoryOptions) -> tuple[int, int]:
    return (1, max(len(_drawn_heads(records)), 1))


PLAIN_FIGURES = (
    FigureSpec("fig_plain", verdicts.draw_plain, grid=verdicts.plain_grid, size=(5.0, 3.2),
               title="Plain targets (no residual stream): where the stack sinks",
               when=lambda records, opts: bool(records.get("plain", {}).get("runs"))),
)
FIGURES = (
    FigureSpec("fig_family", _draw_family, size=(6.0, 4.2)),
    FigureSpec("fig_worst", verdicts.draw_positions, grid=(1, 2), size=(5.5, 4.0),
               title="Sampled, attacked and certified errors per position"),
    FigureSpec("fig_necessity", verdicts.draw_necessity, grid=(1, 2), size=(5.5, 4.2),
               title="The necessity bound, checked at every checkpoint and along the family"),
    FigureSpec("fig_norm", verdicts.draw_norm, size=(6.5, 4.5)),
    FigureSpec("fig_denied", verdicts.draw_denied, grid=(1, 2), size=(5.5, 4.0),
               title="Denied sink, 1x1: worst-case errors, mean and range over seeds"),
    FigureSpec("fig_frontier", _draw_frontier, grid=_frontier_grid, size=(5.0, 3.2)),
    FigureSpec("fig_heads", _draw_heads, grid=_heads_grid, size=(4.0, 3.6),
               when=lambda records, opts: bool(records["heads"])),
    *PLAIN_FIGURES,
)


STUDY = Study(
    name="theory",
    title="Theory: the sink is necessary for softmax, and not for ReLU",
    help="check the theorem: worst cases, the necessity bound, denied sinks, plain stacks",
    description="Build an exact ReLU solution without a sink and the softmax sink family; "
                "bound the worst-case error of trained 1x1 models over every input from below "
                "(attack) and above (certificate), certify ReLU's zero rows, and check the "
                "necessity bound at every saved checkpoint; train 1x1 models to a plateau with "
                "their sink removed or capped, and 2x2 and 4x4 stacks with plain targets; "
                "measure the error-BOS frontier and what the heads of 4x4 softmax models write "
                "at non-trigger rows, on the runs of a finished `sinklab reproduce` folder "
                "(--reproduce, only read) or on the reproduction's runs trained here. Writes "
                "runs, figures, records.json, claims.csv and THEORY.md; rerunning with the same "
                "--out resumes.",
    options=TheoryOptions, template="theorem.md.j2", collect=collect, cells=cells,
    claims=claims, figures=FIGURES, check=check, report="THEORY.md", primary=PRIMARY,
    complete=complete,
    tables=("denied", "denied_settings", "frontier", "head_rows", "head_layers",
            "relu_construction"),
    docs_example="docs/theory.md", default_out="results/theory")

"""``sinklab theory``: the paper's theorem checked numerically, every verdict a stated test.

Constructions (an exact ReLU solution with no sink, the softmax sink family); worst-case errors
of trained 1x1 models over every input, attacked and certified, with ReLU's zero rows certified
and the necessity bound of docs/theory.md checked at every saved checkpoint
(``theory.bounds``); 1x1 models trained to a plateau with their sink denied; 2x2 and 4x4 stacks
with plain targets, the theorem's multi-layer setting (``theory.stacks``); the error-BOS
frontier of the reproduction's models and what the heads of 4x4 softmax models write at
non-trigger rows. Writes into its own folder (``--out``) only::

    denied/{rule}_{setting}_seed{s}/    1x1 runs with BOS removed or its share capped
    frontier/{rule}_seed{s}/            1x1 runs of the paper's protocol with checkpoints/
    plain/{2x2,4x4}_{rule}_seed{s}/     stacks with plain targets, no residual stream
    plain-grid/{shape}_{rule}_std{v}_lr{v}_seed{s}/  their protocol search
    runs/{1x1,2x2,4x4}_{rule}_seed{s}/  the reproduction's runs, trained here only without
                                        --reproduce (the names and configs of
                                        ``sinklab reproduce``, from ``studies.reproduce``)
    cache/                              the attacks and certificates, kept per settings
    figures/, records.json, claims.csv, one CSV per table, THEORY.md

With ``--reproduce DIR`` the frontier and the heads come from DIR, a finished ``sinklab
reproduce`` folder that is only read (never locked or written). Rerunning with the same ``--out``
keeps every finished run, and the cached measurements.

    sinklab theory --reproduce results/reproduce --out results/theory

This module is the declaration (options, the numbers the claims are decided at, cells), free of
torch; ``theory_analysis`` collects the records (built in ``theory_records``), draws the figures
and completes the records, and ``theory_claims`` decides the claims.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from sinklab import heavy, stats
from sinklab.config import EXPERIMENTS, check_count
from sinklab.errors import ConfigError
from sinklab.runs import limits
from sinklab.studies import reproduce
from sinklab.studies.options import named
from sinklab.studies.study import Cell, Execution, Study
from sinklab.theory import protocol

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
PLAIN_SEQUENCES, QUICK_PLAIN_SEQUENCES = 1000, 200  # test sequences of the BOS measurements
PLAIN_ATTACK_RESTARTS = 4  # random starts per (trigger, row) of the attack on plain stacks

# The bounds and levels the claims are decided at (the report quotes them from the records).
RELU_BOUND = {"float64": 1e-12, "float32": 1e-5}  # largest error an "exact" construction may have
FAMILY_SLOPE = 1.0  # error proportional to the mass off BOS: log-log slope 1
FAMILY_SLOPE_TOL = 0.1
FRONTIER_LOW = protocol.ERROR_BINS[-1][1]  # a checkpoint has "low error" below this batch L∞
FRONTIER_MIN_RANGE = 0.1  # a rank correlation needs the max BOS mass to span more than this
FRONTIER_ERROR_FACTOR = 2.0  # the rules' low-error checkpoints are comparable: medians this close
CONSTANT_SHARE = 0.5  # "most of what a head writes is a constant": its share of the squares
CANCEL_SHARE = 0.01  # "cancels": the output keeps at most this share of the stream's excursion
IDENTITY_REL = 1e-3  # two float32 paths to the same error agree to this relative difference
UNDERSTATES = 2.0  # "the sample understates the worst case": attacked / sampled at least this
FACTOR = 2.0  # the certified upper bound within this factor of the attack's lower bound
STRONGER = 1.1  # the bound made this much stronger must be violated somewhere
HEAD_FIGURE_SEEDS = 4  # seeds drawn in the head figure (every seed is in the records)

# The theorem's predictions this study tests, named before it runs and corrected together (Holm):
# denied its sink, a softmax model reaches the stop rule less often than a ReLU model denied the
# same way (a contrast); at low error softmax runs have a sink head more often than ReLU runs (a
# contrast); a plain-target softmax stack (the theorem's multi-layer setting) that reaches the
# stop rule has a sink head, which the same stacks before training have not (its control).
PRIMARY = ("denied.reaches_stop", "frontier.low_error_sink", "plain.softmax.some_head_sinks")


@dataclass
class TheoryOptions:
    """What ``sinklab theory`` computes and trains; checked on creation."""

    seeds: int | None = field(default=None, metadata={
        "help": f"seeds of each denied-sink setting, of the 1x1 frontier runs and of the plain "
                f"stacks, and of the reproduction it trains without --reproduce (default: "
                f"{DEFAULT_SEEDS}; {QUICK_SEEDS} with --quick); a rate claim with every seed "
                f"agreeing needs {stats.seeds_all_agreeing(1)} seeds alone and "
                f"{stats.seeds_all_agreeing(len(PRIMARY))} as one of this study's {len(PRIMARY)} "
                "primary claims (the denied-sink contrast pools every setting's seeds)",
        "metavar": "N"})
    steps: int | None = field(default=None, metadata={
        "help": f"step cap of the denied-sink runs, which stop earlier on a plateau (no new "
                f"best training-batch L∞ in {protocol.PLATEAU_PATIENCE} steps) (default: "
                f"{DENIED_STEPS}; {QUICK_DENIED_STEPS} with --quick)", "metavar": "N"})
    plain_steps: int | None = field(default=None, metadata={
        "help": f"step cap of the 2x2 and 4x4 stacks trained with plain targets, which stop "
                f"earlier on the same plateau after {protocol.PLAIN_LR_DROPS} drops of the "
                f"learning rate; their protocol search's cap is the smaller of this and "
                f"{protocol.PLAIN_GRID_STEPS} (default: {PLAIN_STEPS}; {QUICK_PLAIN_STEPS} with "
                "--quick)", "metavar": "N"})
    plain_grid_seeds: int | None = field(default=None, metadata={
        "help": f"seeds 0..N-1 of the plain stacks' protocol search, which trains every initial "
                f"weight scale in {', '.join(f'{v:g}' for v in protocol.PLAIN_GRID_STD)} with "
                f"every learning rate in {', '.join(f'{v:g}' for v in protocol.PLAIN_GRID_LR)}"
                f" per shape and rule, N at most {protocol.PLAIN_GRID_SEEDS}; 0: no search "
                f"(default: {protocol.PLAIN_GRID_SEEDS}; {protocol.QUICK_PLAIN_GRID_SEEDS} with "
                f"--quick). The plain stacks the claims read use seeds "
                f"{protocol.PLAIN_FIRST_SEED} on, none of the search's", "metavar": "N"})
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
                f"{','.join(f'{e:g}' for e in protocol.DENIED_EPS)}; "
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
        constructions = heavy("theory.constructions")

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
        attack = heavy("theory.attack")

        attack.check_budget(named(self, "attack_steps"), self.attack_steps, attack.MAX_STEPS)
        if self.plain_grid_seeds is None:
            self.plain_grid_seeds = protocol.QUICK_PLAIN_GRID_SEEDS if self.quick \
                else protocol.PLAIN_GRID_SEEDS
        grid_seeds = self.plain_grid_seeds
        if not (isinstance(grid_seeds, int) and not isinstance(grid_seeds, bool)
                and 0 <= grid_seeds <= protocol.PLAIN_GRID_SEEDS):
            raise ConfigError(f"{named(self, 'plain_grid_seeds')}={grid_seeds!r} is not "
                              f"allowed: it must be an integer in 0..{protocol.PLAIN_GRID_SEEDS} "
                              f"(the search's seeds come before the plain stacks' seed "
                              f"{protocol.PLAIN_FIRST_SEED}).")
        if self.certify_seconds is None:
            self.certify_seconds = QUICK_CERTIFY_SECONDS if self.quick else CERTIFY_SECONDS
        if not (isinstance(self.certify_seconds, (int, float))
                and not isinstance(self.certify_seconds, bool)
                and 0 < self.certify_seconds <= 3600):
            raise ConfigError(f"{named(self, 'certify_seconds')}={self.certify_seconds!r} is "
                              "not allowed: it must be a number of seconds in (0, 3600].")
        if self.eps is None:
            self.eps = QUICK_EPS if self.quick else protocol.DENIED_EPS
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
        own = len(RULES) * (len(constructions.denied_settings(self.eps)) + 1) \
            + len(protocol.PLAIN_EXPERIMENTS) * len(protocol.PLAIN_RULES)
        trained = len(EXPERIMENTS) * len(reproduce.RULES) \
            if self.reproduce is None else 0
        grid = len(protocol.grid_runs(self.plain_grid_seeds))
        limits.check_cells(self.seeds * (own + trained) + grid,
                           f"{named(self, 'seeds')} {self.seeds}")

    def reproduce_options(self) -> reproduce.ReproduceOptions:
        """The reproduction this study trains itself when no --reproduce folder is given."""
        return reproduce.ReproduceOptions(seeds=self.seeds, quick=self.quick)


# ------------------------------------------------------------------------------- cells


def denied_name(rule: str, setting: str, seed: int) -> str:
    return f"denied/{rule}_{setting}_seed{seed}"


def cells(opts: TheoryOptions, exe: Execution) -> list[Cell]:
    """The denied-sink runs (one ensemble of seeds per rule and setting), and without
    --reproduce the reproduction's runs under their own names."""
    constructions = heavy("theory.constructions")

    out = [Cell(denied_name(rule, setting, seed),
                constructions.denied_config(rule, setting, eps, seed, opts.steps, exe.device),
                group=("denied", rule, setting), label=f"denied 1x1 {rule} {setting}")
           for rule in RULES for setting, eps in constructions.denied_settings(opts.eps)
           for seed in range(opts.seeds)]
    out += frontier_cells(opts.seeds, opts.save_every, exe)
    out += plain_cells(opts.seeds, opts.plain_steps, exe)
    out += grid_cells(opts.plain_grid_seeds, opts.plain_steps, exe)
    if opts.reproduce is None:
        out += reproduce.cells(opts.reproduce_options(), exe)
    return out


def frontier_cells(seeds: int, save_every: int, exe: Execution) -> list[Cell]:
    """The 1x1 runs of the paper's protocol whose checkpoints the worst-case section reads."""
    bounds = heavy("theory.bounds")

    return [Cell(bounds.frontier_name(rule, s),
                 bounds.frontier_config(rule, s, save_every, exe.device),
                 group=("frontier", rule), label=f"1x1 {rule} with checkpoints")
            for rule in RULES for s in range(seeds)]


def plain_cells(seeds: int, max_steps: int, exe: Execution) -> list[Cell]:
    """Every (experiment, rule, seed), seeds from ``PLAIN_FIRST_SEED`` (fresh: the protocol
    search uses the ones before); one ensemble of seeds per experiment and rule."""
    stacks = heavy("theory.stacks")

    first = protocol.PLAIN_FIRST_SEED
    return [Cell(stacks.plain_name(e, rule, seed),
                 stacks.plain_config(e, rule, seed, max_steps, exe.device),
                 group=("plain", e, rule), label=f"plain {e} {rule}")
            for e in protocol.PLAIN_EXPERIMENTS for rule in protocol.PLAIN_RULES
            for seed in range(first, first + seeds)]


def grid_cells(seeds: int, max_steps: int, exe: Execution) -> list[Cell]:
    """The protocol search: every (experiment, rule, init_std, lr) on seeds 0..seeds-1, at a
    constant rate and a step cap of at most ``PLAIN_GRID_STEPS``; one ensemble per experiment,
    rule and init_std (its learning rates and seeds)."""
    stacks = heavy("theory.stacks")

    steps = min(max_steps, protocol.PLAIN_GRID_STEPS)
    return [Cell(stacks.grid_name(e, rule, std, lr, seed),
                 stacks.plain_config(e, rule, seed, steps, exe.device, (std, lr), lr_drops=0),
                 group=("plain-grid", e, rule, std), label=f"plain search {e} {rule} std {std:g}")
            for e, rule, std, lr, seed in protocol.grid_runs(seeds)]


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
    options=TheoryOptions, analysis="sinklab.studies.theory_analysis",
    template="theory.md.j2", cells=cells,
    report="THEORY.md", primary=PRIMARY,
    tables=("denied", "denied_settings", "frontier", "head_rows", "head_layers",
            "relu_construction"),
    docs_example="docs/theory.md", default_out="results/theory")

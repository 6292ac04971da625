"""``sinklab extensions``: sweeps past the paper's single setting, for softmax and ReLU.

Every sweep trains 1x1 models (and 2x2 where it says so) at one learning rate per configuration
with a fixed budget and fine logs (``LR``, ``STEPS``: the protocol the zoo had before it searched
its rates), as ensembles over the seeds, into folders named like
``runs/1x1_relu_lr0.001_L32_seed0``, so another extensions folder's runs (or a zoo folder's of
that older protocol) can be adopted (``--reuse DIR``) instead of trained again:

- sequence length: train and test at ``seq_len`` in 8..128;
- trigger frequency: train with sequences that have no trigger or several
  (``task.no_trigger_prob``, ``task.max_triggers``), test on the paper's test set and on one
  shared mixed test set;
- length generalisation: the L = 16 models tested at L = 16, 32 and 64 (no training);
- the standard block: pre-LayerNorm and an MLP (``model.block=standard``) against attention only;
- sink emergence: non-trigger BOS mass and error against the training step, from the runs'
  training logs.

    sinklab extensions --out results/extensions                 # 3 seeds
    sinklab extensions --reuse results/ext-old --out results/ext   # adopt finished runs

This module is the study's declaration (its options, its runs and ``STUDY``), light enough for
the help texts; what is read from the runs, the claims and the figures are in
``sinklab.studies.extensions_analysis``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sinklab.config import RunConfig, build_run_config, check_count
from sinklab.runs import limits
from sinklab.studies.options import named
from sinklab.studies.study import Cell, Execution, Study

RULES = ("softmax", "relu")
CONFIGS: dict[str, tuple[int, int]] = {"1x1": (1, 1), "2x2": (2, 2)}
# The protocol of the extensions' runs: one rate per configuration (the middle of the grid the
# zoo used to screen), a fixed budget and fine training logs, which the sink-emergence curves
# are read from.
LR = {"1x1": 1e-3, "2x2": 3e-4}
STEPS = {"1x1": 3000, "2x2": 6000}
QUICK_STEPS = {"1x1": 1500, "2x2": 300}
LOG_EVERY = 10
SEQ_LENS = (8, 16, 32, 64, 128)
QUICK_SEQ_LENS = (8, 16, 32)
FREQUENCIES = ((0.0, 1), (0.25, 1), (0.5, 1), (0.9, 1), (0.0, 2), (0.0, 4), (0.5, 4))
QUICK_FREQUENCIES = ((0.0, 1), (0.5, 1), (0.0, 3))
BLOCKS = ("attention", "standard")
DEFAULT_SEEDS, QUICK_SEEDS = 3, 1
PRIMARY = ("seq_len.sink",)  # the theorem's prediction: softmax sinks more often than ReLU


def steps(config: str, quick: bool) -> int:
    """The step budget of every run in ``config``."""
    return (QUICK_STEPS if quick else STEPS)[config]


@dataclass
class ExtensionsOptions:
    """What ``sinklab extensions`` trains; checked on creation."""

    seeds: int | None = field(default=None, metadata={
        "help": f"seeds per setting (default: {DEFAULT_SEEDS}; {QUICK_SEEDS} with --quick); "
                "docs/studies.toml sets the committed report's", "metavar": "N"})
    quick: bool = field(default=False, metadata={
        "help": f"smoke test: {QUICK_SEEDS} seed, fewer lengths and frequencies, 1x1 blocks "
                f"only, at most {QUICK_STEPS['1x1']} (1x1) and {QUICK_STEPS['2x2']} (2x2) "
                "steps"})
    reuse: Path | None = field(default=None, metadata={
        "help": "another sinklab folder (an extensions folder, or a zoo folder of the protocol "
                "before the zoo searched its rates) whose finished runs of the same names and "
                "settings are hard-linked (or copied) in instead of trained",
        "metavar": "DIR"})

    def __post_init__(self) -> None:
        if self.seeds is None:
            self.seeds = QUICK_SEEDS if self.quick else DEFAULT_SEEDS
        check_count(named(self, "seeds"), self.seeds)
        if self.reuse is not None:
            self.reuse = Path(self.reuse)
        per_seed = len(RULES) * (len(seq_lens(self)) + len(frequencies(self))
                                 + len(block_configs(self)) * len(BLOCKS))
        limits.check_cells(self.seeds * per_seed, f"{named(self, 'seeds')} {self.seeds}")


def seq_lens(opts: ExtensionsOptions) -> tuple[int, ...]:
    return QUICK_SEQ_LENS if opts.quick else SEQ_LENS


def frequencies(opts: ExtensionsOptions) -> tuple[tuple[float, int], ...]:
    return QUICK_FREQUENCIES if opts.quick else FREQUENCIES


def block_configs(opts: ExtensionsOptions) -> tuple[str, ...]:
    return ("1x1",) if opts.quick else ("1x1", "2x2")


# --------------------------------------------------------------------------- the runs


def setting_name(task: dict[str, Any], model: dict[str, Any]) -> str:
    """A run folder's suffix for the settings that differ from the paper's ("" for none)."""
    parts = []
    if task.get("seq_len", 16) != 16:
        parts.append(f"_L{task['seq_len']}")
    if task.get("no_trigger_prob", 0.0):
        parts.append(f"_none{task['no_trigger_prob']:g}")
    if task.get("max_triggers", 1) != 1:
        parts.append(f"_k{task['max_triggers']}")
    if model.get("block", "attention") != "attention":
        parts.append(f"_{model['block']}")
    return "".join(parts)


def frequency_task(p: float, k: int) -> dict[str, Any]:
    return {"no_trigger_prob": p, "max_triggers": k}


def run_name(config: str, rule: str, seed: int, task: dict[str, Any] | None = None,
             model: dict[str, Any] | None = None) -> str:
    return f"runs/{config}_{rule}_lr{LR[config]:g}{setting_name(task or {}, model or {})}" \
           f"_seed{seed}"


def run_config(config: str, rule: str, seed: int, opts: ExtensionsOptions, device: str,
               task: dict[str, Any] | None = None, model: dict[str, Any] | None = None
               ) -> RunConfig:
    layers, heads = CONFIGS[config]
    return build_run_config({
        "task": dict(task or {}),
        "model": {"attention": rule, "n_layers": layers, "n_heads": heads, **(model or {})},
        "train": {"seed": seed, "lr": LR[config], "max_steps": steps(config, opts.quick),
                  "device": device, "log_every": LOG_EVERY},
    })


def _cell(opts: ExtensionsOptions, exe: Execution, sweep: str, config: str, rule: str, seed: int,
          task: dict[str, Any], model: dict[str, Any], tag: str) -> Cell:
    name = setting_name(task, model)
    return Cell(run_name(config, rule, seed, task, model),
                run_config(config, rule, seed, opts, exe.device, task, model),
                group=(sweep, config, rule, name), label=f"{config} {rule} {tag}")


def cells(opts: ExtensionsOptions, exe: Execution) -> list[Cell]:
    """Every run the sweeps need; the L = 16 attention-only run is named by three sweeps (and
    read by two more) and trained once. Length generalisation and emergence train nothing."""
    result = []
    for rule in RULES:
        for seed in range(opts.seeds):
            for n in seq_lens(opts):
                result.append(_cell(opts, exe, "seq_len", "1x1", rule, seed, {"seq_len": n}, {},
                                    f"L={n}"))
            for p, k in frequencies(opts):
                result.append(_cell(opts, exe, "trigger", "1x1", rule, seed,
                                    frequency_task(p, k), {}, f"no-trigger {p:g}, <= {k}"))
            for config in block_configs(opts):
                for block in BLOCKS:
                    result.append(_cell(opts, exe, "block", config, rule, seed, {},
                                        {"block": block}, f"{block} block"))
    return result


def _reuse(opts: ExtensionsOptions) -> list[Path]:
    return [opts.reuse] if opts.reuse is not None else []


STUDY = Study(
    name="extensions",
    title="Extensions: past the paper's setting",
    help="softmax and ReLU past the paper: lengths, trigger counts, blocks, emergence",
    description="Train softmax and ReLU 1x1 (and 2x2) models at other sequence lengths, "
                "trigger frequencies and with the standard block (LayerNorm and an MLP), test "
                "the L = 16 models at longer lengths, and follow the sink during training; "
                "every verdict is a claim over seeds. --reuse DIR adopts another folder's "
                "finished runs of the same names and settings instead of training them. Writes "
                "runs, figures, records.json, claims.csv, one CSV per sweep and "
                "EXTENSIONS.md. Rerunning with the same --out resumes: finished runs are kept.",
    options=ExtensionsOptions, analysis="sinklab.studies.extensions_analysis",
    template="extensions.md.j2", cells=cells, primary=PRIMARY,
    tables=("seq_len", "trigger", "block", "length", "emergence"), report="EXTENSIONS.md",
    reuse=_reuse, docs_example="docs/extensions.md",
    default_out="results/extensions")

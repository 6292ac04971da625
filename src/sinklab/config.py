"""Typed run configuration: task, model, training and evaluation settings, validated on creation.

A run is configured in three layers, later ones winning:
dataclass defaults < a TOML file (``--config FILE``) < ``section.field=value`` overrides.
Every value is checked in ``__post_init__``; a bad one raises ``ConfigError`` with one sentence
naming the field, the value and what is allowed. Unknown keys are errors, never ignored. An
override is text, read as the field's type (``train.seed=5``); the file is TOML, whose numbers
and booleans are its own, so a string there (``seed = "5"``) is refused (``check_file_types``).

The attention rule's keyword arguments are ``model.attention_args``: a ``[model.attention_args]``
table in the file, ``model.attention_args.NAME=VALUE`` on the command line, each coerced to and
checked against the type the rule declares (``sinklab.attention``, ``sinklab rules``), a float
against the float32 range the model computes in. The rule with its arguments is then called
once on small random scores (``sinklab.attention.check_contract``): every command that trains
builds its configs before it writes a folder, so a rule that breaks the contract (a plugin's
rule of the wrong shape, with weight on future keys, ...) is refused in one sentence first.

``EXPERIMENTS`` names the paper's 1x1, 2x2 and 4x4 shapes, the presets the studies train.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import re
import tomllib
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sinklab import heavy
from sinklab.errors import ConfigError


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise ConfigError(message)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_finite(obj: Any, section: str) -> None:
    """Refuse NaN and infinities in every float field: no setting means anything at inf."""
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        _check(not isinstance(value, float) or math.isfinite(value),
               f"{section}.{f.name}={value!r} is not allowed: it must be a finite number.")


def check_count(name: str, value: Any) -> None:
    """Raise ConfigError unless ``value`` (given as ``name``, e.g. ``--seeds``) is an int >= 1."""
    _check(_is_int(value) and value >= 1,
           f"{name}={value!r} is not allowed: it must be an integer >= 1.")


DEVICE = re.compile(r"auto|cpu|cuda(:[0-9]+)?")


def value_text(value: Any) -> str:
    """A value as it appears in a name (a sweep cell, a run folder): floats short (``1e-06``)
    where that is exact, else with every digit they need (``0.0010000001``), so that two
    different values never share a name."""
    if isinstance(value, float):
        short = f"{value:g}"
        return short if float(short) == value else repr(value)
    return str(value)


def setting(name: str, value: Any) -> str:
    """How a setting is named in a message: ``train.lr=0.1`` or ``--device 'tpu'``."""
    return f"{name} {value!r}" if name.startswith("-") else f"{name}={value!r}"


def check_device(value: Any, name: str = "--device") -> None:
    """Raise ConfigError unless ``value`` names a device: auto, cpu, cuda or cuda:N."""
    _check(isinstance(value, str) and DEVICE.fullmatch(value) is not None,
           f"{setting(name, value)} is not allowed: choose one of auto, cpu, cuda, cuda:N.")


def derive_seed(seed: int, stream: str) -> int:
    """A 63-bit seed for one named random stream ("init", "data", "eval") of a base seed.

    Hashing keeps the streams of different seeds and purposes apart: seed 1's data never equals
    seed 0's initialisation, as it could with seed + offset schemes.
    """
    digest = hashlib.blake2b(f"sinklab:{stream}:{seed}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


TARGETS = ("auto", "plain", "residual")
BOS_MODES = ("visible", "removed", "capped", "ablated")
BLOCKS = ("attention", "standard")
# The paper's three shapes by name, (n_layers, n_heads): the presets its experiments train
# (``sinklab reproduce``), and the shapes of the theory study's stacks.
EXPERIMENTS: dict[str, tuple[int, int]] = {"1x1": (1, 1), "2x2": (2, 2), "4x4": (4, 4)}


@dataclass
class TaskConfig:
    """The trigger-conditional averaging task of the paper. Positions are 0-indexed."""

    seq_len: int = 16
    d_model: int = 16
    train_trigger_min: int = 2
    train_trigger_max: int | None = None  # None means seq_len - 1
    eval_trigger: int = 7
    target: str = "auto"  # plain: y = 0 off the trigger; residual: y = x off the trigger
    # Trigger frequency of the training sequences (sinklab zoo's extensions): a sequence has no
    # trigger with probability no_trigger_prob, else 1..max_triggers triggers (uniform count, at
    # distinct positions in the training range). The paper's task is 0.0 and 1.
    no_trigger_prob: float = 0.0
    max_triggers: int = 1

    def __post_init__(self) -> None:
        _check_finite(self, "task")
        _check(_is_int(self.seq_len) and self.seq_len >= 4,
               f"task.seq_len={self.seq_len!r} is not allowed: it must be an integer >= 4.")
        _check(_is_int(self.d_model) and self.d_model >= 4,
               f"task.d_model={self.d_model!r} is not allowed: it must be an integer >= 4 "
               "(BOS flag, trigger flag, at least one content coordinate, bias flag).")
        last = self.seq_len - 1
        if self.train_trigger_max is None:
            self.train_trigger_max = last
        for name in ("train_trigger_min", "train_trigger_max", "eval_trigger"):
            value = getattr(self, name)
            _check(_is_int(value) and 2 <= value <= last,
                   f"task.{name}={value!r} is not allowed: trigger positions must be integers "
                   f"in 2..{last} for seq_len={self.seq_len}.")
        _check(self.train_trigger_min <= self.train_trigger_max,
               f"task.train_trigger_min={self.train_trigger_min} is not allowed: it must be <= "
               f"task.train_trigger_max={self.train_trigger_max}.")
        _check(self.target in TARGETS,
               f"task.target={self.target!r} is not allowed: choose one of {', '.join(TARGETS)}.")
        _check(0 <= self.no_trigger_prob < 1,
               f"task.no_trigger_prob={self.no_trigger_prob!r} is not allowed: it must lie in "
               "[0, 1).")
        span = self.train_trigger_max - self.train_trigger_min + 1
        _check(_is_int(self.max_triggers) and 1 <= self.max_triggers <= span,
               f"task.max_triggers={self.max_triggers!r} is not allowed: it must be an integer "
               f"in 1..{span}, the number of training trigger positions.")

    @property
    def single_trigger(self) -> bool:
        """Whether every training sequence has exactly one trigger (the paper's task)."""
        return self.no_trigger_prob == 0 and self.max_triggers == 1


@dataclass
class ModelConfig:
    """The paper's attention-only transformer: no MLP, LayerNorm, biases or 1/sqrt(d)."""

    attention: str = "softmax"
    n_layers: int = 1
    n_heads: int = 1
    init_std: float = 0.02
    # Denying the sink (sinklab theory): "removed" hides the BOS key from every query that is
    # not the trigger (the BOS query keeps its only key); "capped" limits the BOS share of every
    # such row to 1 - bos_cap_eps; "ablated" hides it from every query but BOS's own, trigger
    # included (for evaluating a trained model without its sink). The paper's model is "visible".
    bos: str = "visible"
    bos_cap_eps: float = 0.1
    # "attention": the paper's layer, attention only. "standard": a pre-LayerNorm block,
    # x <- x + MHA(LN(x)); x <- x + MLP(LN(x)), with a GELU MLP of width 4 d_model.
    block: str = "attention"
    # The rule's keyword arguments, e.g. {"temperature": 2.0} for softmax; empty: its defaults.
    attention_args: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        attention = heavy("attention")

        _check_finite(self, "model")
        _check(self.attention in attention.RULES,
               f"model.attention={self.attention!r} is not a known attention rule: choose one of "
               f"{', '.join(sorted(attention.RULES))} ({attention.PLUGIN_HINT}).")
        _check(isinstance(self.attention_args, dict),
               f"model.attention_args={self.attention_args!r} is not allowed: it must be a table "
               "of the rule's keyword arguments, e.g. [model.attention_args] temperature = 2.0.")
        try:
            self.attention_args = attention.rule_info(self.attention).check_kwargs(
                self.attention_args, ARGS_KEY + ".")
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        for name in ("n_layers", "n_heads"):
            value = getattr(self, name)
            _check(_is_int(value) and value >= 1,
                   f"model.{name}={value!r} is not allowed: it must be an integer >= 1.")
        _check(self.init_std > 0,
               f"model.init_std={self.init_std!r} is not allowed: it must be > 0.")
        _check(self.bos in BOS_MODES,
               f"model.bos={self.bos!r} is not allowed: choose one of {', '.join(BOS_MODES)}.")
        _check(0 < self.bos_cap_eps < 1,
               f"model.bos_cap_eps={self.bos_cap_eps!r} is not allowed: it must lie in (0, 1).")
        _check(self.block in BLOCKS,
               f"model.block={self.block!r} is not allowed: choose one of {', '.join(BLOCKS)}.")
        # Last: the rule is called once on small random scores (once per process for each rule
        # and arguments), so that a plugin's rule that breaks the contract is refused here,
        # before a run, sweep or study folder is written, not half-way through its training.
        try:
            attention.check_contract(self.attention, self.attention_args,
                           per_row=self.bos in ("removed", "ablated"))
        except ValueError as exc:
            raise ConfigError(str(exc)) from None


# Training options that are off at 0. A config leaves them out of its dict while they are off,
# so every run configured before they existed keeps its config.json byte for byte (and stays
# reusable: a finished run is reused when its config is equal).
OFF_BY_ZERO = ("save_every", "patience", "lr_drops")
DEFAULT_DROP_FACTOR = 0.1  # train.lr_drop_factor, likewise left out while it is the default
MAX_LR_DROPS = 10  # ten drops by the default factor already take the rate down 1e10-fold


@dataclass
class TrainConfig:
    """The paper's training protocol. ``lr=None`` picks the paper's rate for the model shape."""

    lr: float | None = None  # None: 1e-3 for 1 layer x 1 head, 1e-4 otherwise
    batch_size: int = 128
    max_steps: int = 50_000
    tol: float = 5e-3  # stop when the batch L-infinity error is below this
    beta1: float = 0.9
    beta2: float = 0.95
    adam_eps: float = 1e-8
    seed: int = 0
    log_every: int = 100
    device: str = "auto"
    # Weights saved every save_every steps (and at the stop step) into the run folder's
    # checkpoints/ (sinklab.train.list_checkpoints); 0 saves none.
    save_every: int = 0
    # The plateau rule (sinklab.train.plateau_rule_text): stop once the training batch's
    # L-infinity error has set no new best for this many consecutive steps; 0 never stops so.
    patience: int = 0
    # Learning-rate drops (sinklab.train.plateau_rule_text): the first lr_drops times the plateau
    # rule fires for a run, its learning rate is multiplied by lr_drop_factor and its patience
    # starts afresh instead of the run stopping; 0 never drops.
    lr_drops: int = 0
    lr_drop_factor: float = DEFAULT_DROP_FACTOR

    def __post_init__(self) -> None:
        _check_finite(self, "train")
        _check(self.lr is None or self.lr > 0,
               f"train.lr={self.lr!r} is not allowed: the learning rate must be > 0 (or auto).")
        for name in ("batch_size", "max_steps", "log_every"):
            value = getattr(self, name)
            _check(_is_int(value) and value >= 1,
                   f"train.{name}={value!r} is not allowed: it must be an integer >= 1.")
        _check(self.tol > 0, f"train.tol={self.tol!r} is not allowed: it must be > 0.")
        for name in ("beta1", "beta2"):
            value = getattr(self, name)
            _check(0 <= value < 1, f"train.{name}={value!r} is not allowed: it must be in [0, 1).")
        _check(self.adam_eps > 0,
               f"train.adam_eps={self.adam_eps!r} is not allowed: it must be > 0.")
        _check(_is_int(self.seed) and 0 <= self.seed < 2**63,
               f"train.seed={self.seed!r} is not allowed: it must be an integer in 0..2^63 - 1.")
        check_device(self.device, "train.device")
        for name in ("save_every", "patience"):
            value = getattr(self, name)
            _check(_is_int(value) and value >= 0,
                   f"train.{name}={value!r} is not allowed: it must be an integer >= 0 "
                   "(0 turns it off).")
        _check(_is_int(self.lr_drops) and 0 <= self.lr_drops <= MAX_LR_DROPS,
               f"train.lr_drops={self.lr_drops!r} is not allowed: it must be an integer in "
               f"0..{MAX_LR_DROPS} (0 never drops the learning rate).")
        _check(self.lr_drops == 0 or self.patience > 0,
               f"train.lr_drops={self.lr_drops!r} is not allowed with train.patience=0: the "
               "learning rate drops when the plateau rule fires, so set train.patience >= 1.")
        _check(0 < self.lr_drop_factor < 1,
               f"train.lr_drop_factor={self.lr_drop_factor!r} is not allowed: it must be in "
               "(0, 1).")


@dataclass
class EvalConfig:
    """The fixed evaluation set: sequences with the trigger at ``task.eval_trigger``."""

    n_sequences: int = 1000
    seed: int = 0

    def __post_init__(self) -> None:
        _check_finite(self, "eval")
        _check(_is_int(self.n_sequences) and self.n_sequences >= 1,
               f"eval.n_sequences={self.n_sequences!r} is not allowed: it must be an integer >= 1.")
        _check(_is_int(self.seed) and 0 <= self.seed < 2**63,
               f"eval.seed={self.seed!r} is not allowed: it must be an integer in 0..2^63 - 1.")


@dataclass
class RunConfig:
    """One training run. ``auto`` values are resolved here, so a saved config is explicit."""

    task: TaskConfig = field(default_factory=TaskConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)

    def __post_init__(self) -> None:
        standard = self.model.block == "standard"
        _check(not (standard and self.task.target == "plain"),
               "task.target='plain' is not allowed with model.block='standard': a standard block "
               "adds its input back, so the target must be residual (or auto).")
        if self.task.target == "auto":
            self.task.target = "residual" if self.model.n_layers > 1 or standard else "plain"
        if self.train.lr is None:
            single = self.model.n_layers == 1 and self.model.n_heads == 1
            self.train.lr = 1e-3 if single else 1e-4

    @property
    def residual(self) -> bool:
        """Whether the model adds its input back (and the targets include x)."""
        return self.task.target == "residual"

    def to_dict(self) -> dict[str, Any]:
        """Every setting, as ``build_run_config`` reads it back. Empty ``model.attention_args``
        and the training options that are off (``train.save_every`` and ``train.patience`` at
        0) are left out, so a config without them is written as it was before they existed."""
        d = dataclasses.asdict(self)
        if not d["model"]["attention_args"]:
            del d["model"]["attention_args"]
        for name in OFF_BY_ZERO:
            if d["train"][name] == 0:
                del d["train"][name]
        if d["train"]["lr_drop_factor"] == DEFAULT_DROP_FACTOR:
            del d["train"]["lr_drop_factor"]
        return d


SECTIONS: dict[str, type] = {
    "task": TaskConfig,
    "model": ModelConfig,
    "train": TrainConfig,
    "eval": EvalConfig,
}


ARGS_KEY = "model.attention_args"  # a table: its keys are ARGS_KEY.NAME


def allowed_keys() -> list[str]:
    """Every ``section.field`` key of the config (``model.attention_args`` is set one argument
    at a time, as ``model.attention_args.NAME``)."""
    return [f"{s}.{f.name}" for s, cls in SECTIONS.items() for f in dataclasses.fields(cls)]


def _keys_text() -> str:
    return ", ".join(f"{k}.NAME" if k == ARGS_KEY else k for k in allowed_keys())


def is_args_key(key: str) -> bool:
    """Whether ``key`` sets one of the rule's keyword arguments: ``model.attention_args.NAME``."""
    prefix, dot, name = key.rpartition(".")
    return prefix == ARGS_KEY and bool(name.strip())


def set_key(values: dict[str, Any], key: str, value: Any) -> None:
    """Set ``section.field`` (or ``model.attention_args.NAME``) in a nested dict of settings,
    copying the tables it changes so that a shared base is never edited."""
    section, _, name = key.partition(".")
    table = dict(values.get(section) or {})
    if is_args_key(key):
        field_name, _, arg = name.partition(".")
        prior = table.get(field_name)
        table[field_name] = {**(prior if isinstance(prior, dict) else {}), arg: value}
    else:
        table[name] = value
    values[section] = table


def field_type(cls: type, name: str) -> Any:
    return typing.get_type_hints(cls)[name]


def coerce(key: str, value: Any, annotation: Any) -> Any:
    """Turn a TOML value or a command-line string into the field's type, or raise ConfigError."""
    optional = False
    if isinstance(annotation, types.UnionType):
        args = [a for a in annotation.__args__ if a is not type(None)]
        optional = len(args) < len(annotation.__args__)
        annotation = args[0]
    if isinstance(value, str):
        text = value.strip()
        if optional and text.lower() in ("none", "null", "auto"):
            return None
        if annotation is str:
            return text
        if annotation is bool:
            if text.lower() in ("true", "1", "yes"):
                return True
            if text.lower() in ("false", "0", "no"):
                return False
            raise ConfigError(f"{key}={value!r} is not allowed: it must be true or false.")
        try:
            if not text.isascii():  # int() would read "١٢" or "１" as numbers
                raise ValueError(text)
            return int(text) if annotation is int else float(text)
        except ValueError:
            kind = "an integer" if annotation is int else "a number"
            raise ConfigError(f"{key}={value!r} is not allowed: it must be {kind}.") from None
    if value is None and optional:
        return None
    if annotation is float and _is_int(value):
        try:
            return float(value)
        except OverflowError:
            raise ConfigError(f"{key}={value!r} is not allowed: it is too large to be a "
                              "number.") from None
    if annotation is bool and isinstance(value, bool):
        return value
    if annotation is int and _is_int(value):
        return value
    if annotation is float and isinstance(value, float):
        return value
    if annotation is str and isinstance(value, str):
        return value
    raise ConfigError(f"{key}={value!r} is not allowed: it must be of type {annotation.__name__}.")


# A config file is TOML, which writes numbers and booleans as such: a string there is text,
# never read as a number ("5") or a boolean ("yes") as a command line's key=value is.
FILE_KINDS = {int: "an integer", float: "a number", bool: "true or false"}
NONE_WORDS = ("none", "null", "auto")  # a string that means None where a setting allows it


def toml_text(value: bool | int | float) -> str:
    """A number or a boolean as TOML writes it: ``true``, ``5``, ``0.001``."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return repr(value)


def file_string_problem(key: str, value: Any, annotation: Any,
                        none_word: str = "auto") -> str | None:
    """What a config file (TOML) does wrong in giving the setting ``key`` of type ``annotation``
    the string ``value``, where it takes a number or a boolean: "write an integer: seed = 5"
    (None when there is nothing wrong). A string that means None (``none_word``: "auto" for
    ``train.lr``, "none" for a rule's argument) stays allowed where the setting may be None,
    since TOML has no null."""
    base, optional = annotation, False
    if isinstance(annotation, types.UnionType):
        args = [a for a in annotation.__args__ if a is not type(None)]
        base, optional = args[0], len(args) < len(annotation.__args__)
    if not isinstance(value, str) or base not in FILE_KINDS:
        return None
    if optional and value.strip().lower() in NONE_WORDS:
        return None
    try:
        typed = coerce(key, value, base)
    except ConfigError:
        return f"write {FILE_KINDS[base]} without quotes" + \
            (f', or "{none_word}"' if optional else "")
    return f"write {FILE_KINDS[base]}: {key.rpartition('.')[2]} = {toml_text(typed)}" + \
        (f' (or "{none_word}")' if optional else "")


def check_file_types(table: dict[str, Any], where: str, rules: list[str],
                     at: Callable[[str], str] | None = None, prefix: str = "") -> None:
    """Refuse a string for a setting that takes a number or a boolean in a config file's
    ``table`` (``[task]``, ..., and ``[model.attention_args]`` typed by each registered rule
    in ``rules``): one sentence naming ``where`` (e.g. "config file 'x.toml'"), the key (after
    ``prefix``, e.g. "base."), the value with ``at(key)`` (e.g. " (line 4)") and what to write
    instead. Keys that are not settings are left to ``build_run_config`` to refuse."""
    attention = heavy("attention")

    def check(key: str, value: Any, annotation: Any, none_word: str = "auto") -> None:
        problem = file_string_problem(key, value, annotation, none_word)
        if problem is not None:
            line = at(key) if at is not None else ""
            raise ConfigError(f"{where}: {prefix}{key} = {value!r}{line} is a string; "
                              f"{problem}.")

    for section, fields_ in table.items():
        cls = SECTIONS.get(section)
        if cls is None or not isinstance(fields_, dict):
            continue
        names = {f.name for f in dataclasses.fields(cls)}
        for name, value in fields_.items():
            key = f"{section}.{name}"
            if key == ARGS_KEY and isinstance(value, dict):
                for rule in dict.fromkeys(r for r in rules if r in attention.RULES):
                    declared = attention.rule_info(rule).kwargs
                    for arg, given in value.items():
                        if arg in declared:
                            check(f"{ARGS_KEY}.{arg}", given, declared[arg].type, "none")
            elif name in names and key != ARGS_KEY:
                check(key, value, field_type(cls, name))


def parse_overrides(items: list[str]) -> dict[str, dict[str, str]]:
    """Parse ``section.field=value`` strings into a nested dict of raw strings."""
    nested: dict[str, dict[str, str]] = {}
    for item in items:
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ConfigError(f"override {item!r} is not of the form section.field=value, "
                              "for example model.attention=relu.")
        if key == ARGS_KEY:
            raise ConfigError(f"override {item!r} is not allowed: set the rule's keyword "
                              f"arguments one at a time, as {ARGS_KEY}.NAME=VALUE.")
        if key not in allowed_keys() and not is_args_key(key):
            raise ConfigError(f"unknown override key {key!r}: allowed keys are "
                              f"{_keys_text()}.")
        set_key(nested, key, value)
    return nested


def load_toml(path: str | Path) -> dict[str, Any]:
    """Read a TOML config file with [task], [model], [train] and [eval] tables."""
    return read_toml_text(path, "config file")[1]


def read_toml_text(path: str | Path, what: str) -> tuple[str, dict[str, Any]]:
    """A TOML file's text and table; a missing file, a folder, a device, text that is not
    UTF-8 or not TOML is a ConfigError naming ``what`` (e.g. "config file") and the path."""
    path = Path(path)
    if path.is_dir():
        raise ConfigError(f"{what} {str(path)!r} is a folder, not a TOML file.")
    if not path.is_file():
        if path.exists():
            raise ConfigError(f"{what} {str(path)!r} is not a regular file (a device, a pipe "
                              "or a socket); give a TOML file.")
        if path.is_symlink():
            raise ConfigError(f"{what} {str(path)!r} is a symbolic link that leads to no file.")
        raise ConfigError(f"{what} {str(path)!r} does not exist.")
    try:
        text = path.read_bytes().decode("utf-8")
        return text, tomllib.loads(text)
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{what} {str(path)!r} is not UTF-8 text (byte {exc.start} cannot be "
                          "decoded); save it as UTF-8.") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{what} {str(path)!r} is not valid TOML: {exc}.") from None


def merge(*layers: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Merge nested dicts section by section, and tables inside a section (a file's
    ``[model.attention_args]`` and a command line's ``model.attention_args.NAME``) key by key;
    later layers win."""
    merged: dict[str, dict[str, Any]] = {}
    for layer in layers:
        for section, values in layer.items():
            if not isinstance(values, dict):
                raise ConfigError(f"config key {section!r} must be a table of fields; "
                                  f"sections are {', '.join(SECTIONS)}.")
            table = merged.setdefault(section, {})
            for name, value in values.items():
                if isinstance(value, dict) and isinstance(table.get(name), dict):
                    value = {**table[name], **value}
                table[name] = value
    return merged


def build_run_config(values: dict[str, Any] | None = None) -> RunConfig:
    """Build and validate a RunConfig from a nested dict (TOML, JSON or parsed overrides)."""
    values = values or {}
    parts: dict[str, Any] = {}
    for section, fields_ in values.items():
        if section not in SECTIONS:
            raise ConfigError(f"unknown config section {section!r}: sections are "
                              f"{', '.join(SECTIONS)}.")
        cls = SECTIONS[section]
        names = {f.name for f in dataclasses.fields(cls)}
        kwargs = {}
        for name, raw in fields_.items():
            key = f"{section}.{name}"
            if name not in names:
                raise ConfigError(f"unknown config key {key!r}: allowed keys are "
                                  f"{_keys_text()}.")
            if key == ARGS_KEY:
                continue  # coerced once the rule is known
            kwargs[name] = coerce(key, raw, field_type(cls, name))
        if section == "model" and "attention_args" in fields_:
            kwargs["attention_args"] = _coerce_args(fields_["attention_args"],
                                                    kwargs.get("attention", cls.attention))
        parts[section] = cls(**kwargs)
    return RunConfig(**parts)


def _coerce_args(raw: Any, rule: str) -> Any:
    """The rule's keyword arguments from a file or the command line, each coerced to the type
    the rule declares; names it does not declare (and a rule that does not exist) are left for
    ``ModelConfig`` to refuse in one sentence."""
    attention = heavy("attention")

    if not isinstance(raw, dict) or rule not in attention.RULES:
        return raw
    declared = attention.rule_info(rule).kwargs
    return {name: coerce(f"{ARGS_KEY}.{name}", value, declared[name].type)
            if name in declared else value for name, value in raw.items()}


def config_from_cli(overrides: list[str], config_file: str | None = None,
                    base: dict[str, Any] | None = None) -> RunConfig:
    """defaults < ``base`` < config file < overrides, validated. The file is TOML, so a
    number or a boolean written there as a string is refused (``check_file_types``); the
    overrides are text by nature, and read as the settings' types."""
    layers = [base or {}]
    table = load_toml(config_file) if config_file else {}
    layers += [table, parse_overrides(overrides)]
    merged = merge(*layers)
    rule = merged.get("model", {}).get("attention", ModelConfig.attention)
    check_file_types(table, f"config file {str(config_file)!r}",
                     [rule.strip()] if isinstance(rule, str) else [])
    return build_run_config(merged)

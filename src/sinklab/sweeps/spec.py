"""Sweep specs: a base config, a grid of overrides and seeds, in one TOML file.

    description = "softmax against ReLU at two lengths"
    seeds = 3                      # or a list of seeds, e.g. [0, 1, 2]

    [base]                         # a run config, as for `sinklab train --config`
    train.max_steps = 2000

    [grid]                         # section.field = [values]; every combination is a cell
    "model.attention" = ["softmax", "relu"]
    "task.seq_len" = [16, 32]
    "model.attention_args.temperature" = [1.0, 2.0]   # a keyword argument of the rule

``load_spec`` validates everything before anything runs: an unknown key, an empty grid, a value
of the wrong type or out of range (a number or a boolean written as a string, ``"5"``, too), a
key both fixed in ``[base]`` and varied in ``[grid]``, a key given twice (quoted,
``"model.attention"``, and dotted, ``model.attention``, which TOML reads as two keys) is a
``SpecError`` naming the key and its line in the file; an
attention rule that is not registered (``UnknownRule``) also says that a rule of one's own
needs its plugin (``--plugin MODULE``, ``sinklab.plugins``).
``cells`` expands a spec into cells with deterministic names, in grid order then seed order.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sinklab.attention import PLUGIN_HINT, RULES, rule_info
from sinklab.config import (
    SECTIONS,
    RunConfig,
    allowed_keys,
    build_run_config,
    check_file_types,
    coerce,
    field_type,
    file_string_problem,
    is_args_key,
    read_toml_text,
    set_key,
    value_text,
)
from sinklab.errors import ConfigError
from sinklab.runs import limits

TOP_KEYS = ("description", "seeds", "base", "grid")


class SpecError(ConfigError):
    """A sweep spec that cannot be run; the message names the key and its line."""


class UnknownRule(SpecError):
    """A spec naming an attention rule that is not registered (a plugin's, not loaded)."""


def _check_rule(value: Any, where: str) -> None:
    if isinstance(value, str) and value not in RULES:
        raise UnknownRule(f"{where}: {value!r} is not a registered attention rule: choose one of "
                          f"{', '.join(sorted(RULES))}; {PLUGIN_HINT}.")


@dataclass(frozen=True)
class Spec:
    """A validated sweep: base values, grid (key -> values, in file order) and seeds."""

    path: str
    description: str
    base: dict[str, dict[str, Any]]
    grid: dict[str, list[Any]]
    seeds: tuple[int, ...]

    def to_json(self) -> str:
        """The spec's content (not its path), canonically: two specs that run the same cells
        have the same text."""
        return json.dumps({"description": self.description, "base": self.base,
                           "grid": self.grid, "seeds": list(self.seeds)}, sort_keys=True)


@dataclass(frozen=True)
class Cell:
    """One run of a sweep."""

    name: str
    position: int  # order in the sweep
    overrides: dict[str, Any]  # the grid's values for this cell
    seed: int
    config: RunConfig


def _line_of(text: str, table: str, key: str) -> int | None:
    """The 1-based line where ``key`` is set inside ``[table]`` (or at top level for ""), or
    where the table starts when ``key`` is empty."""
    current = ""
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        header = re.fullmatch(r"\[\s*([^\[\]]+?)\s*\]", line)
        if header:
            current = header.group(1).replace('"', "").replace("'", "")
            if not key and current == table:
                return number
            continue
        if "=" not in line or not key:
            continue
        name = line.split("=", 1)[0].strip().replace('"', "").replace("'", "")
        full = f"{current}.{name}" if current else name
        if full == (f"{table}.{key}" if table else key) or (current == table and name == key):
            return number
    return None


def _at(text: str, table: str, key: str = "") -> str:
    line = _line_of(text, table, key)
    return f" (line {line})" if line else ""


BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")


def _key_parts(text: str) -> tuple[str, ...] | None:
    """The parts of a TOML key as ``text`` writes it (``"model.attention"`` is one part,
    ``model.attention`` two), read by TOML itself; None when ``text`` is not a key."""
    try:
        table: Any = tomllib.loads(f"{text} = 0")
    except tomllib.TOMLDecodeError:
        return None
    parts = []
    while isinstance(table, dict) and len(table) == 1:
        ((part, table),) = table.items()
        parts.append(part)
    return tuple(parts)


def _spelled(parts: tuple[str, ...]) -> str:
    """A key's parts as a file writes them: ``"model.attention"`` or ``model.attention``."""
    return ".".join(p if BARE_KEY.fullmatch(p) else json.dumps(p) for p in parts)


def _line_of_parts(text: str, parts: tuple[str, ...]) -> int | None:
    """The 1-based line that sets the key ``parts`` (from the top of the file, each part as it
    is quoted there), under a table header or written out in full."""
    current: tuple[str, ...] = ()
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        header = re.fullmatch(r"\[\s*([^\[\]]+?)\s*\]\s*(#.*)?", line)
        if header:
            current = _key_parts(header.group(1)) or ()
            continue
        if "=" in line and not line.startswith("#"):
            key = _key_parts(line.split("=", 1)[0])
            if key is not None and current + key == parts:
                return number
    return None


def _flatten(table: dict[str, Any], text: str, where: str, name: str) -> dict[str, Any]:
    """``[NAME]``'s keys, dotted or quoted (``{"model": {"attention": v}}`` and
    ``{"model.attention": v}`` alike), as ``{"model.attention": v}`` in file order. TOML reads
    ``"model.attention"`` and ``model.attention`` as two keys, so a key written both ways is a
    SpecError naming both spellings, never one of them silently winning."""
    flat: dict[str, Any] = {}
    spelling: dict[str, tuple[str, ...]] = {}

    def walk(values: dict[str, Any], parts: tuple[str, ...]) -> None:
        for key, value in values.items():
            if isinstance(value, dict):
                walk(value, parts + (key,))
                continue
            full = ".".join(parts + (key,))
            if full in flat:
                first, second = spelling[full], parts + (key,)
                lines = [_line_of_parts(text, (name, *p)) for p in (first, second)]
                at = [f" (line {n})" if n else "" for n in lines]
                raise SpecError(f"{where}: {name} key {full!r} is given twice, as "
                                f"{_spelled(first)}{at[0]} and as {_spelled(second)}{at[1]} "
                                "(TOML reads a quoted key and a dotted one as two keys); "
                                "give it once.")
            flat[full], spelling[full] = value, parts + (key,)

    walk(table, ())
    return flat


def _has_quoted_key(table: dict[str, Any]) -> bool:
    """Whether a key of ``table`` or of a table inside it was quoted with a dot inside."""
    return any("." in key or (isinstance(value, dict) and _has_quoted_key(value))
               for key, value in table.items())


def _check_arg_strings(key: str, values: list[Any], rules: list[str], where: str) -> None:
    """Refuse a string among a grid's ``values`` of the rule's argument ``key`` where one of
    ``rules`` declares it a number or a boolean (TOML writes those unquoted)."""
    name = key.rpartition(".")[2]
    for rule in dict.fromkeys(r for r in rules if r in RULES):
        declared = rule_info(rule).kwargs.get(name)
        if declared is None:  # not its argument: each cell's config says so
            continue
        for value in values:
            if file_string_problem(key, value, declared.type, "none") is not None:
                raise SpecError(f"{where}: {value!r} is a string, but {rule}'s {name} takes "
                                f"{declared.words()}, written without quotes.")


def _in_base(base: dict[str, Any], key: str) -> bool:
    """Whether the dotted ``key`` (``train.lr``, ``model.attention_args.bias``) is set in
    ``[base]``."""
    section, _, rest = key.partition(".")
    values = base.get(section)
    for part in rest.split("."):
        if not isinstance(values, dict) or part not in values:
            return False
        values = values[part]
    return True


def load_spec(path: str | Path) -> Spec:
    """Read and validate a sweep spec (see the module docstring for the format)."""
    path = Path(path)
    try:
        text, data = read_toml_text(path, "sweep spec")
    except ConfigError as exc:
        raise SpecError(str(exc)) from None
    where = str(path)
    for key in data:
        if key not in TOP_KEYS:
            raise SpecError(f"{where}: unknown key {key!r}{_at(text, '', key)}: a sweep spec has "
                            f"{', '.join(TOP_KEYS)}.")
    description = data.get("description", "")
    if not isinstance(description, str):
        raise SpecError(f"{where}: description{_at(text, '', 'description')} must be a string.")
    seeds = _seeds(data.get("seeds", 1), where + _at(text, "", "seeds"))

    base = data.get("base", {})
    if not isinstance(base, dict):
        raise SpecError(f"{where}: base{_at(text, '', 'base')} must be a table of run settings, "
                        "e.g. [base] train.max_steps = 2000.")
    flat_base = _flatten(base, text, where, "base")
    for key in flat_base:
        section = key.partition(".")[0]
        if section not in SECTIONS or "." not in key:
            raise SpecError(f"{where}: unknown key 'base.{section}'{_at(text, 'base', section)}:"
                            f" [base] holds the sections {', '.join(SECTIONS)}.")
        if key not in allowed_keys() and not is_args_key(key):
            raise SpecError(f"{where}: unknown key 'base.{key}'{_at(text, 'base', key)}: "
                            f"allowed keys are {', '.join(allowed_keys())}.")
    if _has_quoted_key(base):  # "train.lr" = 0.1 as if written train.lr = 0.1
        base = {}
        for key, value in flat_base.items():
            set_key(base, key, value)
    if isinstance(base.get("model"), dict) and "attention" in base["model"]:
        _check_rule(base["model"]["attention"],
                    f"{where}: base.model.attention{_at(text, 'base', 'model.attention')}")
    grid_table = data.get("grid")
    flat_grid = _flatten(grid_table, text, where, "grid") if isinstance(grid_table, dict) else {}
    # the rules whose declarations type the rule's arguments: [base]'s, or else the grid's
    rules = flat_grid.get("model.attention", ["softmax"])
    if isinstance(base.get("model"), dict) and "attention" in base["model"]:
        rules = [base["model"]["attention"]]
    rules = [r for r in rules if isinstance(r, str)] if isinstance(rules, list) else []
    try:  # a TOML file: "5" is text, never a number (as a command line's train.seed=5 is)
        check_file_types(base, where, rules, at=lambda key: _at(text, "base", key),
                         prefix="base.")
    except ConfigError as exc:
        raise SpecError(str(exc)) from None
    try:
        build_run_config(base)
    except ConfigError as exc:
        raise SpecError(f"{where}: [base]{_at(text, 'base')}: {exc}") from None

    if "grid" in data and not isinstance(data["grid"], dict):
        raise SpecError(f"{where}: grid{_at(text, '', 'grid')} must be a table of "
                        "section.field = [values], e.g. [grid] \"model.attention\" = "
                        "[\"softmax\", \"relu\"].")
    if "grid" not in data or not data["grid"]:
        raise SpecError(f"{where}: the grid{_at(text, 'grid')} is empty or missing: give at "
                        "least one key with a list of values, e.g. [grid] "
                        "\"model.attention\" = [\"softmax\", \"relu\"].")
    grid: dict[str, list[Any]] = {}
    for key, values in flat_grid.items():
        at = _at(text, "grid", key)
        if key not in allowed_keys() and not is_args_key(key):
            raise SpecError(f"{where}: unknown grid key {key!r}{at}: allowed keys are "
                            f"{', '.join(allowed_keys())}.")
        if key == "train.seed":
            raise SpecError(f"{where}: grid key 'train.seed'{at} is not allowed: seeds come from "
                            "the top-level seeds.")
        if key == "model.attention_args":
            raise SpecError(f"{where}: grid key 'model.attention_args'{at} is not allowed: vary "
                            "one keyword argument of the rule at a time, as "
                            "\"model.attention_args.NAME\" = [values].")
        if _in_base(base, key):
            raise SpecError(f"{where}: grid key {key!r}{at} is also set in [base]"
                            f"{_at(text, 'base', key)}: a key is either fixed in [base] or "
                            "varied in [grid], not both; remove it from one of them.")
        if not isinstance(values, list) or not values:
            raise SpecError(f"{where}: grid key {key!r}{at} must be a non-empty list of "
                            "values.")
        if is_args_key(key):  # typed by the cell's rule: every cell's config checks them
            _check_arg_strings(key, values, rules, f"{where}: grid key {key!r}{at}")
            if len(set(map(repr, values))) != len(values):
                raise SpecError(f"{where}: grid key {key!r}{at} lists a value twice.")
            grid[key] = values
            continue
        section, name = key.split(".")
        annotation = field_type(SECTIONS[section], name)
        coerced = []
        optional = "None" in str(annotation)
        for value in values:
            if isinstance(value, str) and annotation is not str and "str" not in str(annotation) \
                    and not (optional and value.strip().lower() in ("auto", "none")):
                raise SpecError(f"{where}: grid key {key!r}{at}: {value!r} is a string, but "
                                f"{key} takes {type_words(annotation)}.")
            try:
                coerced.append(coerce(key, value, annotation))
            except ConfigError as exc:
                raise SpecError(f"{where}: grid key {key!r}{at}: {exc}") from None
        if len(set(map(repr, coerced))) != len(coerced):
            raise SpecError(f"{where}: grid key {key!r}{at} lists a value twice.")
        if key == "model.attention":
            for value in coerced:
                _check_rule(value, f"{where}: grid key {key!r}{at}")
        grid[key] = coerced
    total = math.prod(len(v) for v in grid.values()) * len(seeds)
    limits.check_cells(total, f"{where}: the grid")
    spec = Spec(where, description, base, grid, seeds)
    cells(spec)  # every combination must be a valid run config
    return spec


def type_words(annotation: Any) -> str:
    """A field's type in words: ``int`` -> "an integer", ``float | None`` -> "a number or
    auto"."""
    text = str(annotation)
    words = "an integer" if "int" in text else "true or false" if "bool" in text else "a number"
    return words + (" or auto" if "None" in text else "")


def _seeds(value: Any, where: str) -> tuple[int, ...]:
    def is_int(v: Any) -> bool:
        return isinstance(v, int) and not isinstance(v, bool)

    if is_int(value) and value >= 1:
        limits.check_cells(value, f"{where}: seeds={value}")
        return tuple(range(value))
    if isinstance(value, list) and value and all(is_int(v) and v >= 0 for v in value) \
            and len(set(value)) == len(value):
        return tuple(value)
    raise SpecError(f"{where}: seeds={value!r} is not allowed: give a count >= 1 or a list of "
                    "distinct seeds >= 0.")


def _slug(value: Any) -> str:
    """A value as it appears in a cell name (``value_text``, made file-name safe)."""
    return re.sub(r"[^A-Za-z0-9.+-]+", "_", value_text(value))


NAME_BYTES = 200  # longest run-folder name; most file systems allow 255 bytes


def folder_name(name: str) -> str:
    """The run folder of a cell: its name, or for a very long one a prefix and a hash of it."""
    if len(name.encode()) <= NAME_BYTES:
        return name
    digest = hashlib.blake2b(name.encode(), digest_size=8).hexdigest()
    return name.encode()[:NAME_BYTES - 17].decode(errors="ignore") + "-" + digest


def cell_name(overrides: dict[str, Any], seed: int) -> str:
    """``model.attention=relu,task.seq_len=32,seed=1``: the grid values, then the seed."""
    return ",".join([f"{k}={_slug(v)}" for k, v in overrides.items()] + [f"seed={seed}"])


def cells(spec: Spec) -> list[Cell]:
    """Every cell of ``spec``: the grid's combinations in file order, each with every seed."""
    result = []
    keys = list(spec.grid)
    for combo in itertools.product(*(spec.grid[k] for k in keys)):
        overrides = dict(zip(keys, combo))
        for seed in spec.seeds:
            values = dict(spec.base)
            for key, value in overrides.items():
                set_key(values, key, value)
            set_key(values, "train.seed", seed)
            name = cell_name(overrides, seed)
            try:
                config = build_run_config(values)
            except ConfigError as exc:
                raise SpecError(f"{spec.path}: cell {name}: {exc}") from None
            result.append(Cell(name, len(result), overrides, seed, config))
    names = [c.name for c in result]
    if len(set(names)) != len(names):
        twice = next(n for n in names if names.count(n) > 1)
        raise SpecError(f"{spec.path}: two cells would both be named {twice!r}; make the grid's "
                        "values differ in more than punctuation.")
    return result

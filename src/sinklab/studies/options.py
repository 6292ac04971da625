"""A study's options: built from defaults, a TOML file's table, ``NAME.KEY=VALUE`` overrides
and command-line flags, each option named in a refusal as the user gave it (``named``); and
read back from the records a run wrote (``options_from``).
"""

from __future__ import annotations

import contextvars
import dataclasses
import re
import types
import typing
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sinklab.config import (
    FILE_KINDS,
    coerce,
    file_string_problem,
    read_toml_text,
    toml_text,
)
from sinklab.errors import ConfigError
from sinklab.studies.study import Study, all_studies

# ------------------------------------------------------------------------------ options


def option_fields(cls: type) -> list[dataclasses.Field[Any]]:
    return [f for f in dataclasses.fields(cls) if f.init and not f.name.startswith("_")]


def _hint(cls: type, name: str) -> Any:
    return typing.get_type_hints(cls)[name]


def _sequence_item(annotation: Any) -> Any:
    """The item type of ``tuple[X, ...]`` (optionally ``| None``), else None."""
    if isinstance(annotation, types.UnionType):
        args = [a for a in annotation.__args__ if a is not type(None)]
        annotation = args[0] if len(args) == 1 else annotation
    if typing.get_origin(annotation) is tuple:
        args = typing.get_args(annotation)
        if len(args) == 2 and args[1] is Ellipsis:
            return args[0]
    return None


def flag_of(cls: type, name: str) -> str:
    """The command-line flag of the option ``name``: its field's ``metadata["flag"]``, else
    ``--name-with-dashes``."""
    for f in dataclasses.fields(cls):
        if f.name == name:
            return f.metadata.get("flag", "--" + name.replace("_", "-"))
    return "--" + name.replace("_", "-")


# How each option of the options class being built was given: (class, field -> name as given).
_GIVEN: contextvars.ContextVar[tuple[type, dict[str, str]] | None] = contextvars.ContextVar(
    "sinklab_options_given", default=None)


GIVEN_ATTR = "_sinklab_given"  # the options' sources, kept on the built options


def named(opts: Any, name: str) -> str:
    """The option ``name`` of ``opts`` (an options dataclass or an instance of it) as the user
    gave it, for a message: the flag (``--tokens``) for a flag or a default, ``lm.n_tokens`` for
    an override ``lm.n_tokens=...``, ``config file 'x.toml': [lm] n_tokens`` for a config file's
    table. ``build_options`` records the sources; an options class's ``__post_init__`` names
    every option it refuses through this, e.g. ``f"{named(self, 'n_tokens')}={value!r} is not
    allowed"``."""
    cls = opts if isinstance(opts, type) else type(opts)
    given = _GIVEN.get()
    if given is not None and given[0] is cls and name in given[1]:
        return given[1][name]
    kept = getattr(opts, GIVEN_ATTR, None) if not isinstance(opts, type) else None
    if isinstance(kept, dict) and name in kept:
        return kept[name]
    return flag_of(cls, name)


def _as_given(message: str, cls: type, given: dict[str, str]) -> str:
    """A refusal that names an option by its flag (a study whose checks do not use ``named``)
    rewritten to name it as it was given."""
    for name, where in given.items():
        flag = flag_of(cls, name)
        if where != flag and re.match(re.escape(flag) + r"(?![\w-])", message):
            return where + message[len(flag):]
    return message


def coerce_option(study: str, cls: type, name: str, value: Any, key: str | None = None) -> Any:
    """A TOML value or command-line string turned into the option's type (ConfigError else,
    naming the option as ``key``, how it was given; default ``STUDY.NAME``)."""
    return coerce_typed(key or f"{study}.{name}", value, _hint(cls, name))


def coerce_typed(key: str, value: Any, annotation: Any) -> Any:
    """``value`` turned into the type ``annotation`` (``coerce_option``)."""
    item = _sequence_item(annotation)
    if item is not None:
        if isinstance(value, str):
            parts = [v.strip() for v in value.split(",") if v.strip()]
        elif isinstance(value, (list, tuple)):
            parts = list(value)
        else:
            raise ConfigError(f"{key}={value!r} is not allowed: give a list, or values "
                              "separated by commas.")
        return tuple(coerce(key, v, item) for v in parts)
    if annotation in (Path, Path | None):
        if value is None or (isinstance(value, str) and value.strip().lower() in ("", "none")):
            return None
        if not isinstance(value, str):
            raise ConfigError(f"{key}={value!r} is not allowed: it must be a path.")
        return Path(value)
    return coerce(key, value, annotation)


FILE_LISTS = {int: "integers", float: "numbers", bool: "booleans (true or false)"}


def typed_value(key: str, name: str, value: Any, annotation: Any, source: str) -> None:
    """Refuse a string where the option takes a number or a boolean, in a file whose values are
    typed (TOML, JSON): there ``"5"`` is text, not a number, and ``"yes"`` no boolean, as for a
    run's settings (``config.file_string_problem``). ``key`` names the option as given;
    ``source`` is ``"toml"`` (the refusal says what to write) or ``"json"`` (a file sinklab
    wrote). A command line's strings are parsed instead (``coerce_option``)."""
    item = _sequence_item(annotation)
    if item is None:
        problem = file_string_problem(name, value, annotation)
        if problem is None:
            return
        how = "is a string"
        if source == "json":
            kind = next(a for a in typing.get_args(annotation) or (annotation,)
                        if a is not type(None))
            raise ConfigError(f"{key}={value!r} is not allowed: it must be {FILE_KINDS[kind]}, "
                              "not a string.")
    else:
        if isinstance(value, str):
            texts, how = [value], "is a string"
        elif isinstance(value, (list, tuple)):
            texts, how = [v for v in value if isinstance(v, str)], "holds a string"
        else:
            return  # neither: coerce_typed refuses it
        if all(file_string_problem(name, v, item) is None for v in texts):
            return
        if source == "json":
            raise ConfigError(f"{key}={value!r} is not allowed: it must be a list of "
                              f"{FILE_LISTS[item]}, not a string.")
        try:
            typed = coerce_typed(key, value, annotation)
            problem = (f"write a list of {FILE_LISTS[item]}: {name} = "
                       f"[{', '.join(toml_text(v) for v in typed)}]")
        except ConfigError:
            problem = f"write a list of {FILE_LISTS[item]} without quotes"
    raise ConfigError(f"{key} = {value!r} {how}; {problem}.")


def build_options(study: Study, file: str | None = None, overrides: Sequence[str] = (),
                  flags: dict[str, Any] | None = None) -> Any:
    """The study's options: defaults < ``[NAME]`` table of the TOML ``file`` < ``NAME.KEY=VALUE``
    overrides < command-line flags (``flags``: field name -> value already typed)."""
    cls = study.options
    names = [f.name for f in option_fields(cls)]
    values: dict[str, Any] = {}
    given: dict[str, str] = {}  # each option as the user gave it, for messages (``named``)

    def put(name: str, value: Any, where: str, key: str, typed: bool) -> None:
        if name not in names:
            raise ConfigError(f"{where}: {study.name}.{name} is not an option of sinklab "
                              f"{study.name}; its options are "
                              f"{', '.join(f'{study.name}.{n}' for n in names)}.")
        given[name] = key
        if typed:  # a TOML file's values are typed: "5" is no number there, "yes" no boolean
            typed_value(key, name, value, _hint(cls, name), "toml")
        values[name] = coerce_option(study.name, cls, name, value, key)

    if file is not None:
        _, table = read_toml_text(file, "config file")
        known = {s.name for s in all_studies()} | {study.name}
        unknown = [k for k in table if k not in known]
        if unknown:  # one file may set several studies' options, each in its own table
            raise ConfigError(f"config file {file!r} has the table [{unknown[0]}], which is not "
                              f"a study's; its tables may be {', '.join(sorted(known))}.")
        section = table.get(study.name, {})
        if not isinstance(section, dict):
            raise ConfigError(f"config file {file!r}: {study.name} must be a table of options.")
        for name, value in section.items():
            put(name, value, f"config file {file!r}",
                f"config file {file!r}: [{study.name}] {name}", typed=True)
    for item in overrides:
        key, sep, value = item.partition("=")
        prefix, dot, name = key.strip().partition(".")
        if not sep or not dot or prefix != study.name:
            raise ConfigError(f"{item!r} is not an option override: write "
                              f"{study.name}.OPTION=VALUE, for example {study.name}."
                              f"{names[0] if names else 'seeds'}=...")
        put(name, value, "override", f"{study.name}.{name.strip()}", typed=False)
    for name, value in (flags or {}).items():  # flags: strings as typed, lists, or booleans
        if value is None:
            continue
        if name not in names:
            raise ConfigError(f"sinklab {study.name} has no option {name!r}.")
        given[name] = flag_of(cls, name)
        values[name] = value if isinstance(value, bool) else \
            coerce_option(study.name, cls, name, value, given[name])
    token = _GIVEN.set((cls, given))
    try:
        opts = cls(**values)
        # kept for the checks that run after the options are built (a study's ``check``)
        object.__setattr__(opts, GIVEN_ATTR, dict(given))
        return opts
    except TypeError as exc:  # a value of the wrong type reaching the dataclass
        raise ConfigError(f"sinklab {study.name}: {exc}.") from None
    except ConfigError as exc:
        raise ConfigError(_as_given(str(exc), cls, given)) from None
    finally:
        _GIVEN.reset(token)


def options_dict(opts: Any) -> dict[str, Any]:
    """The options as JSON-able values (paths as strings, tuples as lists)."""
    def plain(value: Any) -> Any:
        if isinstance(value, Path):
            return str(value)
        if isinstance(value, (tuple, list)):
            return [plain(v) for v in value]
        return value

    return {f.name: plain(getattr(opts, f.name)) for f in option_fields(type(opts))}



def options_from(study: Study, values: dict[str, Any], where: str = "options") -> Any:
    """The study's options from what ``options_dict`` wrote (a report's records), checked again
    by the options' own ``__post_init__``; a value that is not allowed is named as the records'
    own (``where``, e.g. ``docs/zoo.json: options``, then ``.seeds``), not as a flag."""
    cls = study.options
    given = {f.name: f"{where}.{f.name}" for f in option_fields(cls)}
    kwargs = {}
    for f in option_fields(cls):
        if f.name not in values:  # an option newer than the records: its default
            continue
        hint = _hint(cls, f.name)
        typed_value(given[f.name], f.name, values[f.name], hint, "json")
        kwargs[f.name] = coerce_typed(given[f.name], values[f.name], hint)
    token = _GIVEN.set((cls, given))
    try:
        return cls(**kwargs)
    except ConfigError as exc:
        raise ConfigError(_as_given(str(exc), cls, given)) from None
    finally:
        _GIVEN.reset(token)


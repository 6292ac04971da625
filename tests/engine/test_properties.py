"""Property tests (hypothesis): whatever a user types or writes, the config and sweep-spec
parsers answer with a valid config or one ``ConfigError`` sentence, never another exception.

Inputs are random ``section.field=value`` overrides, random TOML config files and sweep specs
built from the real keys and from junk, with values of every TOML type (huge integers, inf and
nan included), and random bytes.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from pathlib import Path
from unittest import mock

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sinklab.config import SECTIONS, RunConfig, allowed_keys, config_from_cli
from sinklab.errors import ConfigError
from sinklab.sweeps.spec import Spec, cells, load_spec

KEYS = allowed_keys()
WORDS = ["softmax", "relu", "auto", "none", "plain", "residual", "standard", "capped", "cpu",
         "cuda", "cuda:0", "true", "1e-3", "-1", "0", "16", "inf", "nan", "1e400", ""]
SETTINGS = settings(max_examples=150, deadline=None, database=None,
                    suppress_health_check=[HealthCheck.too_slow])

scalars = st.one_of(
    st.integers(min_value=-10, max_value=64),
    st.integers(),
    st.integers(min_value=10**300, max_value=10**400),  # beyond any float
    st.floats(allow_nan=True, allow_infinity=True),
    st.booleans(),
    st.sampled_from(WORDS),
    st.text(max_size=12),
)
keys = st.one_of(st.sampled_from(KEYS), st.text(max_size=15),
                 st.sampled_from([k.replace(".", "") for k in KEYS]))


def toml_value(value: object) -> str:
    """A value in TOML syntax (the generated files' writer)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    assert isinstance(value, dict)
    return "{" + ", ".join(f"{json.dumps(k)} = {toml_value(v)}" for k, v in value.items()) + "}"


def toml_document(data: dict[str, object]) -> str:
    lines = [f"{json.dumps(k)} = {toml_value(v)}" for k, v in data.items()
             if not isinstance(v, dict)]
    for name, table in data.items():
        if isinstance(table, dict):
            lines.append(f"[{json.dumps(name)}]")
            lines += [f"{json.dumps(k)} = {toml_value(v)}" for k, v in table.items()]
    return "\n".join(lines) + "\n"


def one_sentence(exc: ConfigError) -> bool:
    text = str(exc)
    return bool(text) and "\n" not in text and "Traceback" not in text


def written(text: str | bytes) -> Path:
    handle, name = tempfile.mkstemp(suffix=".toml")
    with os.fdopen(handle, "wb") as f:
        f.write(text if isinstance(text, bytes) else text.encode())
    return Path(name)


@SETTINGS
@given(st.lists(st.one_of(
    st.tuples(keys, st.one_of(scalars.map(str), st.sampled_from(WORDS))).map("=".join),
    st.text(max_size=20)), max_size=6))
def test_random_overrides_give_a_config_or_one_sentence(items):
    try:
        cfg = config_from_cli(items)
    except ConfigError as exc:
        assert one_sentence(exc), str(exc)
        return
    assert isinstance(cfg, RunConfig)
    assert RunConfig(**{k: type(getattr(cfg, k))(**v) for k, v in cfg.to_dict().items()}) == cfg


sections = st.dictionaries(st.one_of(st.sampled_from(list(SECTIONS)), st.text(max_size=8)),
                           st.one_of(st.dictionaries(st.one_of(
                               st.sampled_from([f.split(".")[1] for f in KEYS]),
                               st.text(max_size=8)), st.one_of(scalars, st.lists(scalars,
                                                                                 max_size=3)),
                               max_size=5), scalars), max_size=4)


def config_file_outcome(data: dict[str, object]) -> None:
    """Parse ``data`` written as a TOML config file: a RunConfig or one ConfigError sentence."""
    path = written(toml_document(data))
    try:
        cfg = config_from_cli([], str(path))
    except ConfigError as exc:
        assert one_sentence(exc), str(exc)
    else:
        assert isinstance(cfg, RunConfig)
    finally:
        path.unlink()


@SETTINGS
@given(sections)
def test_random_config_files_give_a_config_or_one_sentence(data):
    config_file_outcome(data)


@SETTINGS
@given(st.sampled_from(KEYS), st.one_of(scalars, st.lists(scalars, max_size=2)))
def test_any_value_of_any_key_in_a_file_gives_a_config_or_one_sentence(key, value):
    section, name = key.split(".")
    config_file_outcome({section: {name: value}})


@SETTINGS
@given(st.binary(max_size=200))
def test_random_bytes_as_a_config_or_spec_are_one_sentence(data):
    path = written(data)
    try:
        for parse in (lambda: config_from_cli([], str(path)), lambda: load_spec(path)):
            try:
                parse()
            except ConfigError as exc:
                assert one_sentence(exc), str(exc)
    finally:
        path.unlink()


grids = st.dictionaries(keys, st.one_of(st.lists(scalars, max_size=3), scalars), max_size=3)
specs = st.fixed_dictionaries({}, optional={
    "description": st.one_of(st.text(max_size=10), scalars),
    "seeds": st.one_of(st.integers(min_value=-2, max_value=4), st.integers(),
                       st.lists(st.integers(min_value=-1, max_value=5), max_size=4), scalars),
    "base": st.one_of(sections, scalars),
    "grid": st.one_of(grids, scalars),
    "extra": scalars,
})


@SETTINGS
@given(specs)
def test_random_sweep_specs_give_a_spec_or_one_sentence(data):
    path = written(toml_document(data))
    try:
        with mock.patch.dict(os.environ, {"SINKLAB_MAX_CELLS": "200"}):
            spec = load_spec(path)
    except ConfigError as exc:
        assert one_sentence(exc), str(exc)
    else:
        assert isinstance(spec, Spec)
        names = [c.name for c in cells(spec)]
        assert len(set(names)) == len(names)  # every cell has a name of its own
    finally:
        path.unlink()

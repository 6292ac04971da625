"""sinklab's studies: the experiment commands, each a ``Study`` declaration (``base``).

    reproduction  sinklab reproduce   the paper's 1x1, 2x2 and 4x4 models, softmax and ReLU
    theorem       sinklab theory      constructions, the sink family, denied sinks, frontier
    zoo           sinklab zoo         every attention rule on the task
    extensions    sinklab extensions  past the paper: lengths, trigger counts, blocks, emergence
    real_models   sinklab lm          sinks in real pretrained models

``register(study)`` adds a study: it gets its subcommand, its folder kind and its place in
``sinklab report`` from its declaration alone.
"""

from __future__ import annotations

import importlib

from sinklab.runs import folders
from sinklab.studies.base import Study


class Interrupted(KeyboardInterrupt):
    """A study stopped by an interrupt, with what it keeps in words (``sinklab.cli`` prints
    them, instead of the words for studies that keep finished runs)."""


BUILT_IN = ("reproduction", "theorem", "zoo", "extensions", "real_models")
STUDIES: dict[str, Study] = {}
_loaded = False


def register_kind(study: Study) -> None:
    """Let the folders module know the study's folder kind."""
    folders.KINDS.setdefault(study.name, f"{study.name} folder")


def register(study: Study) -> Study:
    """Add ``study`` (its name must be new and not one of sinklab's other commands)."""
    from sinklab.cli import RESERVED

    if study.name in STUDIES or study.name in RESERVED:
        raise ValueError(f"a study or command named {study.name!r} exists already")
    STUDIES[study.name] = study
    register_kind(study)
    return study


def unregister(name: str) -> None:
    """Remove a study added by ``register`` (tests declare their own)."""
    STUDIES.pop(name, None)


def all_studies() -> list[Study]:
    """Every registered study, sinklab's own first, in the order the gathered report uses."""
    global _loaded
    if not _loaded:
        _loaded = True
        for module in BUILT_IN:
            importlib.import_module(f"sinklab.studies.{module}")
    return list(STUDIES.values())


def get(name: str) -> Study:
    for study in all_studies():
        if study.name == name:
            return study
    raise KeyError(name)

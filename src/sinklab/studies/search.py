"""The learning-rate ladder search that ``sinklab zoo`` and ``sinklab pretrain`` share.

A study screens a few starting rates; while the best rate is the smallest or largest screened,
it screens the next rate of its ladder beyond it (``next_rate``), until the best rate is inside
the screened ones or at the ladder's end. ``replay`` walks that search again from whatever has
finished, so a study interrupted between rounds resumes where it stopped: it says which rates
are screened, which one to screen next and, once none is left, the best rate. The zoo scores a
rate by its screening seeds (``rate_score``: the share that reached the stop rule, then the
steps, then the error); ``sinklab pretrain`` by a validation loss of its own.

    next_rate([3e-4, 1e-3, 3e-3], 3e-3, ladder)  # 1e-2: the best rate is at the top edge
    replay((3e-4, 1e-3, 3e-3), ladder, runs_at)  # Search(tried, pending, best, at_ladder_end)
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

Runs = list[dict[str, Any]]  # the summaries of one rate's screening runs


def rate_score(runs: Runs) -> tuple[float, float, float]:
    """How good a rate's screening runs are, smaller is better: minus the share that reached
    the stop rule, the median steps (a run that did not reach counts as infinitely many), the
    median final training L∞ error (a diverged run's as infinite)."""
    share = sum(r["converged"] for r in runs) / len(runs)
    steps = float(np.median([r["steps"] if r["converged"] else math.inf for r in runs]))
    linf = float(np.median([r["train_linf"] if r["train_linf"] is not None
                            and math.isfinite(r["train_linf"]) else math.inf for r in runs]))
    return -share, steps, linf


def best_rate(tried: dict[float, Runs]) -> float:
    """The best screened rate by ``rate_score`` (ties: the smaller rate)."""
    return min(tried, key=lambda lr: (*rate_score(tried[lr]), lr))


def next_rate(tried: list[float], best: float, ladder: tuple[float, ...]) -> float | None:
    """The ladder's next rate beyond the edge where the best rate sits, or None: the best is
    inside the screened rates, or at the ladder's end."""
    at = ladder.index(best)
    if best == min(tried) and at > 0:
        return ladder[at - 1]
    if best == max(tried) and at < len(ladder) - 1:
        return ladder[at + 1]
    return None


@dataclass
class Search:
    """Where a learning-rate search stands: the screened rates with their runs' summaries, the
    rates still to screen, and the best rate once none are."""

    tried: dict[float, Any]  # rate -> what it was judged by (the zoo: its runs; pretrain: a loss)
    pending: list[float]
    best: float | None
    at_ladder_end: bool  # the best rate is at an edge of the screened rates and of the ladder


def replay(start: tuple[float, ...], ladder: tuple[float, ...],
           runs_at: Callable[[float], Any | None], *, extend: bool = True,
           best_rate: Callable[[dict[float, Any]], float] = best_rate) -> Search:
    """The search from the rates ``start``, stepping along ``ladder`` (unless not ``extend``),
    replayed from ``runs_at(lr)``: what a rate is judged by once its screening has finished
    (the zoo: its runs' summaries), or None while it has not (then the search stops there,
    with that rate and those after it pending); ``best_rate`` picks the best of those tried.
    """
    tried: dict[float, Any] = {}
    queue = list(start)
    while queue:
        lr = queue.pop(0)
        runs = runs_at(lr)
        if runs is None:
            return Search(tried, [lr, *queue], None, False)
        tried[lr] = runs
        if queue or not extend:
            continue
        more = next_rate(list(tried), best_rate(tried), ladder)
        if more is not None:
            queue.append(more)
    best = best_rate(tried)
    edge = best in (min(tried), max(tried)) and len(tried) > 1
    return Search(tried, [], best, edge and next_rate(list(tried), best, ladder) is None)

"""Numbers and tables as text, the same in the terminal, the reports and the gathered page:
Markdown tables, "mean ± sd" over seeds, short scientific notation and masses near 1 (the
finite values themselves come from ``sinklab.stats``). On the ground floor, so that the
science (``sinklab.theory.sink``), the run kinds and the sweeps print what the reports print."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from sinklab import stats


def _cell(value: object) -> str:
    return str(value).replace("|", "\\|")  # a literal | (as in <|im_start|>) would split cells


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A GitHub-flavoured Markdown table; a "|" inside a cell is escaped."""
    lines = ["| " + " | ".join(_cell(h) for h in headers) + " |",
             "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def mean_sd_text(values: Sequence[float | None], digits: int = 3, fmt: str | None = None) -> str:
    """"mean ± sd" of the finite values over seeds (sample sd), or the single value when there
    is one seed, "n/a" when there is none; ``fmt`` (e.g. ".2e") replaces the default ``digits``
    decimals."""
    spec = fmt or f".{digits}f"
    arr = np.asarray(stats.finite(values), dtype=float)
    if arr.size == 0:
        return "n/a"
    if arr.size == 1:
        return f"{arr[0]:{spec}}"
    return f"{arr.mean():{spec}} ± {arr.std(ddof=1):{spec}}"


def sci(value: float | None) -> str:
    """A number in short scientific notation (errors span many orders of magnitude)."""
    if value is None or not math.isfinite(value):
        return "n/a"
    return f"{value:.2e}"


def fixed(value: float | None, digits: int = 2) -> str:
    """A number with ``digits`` decimals, or "n/a" when it is missing or not finite."""
    if value is None or not math.isfinite(value):
        return "n/a"
    return f"{value:.{digits}f}"


def mass_text(mass: float, off: float | None = None) -> str:
    """A BOS mass (or any weight) for the terminal, with 3 significant digits and never shown
    as exactly 1 or 0 unless it is: ``1 - 4.00e-05`` within 0.01 of 1 (``off``, 1 - mass, where
    it is known more precisely than ``mass``), ``4.00e-05`` below 0.01, else ``0.521``."""
    if off is None:
        off = 1.0 - mass
    if mass != mass or mass in (0.0, 1.0) or abs(mass) == float("inf"):
        return f"{mass:g}"  # nan, inf, exactly 0 or 1
    if 0 < off < 0.01:
        return f"1 - {off:.2e}"
    if -0.01 < off < 0:  # a row that need not sum to 1 can put a little more than 1 on BOS
        return f"1 + {-off:.2e}"
    return f"{mass:.2e}" if abs(mass) < 0.01 else f"{mass:.3g}"

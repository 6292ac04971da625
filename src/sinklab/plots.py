"""Figures drawn from results files: attention heat maps and per-head BOS-mass plots.

Every drawing function takes an explicit matplotlib ``Axes`` or ``Figure`` (never pyplot's global
state); the ``plot_*`` functions read a results folder and write PNGs. Heat maps follow the
paper's convention: Blues from 0 to 1, positions 1-indexed, so "query 8" is the trigger at
0-indexed position 7.

    sinklab plot runs/relu-2x2 runs/seeds     # plot_runs: attention.png in each finished run
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from contextlib import ExitStack
from pathlib import Path

import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from sinklab.definitions import SINK_HEAD_THRESHOLD
from sinklab.runs import folders
from sinklab.runs.files import read_json, read_npz, replace_from, temporary_path

DPI = 80  # small PNGs: the docs commit them


def save_figure(fig: Figure, path: Path) -> None:
    """Save ``fig`` as PNG atomically (temporary file, then rename)."""

    def write(tmp: Path) -> None:
        with tmp.open("xb") as f:
            fig.savefig(f, format="png", dpi=DPI, bbox_inches="tight")

    replace_from(temporary_path(path), path, write)


def heatmap(ax: Axes, matrix: np.ndarray, title: str, vmax: float | None = None) -> None:
    """Draw one (query, key) attention map with 1-indexed positions and a colour bar."""
    seq_len = matrix.shape[-1]
    vmax = max(1.0, float(np.nanmax(matrix))) if vmax is None else vmax
    extent = (0.5, seq_len + 0.5, seq_len + 0.5, 0.5)
    image = ax.imshow(matrix, cmap="Blues", vmin=0.0, vmax=vmax, extent=extent,
                      interpolation="nearest")
    ticks = list(range(2, seq_len + 1, max(2, seq_len // 8)))
    ax.set_xticks(ticks)
    ax.set_yticks(ticks)
    ax.set_xlabel("Key position")
    ax.set_ylabel("Query position")
    ax.set_title(title)
    ax.figure.colorbar(image, ax=ax, fraction=0.046, pad=0.04)


def head_grid(fig: Figure, maps: np.ndarray, label: str = "") -> None:
    """Draw (layers, heads, L, L) maps as a grid of panels titled "Layer l, Head h"."""
    n_layers, n_heads = maps.shape[:2]
    axes = fig.subplots(n_layers, n_heads, squeeze=False)
    for layer in range(n_layers):
        for head in range(n_heads):
            heatmap(axes[layer, head], maps[layer, head],
                    f"{label}Layer {layer + 1}, Head {head + 1}")


def mean_std_row(fig: Figure, panels: Sequence[tuple[str, np.ndarray, np.ndarray]]) -> None:
    """One row of (mean, std) map pairs, e.g. the paper's Fig. 3: softmax and ReLU, 1x1."""
    axes = fig.subplots(1, 2 * len(panels), squeeze=False)[0]
    for i, (name, mean, std) in enumerate(panels):
        heatmap(axes[2 * i], mean, f"{name}: mean", vmax=max(1.0, float(mean.max())))
        heatmap(axes[2 * i + 1], std, f"{name}: std", vmax=max(1.0, float(mean.max())))


def bos_mass_strip(ax: Axes, groups: Sequence[tuple[str, np.ndarray]]) -> None:
    """Per-head non-trigger BOS mass for several groups: one column per group, one dot per
    (seed, layer, head), with the sink-head threshold as a dashed line."""
    for i, (_, values) in enumerate(groups):
        values = np.asarray(values, dtype=float).ravel()
        offsets = np.linspace(-0.25, 0.25, len(values)) if len(values) > 1 else np.zeros(1)
        ax.scatter(i + offsets, values, s=14, alpha=0.7)
    ax.axhline(SINK_HEAD_THRESHOLD, color="grey", linestyle="--", linewidth=1,
               label=f"sink head (>= {SINK_HEAD_THRESHOLD})")
    ax.set_xticks(range(len(groups)))
    ax.set_xticklabels([name for name, _ in groups], rotation=30, ha="right")
    ax.set_ylim(-0.05, 1.05)
    ax.set_ylabel("non-trigger BOS mass")
    ax.legend(loc="center right", fontsize="small")


def plot_run(run_dir: Path) -> Path:
    """Write ``attention.png`` for a run folder: the mean map of every (layer, head) over the
    test set, and for a single head also its standard deviation."""
    run_dir = Path(run_dir)
    summary = read_json(run_dir / "summary.json")
    maps = read_npz(run_dir / "attention.npz")
    n_layers, n_heads = maps["mean"].shape[:2]
    name = f"{summary['attention']} {n_layers}x{n_heads}, seed {summary['seed']}"
    if n_layers == n_heads == 1:
        fig = Figure(figsize=(9, 3.6))
        mean_std_row(fig, [(name, maps["mean"][0, 0], maps["std"][0, 0])])
    else:
        fig = Figure(figsize=(3.6 * n_heads, 3.2 * n_layers))
        head_grid(fig, maps["mean"])
        fig.suptitle(f"{name}: mean attention over the test set")
    fig.tight_layout()
    path = run_dir / "attention.png"
    save_figure(fig, path)
    return path


def plot_runs(paths: Sequence[Path]) -> Iterator[tuple[Path, Path | None]]:
    """Draw ``attention.png`` into each finished run that ``paths`` name (a run folder, or a
    ``sinklab train --seeds`` folder: each of its seed runs); yield (run folder, figure), with
    None for a diverged run, whose maps are not finite.

    Every path is checked (``folders.finished_runs``) and every folder's lock taken before
    anything is drawn; the locks are held until the last figure is written. Each figure gets a
    fresh ``Figure``: clearing and reusing one per shape measured no faster, since the time goes
    into laying out and rendering the text and images, not into building the figure.
    """
    groups = [(Path(p), folders.finished_runs(Path(p))) for p in paths]
    runs: dict[str, Path] = {}  # a run named twice (itself and in its --seeds folder) is drawn once
    with ExitStack() as held:
        locked: set[str] = set()
        for top, members in groups:
            for folder in [top, *members]:
                if os.path.abspath(folder) not in locked:
                    locked.add(os.path.abspath(folder))
                    held.enter_context(folders.hold(folder))
            for run in members:
                runs.setdefault(os.path.abspath(run), run)
        for run in runs.values():
            if read_json(run / "summary.json")["status"] == "diverged":
                yield run, None
            else:
                yield run, plot_run(run)

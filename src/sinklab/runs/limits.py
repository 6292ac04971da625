"""Size limits: a run's memory and a grid's size, estimated before anything is allocated.

A setting that would need more memory than the machine can give (``model.n_layers=1000000000``,
``task.seq_len=100000``, ``--seeds 1000000000``) or a grid too large to expand is refused with
one sentence that gives the estimate and the limit. The limits are settings:

- ``SINKLAB_MAX_MEMORY`` (e.g. ``64G``, ``512M``, or bytes): what one command may use for its
  runs; default half of this machine's physical memory (on a GPU, the device's memory).
- ``SINKLAB_MAX_CELLS``: the most runs one sweep or experiment may declare; default 100,000.

A local Ray instance's object store comes out of the memory limit too
(``ray_object_store_bytes``), so that Ray's own sizing (30 % of the machine's free memory) cannot
exceed what the command may use.

The estimates are upper bounds of the tensors a run keeps alive at once, checked against
measured peaks in ``benchmarks/memory_estimate.py``; they never allocate.
"""

from __future__ import annotations

import math
import os
import re
from typing import Any

from sinklab import heavy
from sinklab.config import RunConfig
from sinklab.errors import ConfigError

MEMORY_ENV = "SINKLAB_MAX_MEMORY"
CELLS_ENV = "SINKLAB_MAX_CELLS"
DEFAULT_CELLS = 100_000
FLOAT = 4  # bytes of a float32
# What one extra worker process costs before it trains anything: Python, torch and sinklab
# imported (about 280 MB measured here; rounded up).
WORKER_BYTES = 400 * 2**20
# What a run needs beyond its tensors: the allocator's pools and the kernels loaded on first use
# (35 MB measured for the smallest run here).
RUN_BYTES = 64 * 2**20

# A local Ray instance's object store: a quarter of the memory limit, at most 2 GiB (sinklab's
# objects are a job's configs, a plugin's text and a cell's results: kilobytes), at least Ray's
# own minimum (ray_constants.OBJECT_STORE_MINIMUM_MEMORY_BYTES, 75 MiB in Ray 2.60).
RAY_STORE_SHARE = 4
RAY_STORE_MAX = 2 * 2**30
RAY_STORE_MIN = 75 * 2**20

_UNITS = {"": 1, "b": 1, "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}


def format_bytes(n: float) -> str:
    """1536 -> '1.5 KiB'; sizes in binary units, three significant digits."""
    for unit, size in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            value = n / size
            return f"{value:,.0f} {unit}" if value >= 1000 else f"{value:.3g} {unit}"
    return f"{n:.0f} bytes"


def parse_size(text: str, name: str = MEMORY_ENV) -> int:
    """'64G', '512MiB', '1.5t', '1000000' -> bytes; anything else is a ConfigError."""
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([kmgtKMGT]?)(?:i?[bB])?\s*", text)
    value = float(match.group(1)) * _UNITS[match.group(2).lower()] if match else math.nan
    if not (math.isfinite(value) and value >= 1):
        raise ConfigError(f"{name}={text!r} is not allowed: give a size such as 16G, 512M or a "
                          "number of bytes.")
    return int(value)


def physical_memory() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def memory_limit(device: Any = None) -> int:
    """The bytes one command may use: ``SINKLAB_MAX_MEMORY``, else half the machine's memory
    (a CUDA device: its own memory)."""
    text = os.environ.get(MEMORY_ENV)
    if text:
        return parse_size(text)
    if device is not None and getattr(device, "type", str(device)).startswith("cuda"):
        import torch  # only for a CUDA device: this module also serves the help texts

        return int(torch.cuda.get_device_properties(device).total_memory)
    total = physical_memory()
    return total // 2 if total else 8 * 2**30


def ray_object_store_bytes() -> int:
    """The object store of a local Ray instance that sinklab starts: ``memory_limit()`` (the
    ``SINKLAB_MAX_MEMORY`` setting) / ``RAY_STORE_SHARE``, at most ``RAY_STORE_MAX`` and at
    least Ray's minimum ``RAY_STORE_MIN``. A cluster's store is the cluster's own."""
    return max(RAY_STORE_MIN, min(memory_limit() // RAY_STORE_SHARE, RAY_STORE_MAX))


def check_settings() -> None:
    """Read the limit settings (``SINKLAB_MAX_MEMORY``, ``SINKLAB_MAX_CELLS``) once, so that a
    value that is not allowed is refused, naming it, before a command plans or prints anything."""
    memory_limit()
    cell_limit()


def cell_limit() -> int:
    text = os.environ.get(CELLS_ENV)
    if not text:
        return DEFAULT_CELLS
    if not re.fullmatch(r"\s*[0-9]+\s*", text) or int(text) < 1:
        raise ConfigError(f"{CELLS_ENV}={text!r} is not allowed: give a whole number >= 1.")
    return int(text)


# -------------------------------------------------------------------------- estimates


def parameters(cfg: RunConfig) -> int:
    """Weights of one model: four d x d matrices per head and layer, and a standard block's
    MLP (width 4d) and LayerNorms."""
    d, m = cfg.task.d_model, cfg.model
    per_layer = 4 * m.n_heads * d * d + 4 * m.n_heads  # rule parameters are per head
    if m.block == "standard":
        per_layer += 8 * d * d + 9 * d
    return m.n_layers * per_layer


def forward_bytes(cfg: RunConfig, n_sequences: int, members: int = 1,
                  itemsize: int = FLOAT) -> int:
    """An evaluation forward pass over ``n_sequences`` with every layer's weights returned
    and the metrics computed from them (the weights stacked, and a few tensors of their size
    for the per-row metrics)."""
    t, d, m = cfg.task.seq_len, cfg.task.d_model, cfg.model
    weights = members * m.n_layers * n_sequences * m.n_heads * t * t
    per_layer = members * n_sequences * m.n_heads * t * d * 4  # q, k, v and each head's output
    data = n_sequences * t * d * 3  # inputs, targets, outputs
    return itemsize * (6 * weights + per_layer + members * data)


def run_bytes(cfg: RunConfig, members: int = 1) -> int:
    """Training ``members`` models of ``cfg`` as one ensemble and evaluating them: the
    weights with Adam's state, one step's activations kept for backward and their gradients,
    a block of the data stream's inputs and targets, and the evaluation on the test set."""
    task = heavy("task")

    t, d, m = cfg.task.seq_len, cfg.task.d_model, cfg.model
    b = cfg.train.batch_size
    params = 7 * members * parameters(cfg)  # weights, gradients, two moments, temporaries
    scores = members * m.n_layers * b * m.n_heads * t * t  # per layer: scores and weights
    heads = members * m.n_layers * b * m.n_heads * t * d  # per layer: q, k, v, head outputs
    mlp = members * m.n_layers * b * t * 4 * d * (m.block == "standard")
    step = 8 * scores + 10 * heads + 6 * mlp + 3 * members * b * t * d
    step += 2 * task.TrainStream.BLOCK * members * b * t * d  # the stream's x and y for a block
    return (RUN_BYTES + FLOAT * (params + step)
            + forward_bytes(cfg, cfg.eval.n_sequences, members))


def check_memory(need: int, what: str, device: Any = None) -> None:
    """Raise ConfigError when ``need`` bytes exceed the memory limit."""
    limit = memory_limit(device)
    if need > limit:
        source = (f"{MEMORY_ENV}" if os.environ.get(MEMORY_ENV)
                  else f"half this machine's memory; set {MEMORY_ENV}, e.g. "
                       f"{MEMORY_ENV}=64G, to allow more")
        raise ConfigError(f"{what} needs about {format_bytes(need)} of memory, more than the "
                          f"limit of {format_bytes(limit)} ({source}).")


def shape(cfg: RunConfig) -> str:
    """What sets a run's size, in words."""
    return (f"{cfg.model.attention} {cfg.model.n_layers}x{cfg.model.n_heads}, seq_len "
            f"{cfg.task.seq_len}, d_model {cfg.task.d_model}, batch {cfg.train.batch_size}, "
            f"{cfg.eval.n_sequences} test sequences")


def check_run(cfg: RunConfig, members: int = 1, what: str | None = None,
              device: Any = None) -> None:
    """Refuse an ensemble of ``members`` runs of ``cfg`` that would not fit in memory (on
    ``device``, default the one the config names)."""
    label = what or (f"training {members} models ({shape(cfg)}) as one ensemble" if members > 1
                     else f"a run ({shape(cfg)})")
    check_memory(run_bytes(cfg, members), label, device if device is not None else device_of(cfg))


def members_that_fit(cfg: RunConfig, wanted: int, what: str) -> int:
    """The most runs of ``cfg``, up to ``wanted``, that fit in memory as one ensemble; a run
    that does not fit even alone is refused, naming ``what`` (e.g. a sweep cell)."""
    check_run(cfg, 1, f"{what} ({shape(cfg)})")
    limit = memory_limit(device_of(cfg))
    members = wanted
    while members > 1 and run_bytes(cfg, members) > limit:
        members -= 1
    return members


def device_of(cfg: Any) -> Any:
    """The CUDA device a run's ``train.device`` names, whose memory is its limit; None (this
    machine's memory) for the CPU, ``auto`` or a machine without CUDA. Any settings with a
    ``train.device``: task runs and language-model runs."""
    name = cfg.train.device
    if name == "auto" or not name.startswith("cuda"):
        return None
    import torch  # torch: this module also serves the help texts

    return torch.device(name) if torch.cuda.is_available() else None


def check_cells(count: int, what: str) -> None:
    """Refuse ``count`` runs (cells of a grid, runs of an experiment) above the cell limit."""
    limit = cell_limit()
    if count > limit:
        raise ConfigError(f"{what} declares {count:,} runs, more than the limit of {limit:,} "
                          f"({CELLS_ENV}; set it higher to allow more).")


def workers_that_fit(job_bytes: list[int], workers: int, explicit: bool) -> int:
    """How many worker processes can run the largest jobs side by side within the limit.

    The default worker count is lowered until they fit; an explicit ``--workers`` that does not
    fit is refused. A single job that does not fit is refused either way.
    """
    limit = memory_limit()
    biggest = sorted(job_bytes, reverse=True)
    wanted = max(1, min(workers, len(biggest)))  # a worker without a job costs nothing

    def need(n: int) -> int:
        return sum(biggest[:n]) + (WORKER_BYTES * n if n > 1 else 0)

    fitting = wanted
    while fitting > 1 and need(fitting) > limit:
        fitting -= 1
    if explicit and fitting < wanted:
        # named as the user gave it: more workers than jobs start only as many as there are jobs
        needs = "needs" if wanted == workers else \
            f"would run {wanted:,} jobs side by side, which need"
        raise ConfigError(f"--workers {workers} {needs} about {format_bytes(need(wanted))} "
                          f"of memory (each worker about {format_bytes(WORKER_BYTES)} plus its "
                          f"job), more than the limit of {format_bytes(limit)} ({MEMORY_ENV}); "
                          f"use --workers {fitting} or fewer.")
    return fitting

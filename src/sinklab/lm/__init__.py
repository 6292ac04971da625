"""Real pretrained models, offline: the same measurements and edits as on the toy models.

    sources        where a model's local files and the probe texts come from (no torch)
    loading        read a model's files before loading it, load it, probe it, accumulate metrics
    capture        name and hook the layers of Hugging Face models (``run_with_cache``)
    interventions  edits as hooks: the first key hidden, its value zeroed, its mass capped,
                   StreamingLLM's cache, head ablations; next-token losses
    trigger_heads  trigger-conditional heads found by a permutation test
    head_sets      sets of heads against random control sets, two-level (heads x probes)
                   bootstrap (numpy only)
    survey, edits  the computation of ``sinklab lm`` (declared in ``sinklab.studies.lm``)

Needs the extra ``sinklab[lm]``. The names researchers use are reachable here
(``sinklab.lm.load``, ``sinklab.lm.run_with_cache``, ``sinklab.lm.interventions``); they are
imported on first use, so that ``sinklab.lm.sources`` stays free of torch.
"""

import importlib
from typing import Any

EXPORTS = {  # name -> the module of sinklab.lm that defines it
    "locate": "sources", "probe_texts": "sources", "Source": "sources",
    "ModelInfo": "loading", "LoadedModel": "loading", "Probes": "loading", "inspect": "loading",
    "load": "loading", "text_probes": "loading", "random_probes": "loading",
    "run": "capture", "run_with_cache": "capture",
}
__all__ = [*EXPORTS, "interventions"]


def __getattr__(name: str) -> Any:
    if name in EXPORTS:
        return getattr(importlib.import_module(f"sinklab.lm.{EXPORTS[name]}"), name)
    if name == "interventions":
        return importlib.import_module("sinklab.lm.interventions")
    raise AttributeError(f"module 'sinklab.lm' has no attribute {name!r}")

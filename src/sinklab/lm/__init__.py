"""Real pretrained models, offline: the same measurements and edits as on the toy models.

    loading        find a model's local files, read them before loading, load, probe texts
    capture        name and hook the layers of Hugging Face models (``run_with_cache``)
    interventions  edits as hooks: the first key hidden, its value zeroed, its mass capped,
                   StreamingLLM's cache, head ablations; next-token losses
    trigger_heads  trigger-conditional heads found by a permutation test
    survey, edits  the computation of ``sinklab lm`` (``sinklab.studies.real_models``)

Needs the extra ``sinklab[lm]``.
"""

from sinklab.lm import interventions
from sinklab.lm.capture import run, run_with_cache
from sinklab.lm.loading import (
    LoadedModel,
    ModelInfo,
    Probes,
    inspect,
    load,
    locate,
    probe_texts,
    random_probes,
    text_probes,
)

__all__ = ["LoadedModel", "ModelInfo", "Probes", "inspect", "interventions", "load", "locate",
           "probe_texts", "random_probes", "run", "run_with_cache", "text_probes"]

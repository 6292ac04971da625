"""sinklab's studies: the experiment commands, each a ``Study`` declaration run by ``base``.

    reproduction  sinklab reproduce   the paper's 1x1, 2x2 and 4x4 models, softmax and ReLU
    theorem       sinklab theory      constructions, the sink family, denied sinks, frontier
    zoo           sinklab zoo         every attention rule on the task
    extensions    sinklab extensions  past the paper: lengths, trigger counts, blocks, emergence
    real_models   sinklab lm          sinks in real pretrained models
    pretraining   sinklab pretrain    small LMs pretrained on real text, one per attention rule

A declaration says what to train, what to read from the runs, which claims to test and what to
draw; the computation it calls lives with its concern (``sinklab.theory``, ``sinklab.lm``, the
engine) and is imported when the study runs, so that declaring the commands needs no torch.
``register(study)`` adds a study: it gets its subcommand, its folder kind and its place in
``sinklab report`` from its declaration alone.
"""

from sinklab.studies import extensions, pretraining, real_models, reproduction, theorem, zoo
from sinklab.studies.base import Study, all_studies, get, register, register_kind, unregister

BUILT_IN = (reproduction, theorem, zoo, extensions, real_models, pretraining)  # the report's order
for _module in BUILT_IN:
    register(_module.STUDY)

__all__ = ["BUILT_IN", "Study", "all_studies", "get", "register", "register_kind", "unregister"]

"""sinklab's studies: the experiment commands, each declared once and run by ``runner``.

    reproduce     sinklab reproduce   the paper's 1x1, 2x2 and 4x4 models, softmax and ReLU
    theory        sinklab theory      constructions, the sink family, denied sinks, frontier
    zoo           sinklab zoo         every attention rule on the task
    extensions    sinklab extensions  past the paper: lengths, trigger counts, blocks, emergence
    lm            sinklab lm          sinks in real pretrained models
    pretrain      sinklab pretrain    small LMs pretrained on real text, one per attention rule

Each study is two files: ``NAME.py``, the declaration (its options, the runs it trains, its
report), which needs no torch so that declaring the commands and their help stay light; and
``NAME_analysis.py`` (with ``NAME_claims.py`` or ``NAME_records.py`` where it is long), which
turns finished runs into records, claims and figures with the science of ``sinklab.theory``,
``sinklab.lm`` and the engine, imported at its top and loaded once, when the study runs
(``Study.analysis``). The machinery they share: ``study`` (the declaration and its registry),
``options``, ``runner``, ``outputs``, ``render`` with ``templates/``, ``reference`` (the
literature's numbers) and ``search`` (the learning-rate ladder of zoo and pretrain).
``register(study)`` adds a study: it gets its subcommand, its folder kind and its place in
``sinklab report`` from its declaration alone.
"""

from sinklab.studies import extensions as _extensions
from sinklab.studies import lm as _lm
from sinklab.studies import pretrain as _pretrain
from sinklab.studies import reproduce as _reproduce
from sinklab.studies import theory as _theory
from sinklab.studies import zoo as _zoo
from sinklab.studies.study import Study, all_studies, get, register, register_kind, unregister

BUILT_IN = (_reproduce, _theory, _zoo, _extensions, _lm, _pretrain)  # the report's order
for _module in BUILT_IN:
    register(_module.STUDY)

__all__ = ["BUILT_IN", "Study", "all_studies", "get", "register", "register_kind", "unregister"]

"""``sinklab lm``: the toy task's sink metrics on real pretrained models, the trigger-conditional
heads in them tested against a permutation null, and interventions on them measured by the loss.

For each model (``--model``, repeatable: smollm2, minilm, a path, or a Hugging Face id already in
the local cache) it runs two probe sets, natural text and random-token sequences, each with and
without the tokenizer's BOS (or [CLS] ... [SEP]) added, through the model loaded from local
files (``sinklab.lm.loading``). The natural text is the project's English passages, or the user's
own texts (``--probes FILE``, ``--text``), each keeping its own length up to ``--tokens``.

Before anything is loaded or written (``check``), every model is read without its weights
(``lm.inspect``) and each option checked against it: ``--tokens`` against its positions, the
memory its work needs against the limit; what the texts are too short to measure is said then
too. A short text is data: each measurement counts the probes and positions it rests on, and
one with none says what length it needs ("not measured: needs texts of at least N tokens").
Each model's analysis is kept in ``cache/{model}.json`` with the settings it depends on (the
texts' digest among them), so a rerun with the same ``--out`` keeps every model already
analysed; while it runs, each finished stage is kept in ``cache/{model}.partial.json``, so an
interrupted or failed run resumes from its last finished stage. The
records hold every (layer, head) value and every probe's rates; the claims compare a decoder's
Gu sink rate on random tokens with the range Gu et al. report for open LMs, with the probe as
the unit. Then, on the first ``--intervene`` natural probes, the interventions of
``sinklab.lm.edits`` (kept in ``cache/{model}-interventions.json``) and the
claims of the paper's story that they test, each a contrast of the sink's units with random
ones (``sinklab.studies.lm_contrasts``)::

    sinklab lm --model smollm2 --model minilm --out results/lm
    sinklab lm --model HuggingFaceTB/SmolLM2-135M --probes my_texts.jsonl --out results/mine

This module is the declaration (the options, the primary claims, ``STUDY``) and stays free of
torch; ``sinklab.studies.lm_analysis`` checks the inputs, collects the records, decides the
claims and draws the figures.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sinklab import claims as cl
from sinklab.claims import Claim
from sinklab.config import check_count
from sinklab.errors import ConfigError
from sinklab.lm import settings, sources
from sinklab.lm.settings import SurveySettings
from sinklab.studies.options import named
from sinklab.studies.study import Study

MIN_TOKENS = 8
DEFAULT_BATCH = 16
# natural probes the interventions run on: every head is ablated three ways on them, about
# 810 partial passes for SmolLM2, 1.3 s each for 16 probes of 65 tokens on two CPU cores
INTERVENE_PROBES = 16
ABLATE_HEADS = 12
CAP_EPS = 0.5
WINDOW = 16
MAX_COUNT = 100_000  # the largest --intervene, --ablate-heads or --window taken
MAX_TOKENS = 1_000_000  # the largest --tokens taken before any model is read


def _packaged_help() -> str:
    return ", ".join(f"{name} (package {package.replace('_', '-')})"
                     for name, (package, _, _) in sources.PACKAGED.items())


@dataclass
class LMOptions:
    """What ``sinklab lm`` analyses; every value is checked on creation (the probe file's
    contents by ``check``, before any model is loaded)."""

    models: tuple[str, ...] = field(default=("smollm2",), metadata={
        "help": f"{_packaged_help()}, a Hugging Face model folder, a .gguf file, or a Hugging "
                "Face id (ORG/NAME) already in the local cache (HF_HUB_CACHE or HF_HOME; "
                "never downloaded); repeat for several (default: smollm2)",
        "flag": "--model", "append": True, "metavar": "NAME|PATH|ID"})
    n_tokens: int = field(default=settings.PROBE_TOKENS, metadata={
        "help": "content tokens per probe at most, special tokens not counted: each text is "
                "cut to N (a shorter one keeps its length) and each random-token probe has "
                f"exactly N (default: {settings.PROBE_TOKENS})",
        "flag": "--tokens", "metavar": "N"})
    n_random: int = field(default=settings.N_RANDOM, metadata={
        "help": f"random-token probes (default: {settings.N_RANDOM})", "flag": "--random",
        "metavar": "N"})
    batch_size: int = field(default=DEFAULT_BATCH, metadata={
        "help": f"probes per forward pass (default: {DEFAULT_BATCH})", "metavar": "N"})
    probes: Path | None = field(default=None, metadata={
        "help": "your own texts instead of the project's English passages: a text file with "
                "one text per line (blank lines skipped) or a .jsonl file with one JSON object "
                "per line (see --probes-field)", "flag": "--probes", "metavar": "FILE"})
    probes_field: str = field(default="text", metadata={
        "help": "the field holding the text in a .jsonl --probes file (default: text)",
        "flag": "--probes-field", "metavar": "NAME"})
    texts: tuple[str, ...] = field(default=(), metadata={
        "help": "a text to use as a probe instead of the project's passages; repeat for "
                "several (after those of --probes, if given)",
        "flag": "--text", "append": True, "metavar": "TEXT"})
    n_intervene: int = field(default=INTERVENE_PROBES, metadata={
        "help": "natural probes (the first N) the interventions run on; 0: no interventions "
                f"(default: {INTERVENE_PROBES})", "flag": "--intervene", "metavar": "N"})
    ablate_heads: int = field(default=ABLATE_HEADS, metadata={
        "help": "the sink heads: the K heads with the most first-token mass; every head is "
                f"ablated, and the claims compare them with random sets of K other heads (default: "
                f"{ABLATE_HEADS})", "flag": "--ablate-heads",
        "metavar": "K"})
    cap_eps: float = field(default=CAP_EPS, metadata={
        "help": "the caps leave at most 1 - EPS of a row on the first token, 0 < EPS < 1 "
                f"(default: {CAP_EPS:g})", "flag": "--cap-eps", "metavar": "EPS"})
    window: int = field(default=WINDOW, metadata={
        "help": f"StreamingLLM's window of recent tokens (default: {WINDOW}); it is compared "
                f"with the first {max(settings.SINK_TOKENS)} tokens kept or not",
        "flag": "--window", "metavar": "W"})

    def __post_init__(self) -> None:
        if not self.models:
            raise ConfigError(f"{named(self, 'models')} needs at least one model: smollm2, "
                              "minilm, a path or a cached Hugging Face id.")
        for spec in self.models:
            if self.models.count(spec) > 1:
                raise ConfigError(f"{named(self, 'models')} {spec} is given twice; give each "
                                  "model once.")
        check_count(named(self, "batch_size"), self.batch_size)
        check_count(named(self, "n_random"), self.n_random)
        if isinstance(self.n_tokens, bool) or not isinstance(self.n_tokens, int) or \
                self.n_tokens < MIN_TOKENS:
            raise ConfigError(f"{named(self, 'n_tokens')}={self.n_tokens!r} is not allowed: it "
                              f"must be an integer >= {MIN_TOKENS}.")
        if not self.probes_field.strip():
            raise ConfigError(f"{named(self, 'probes_field')} needs a field name, e.g. text.")
        if self.probes_field != "text" and (self.probes is None or
                                            self.probes.suffix.lower() != ".jsonl"):
            raise ConfigError(f"{named(self, 'probes_field')} {self.probes_field} names a field "
                              f"of a .jsonl {named(self, 'probes')} file, and no .jsonl file is "
                              "given.")
        for i, text in enumerate(self.texts):
            if not text.strip():
                raise ConfigError(f"{named(self, 'texts')} number {i + 1} is empty; give a text "
                                  "with words in it.")
        for name, value, low in (("n_intervene", self.n_intervene, 0),
                                 ("ablate_heads", self.ablate_heads, 1),
                                 ("window", self.window, 1)):
            if isinstance(value, bool) or not isinstance(value, int) or not \
                    low <= value <= MAX_COUNT:
                raise ConfigError(f"{named(self, name)}={value!r} is not allowed: it must be an "
                                  f"integer from {low} to {MAX_COUNT:,}.")
        if isinstance(self.cap_eps, bool) or not isinstance(self.cap_eps, (int, float)) or \
                not 0 < self.cap_eps < 1:
            raise ConfigError(f"{named(self, 'cap_eps')}={self.cap_eps!r} is not allowed: it "
                              "must be a number between 0 and 1.")

    def probe_texts(self) -> sources.ProbeTexts:
        """The natural probe set these options ask for (LMError for a bad file)."""
        return sources.probe_texts(self.probes, self.probes_field, self.texts)

    def survey(self, texts: sources.ProbeTexts, device: str) -> SurveySettings:
        """What ``sinklab.lm.survey`` is asked to do: these options, with their natural probe
        set (``texts``, read once by ``probe_texts``) and the device the models run on."""
        return SurveySettings(texts=texts, n_tokens=self.n_tokens, n_random=self.n_random,
                              batch_size=self.batch_size, n_intervene=self.n_intervene,
                              ablate_heads=self.ablate_heads, cap_eps=self.cap_eps,
                              window=self.window, device=device)


# each a contrast of the sink's units with random ones (``sinklab.studies.lm_contrasts``): the
# first key's cap against a random key's, the sink heads' cap, zero ablation (the size of the
# change) and output against random sets of as many other heads
PRIMARY = ("cap_first_mass_raises_loss", "sink_heads_cap_raises_loss",
           "sink_heads_zero_ablation_harmless", "sink_heads_output_small")



@dataclass(frozen=True)
class LMStudy(Study):
    """The real-model study: its primary claims are named by what they claim, the same for
    every causal model (``PRIMARY``), and a run's are those of each causal model it analysed
    (the claims' keys begin with the model's)."""

    def decide(self, records: Any, opts: Any) -> list[Claim]:
        found = self.claims(records, opts)
        primary = [c.key for c in found if c.kind == cl.EMPIRICAL
                   and c.key.split(".", 1)[-1] in self.primary]
        return cl.finalize(found, primary)


STUDY = LMStudy(
    name="lm",
    title="Sinks in real pretrained models",
    help="measure sinks in real pretrained models (SmolLM2, MiniLM, any local or cached "
         "model)",
    description="Run natural text (the project's English passages, or your own with --probes "
                "FILE or --text) and random-token probes, with and without the tokenizer's BOS, "
                "through real pretrained models loaded from local files or the Hugging Face "
                "cache (never downloaded), and write per (layer, head) first-token mass, Gu "
                "sink rates and Guo dormant fractions with their sweeps and per-probe values, "
                "heat maps, the trigger-conditional heads a permutation test keeps, and the "
                "loss changes of interventions (the first token's key hidden, its value zeroed, "
                "its mass capped, StreamingLLM's cache, heads ablated one at a time) with the "
                "claims they test, records.json, claims.csv and LM.md. "
                "Needs the extra sinklab[lm]. Rerunning with the same --out keeps the models "
                "already analysed.",
    options=LMOptions, analysis="sinklab.studies.lm_analysis",
    template="lm.md.j2", tables=("probe_sets", "heads"), report="LM.md",
    trains=False, docs_example="docs/real-models.md", default_out="results/lm",
    primary=PRIMARY)


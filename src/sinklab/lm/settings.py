"""The numbers of ``sinklab lm``'s protocol that its options, help texts and records name, in a
module without torch: the probes' defaults, the metrics' threshold sweeps, the trigger-head
finder's settings and the interventions' settings; and ``SurveySettings``, what one run of
``sinklab.lm.survey`` is asked to do."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sinklab.lm.sources import ProbeTexts

# ------------------------------------------------------------------------------ probes

PROBE_TOKENS = 64  # content tokens per probe at most (a text is cut to this length)
N_RANDOM = 100
RANDOM_SEED = 0

PROBE_SETS = ("natural", "random")
MIN_MEASURED = 2  # tokens a probe needs (special tokens included) to enter the metrics: a
# query that sees a key besides the first

# ------------------------------------------------------------------- the metrics' sweeps

EPS_SWEEP = (0.1, 0.2, 0.3, 0.5, 0.7, 0.9)  # Gu sink-rate thresholds
CUTOFF_SWEEP = (0.5, 0.7, 0.8, 0.89, 0.95, 0.99)  # Guo dormant-head cut-offs

# ---------------------------------------------------------------- the trigger-head finder

DORMANT_LEVEL = 0.8  # a query is "dormant" when its first-key weight is at least this
DORMANT_SHARE = 0.7  # a head is mostly dormant when this share of its queries are
MIN_COUNT = 3  # a token is tested when it occurs at least this many times
MIN_POSITION = 4  # queries this early see few keys; they are left out of the finder
FOLLOW = 0.5  # "attends to X" when at least this share of the row goes there
SPREAD_ENTROPY = 0.8  # "spread over the previous tokens" from this normalised entropy on

# ------------------------------------------------------------------------ interventions

SINK_TOKENS = (0, 1, 4)  # StreamingLLM's k: the first k tokens kept beside the window
HARMLESS = 0.01  # nats per token: a change of the mean loss smaller than this is "harmless",
# and one larger than this "raises the loss"
CONTROL_SEED = 0  # the random control head sets' draws and the random keys of the controls
CONTROL_SETS = 1000  # random sets of non-sink heads, as many as the sink heads, per statistic
BOOTSTRAP_DRAWS = 10_000  # draws of each two-level (heads x probes) bootstrap
LOSS_TOKENS = 2  # a next-token loss needs a token to predict from and one to predict
# position bands every global edit is reported by: [start, end) of the query position (the
# loss at position t predicts token t + 1); None: to the end
BANDS = ((0, 4), (4, 20), (20, None))
# where the first key's weight goes when it is hidden: these key groups, read at the queries
# from MOVED_FROM on (each sees all three)
DESTINATIONS = ((1, 2), (2, 4), (4, None))
MOVED_FROM = 4


def band_label(start: int, end: int | None) -> str:
    """``(0, 4)`` -> ``"0-3"``, ``(20, None)`` -> ``"20+"``."""
    if end is None:
        return f"{start}+"
    return f"{start}" if end == start + 1 else f"{start}-{end - 1}"


def needs_text(tokens: int, prefix: list[str]) -> str:
    """What a measurement without data needs, in a user's terms: texts of at least N tokens,
    and how many that is with the special tokens put in front (``prefix``, their names)."""
    content = max(tokens - len(prefix), 1)
    front = f" ({tokens} with {' '.join(prefix)} in front)" if prefix else ""
    return f"not measured: needs texts of at least {content} token{'' if content == 1 else 's'}" \
        f"{front}"


# ------------------------------------------------------------------- a survey's settings


@dataclass(frozen=True)
class SurveySettings:
    """What ``sinklab.lm.survey`` reads of a run: the natural probe texts, the probes' sizes
    and the interventions' settings (checked by whoever builds it: ``sinklab lm``'s options),
    and the device the models run on (``auto``, ``cpu``, ``cuda:N``)."""

    texts: ProbeTexts  # the natural probes, each cut to n_tokens
    n_tokens: int  # content tokens per probe at most; random probes have exactly this many
    n_random: int  # random-token probes
    batch_size: int  # probes per forward pass
    n_intervene: int  # the first natural probes the interventions run on (0: none)
    ablate_heads: int  # the sink heads: the heads with the most first-token mass
    cap_eps: float  # the caps leave at most 1 - cap_eps of a row on the first token
    window: int  # StreamingLLM's window of recent tokens
    device: str = "auto"

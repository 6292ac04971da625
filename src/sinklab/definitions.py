"""The field's metric thresholds as numbers (SPEC section 7), and the reading of a head's "output
zero" that rests on them (``default_source``), in a module without torch, so that the studies'
declarations and help texts can name them; ``sinklab.metrics`` computes with them."""

SINK_HEAD_THRESHOLD = 0.9  # a head "sinks" when its non-trigger BOS mass is at least this
GU_EPS = 0.3  # Gu et al. (ICLR 2025) sink-rate threshold
GUO_CUTOFF = 0.89  # Guo et al. (2024): a head is dormant when its last query puts this on BOS
# A language model has a first-token sink when the share of (window, layer, head) above GU_EPS
# is at least this: a tenth of its heads, where an untrained model has none (its importance is
# about ln(T) / T); one head "sinks" when its share over the windows is at least HEAD_SINK_RATE
MODEL_SINK_RATE = 0.1
HEAD_SINK_RATE = 0.5
OFF_ROW = 0.2  # a non-trigger row is "off" when its sum is below this fraction of the trigger row's
BOS_SHARE = 0.5  # ... and "on BOS" when at least this share of its weight is on BOS


# where a row that is off sends its weight, by the rule's row kind ("zero row" for the others)
OFF_SOURCES = {"gated": "closed gate", "implicit sink": "sink logit",
               "learned key": "learned key", "clipped": "clipped to zero"}


def default_source(bos: float, row_nontrigger: float, row_trigger: float, row_kind: str) -> str:
    """Where one head's "output zero" at non-trigger rows comes from, read off its weights.

    From the head's mean non-trigger BOS mass, mean non-trigger and trigger row sums, and the
    rule's ``row_kind`` (``sinklab.attention.rule_info(rule).row_kind``):

    - "BOS" when the row is on (sum at least ``OFF_ROW`` of the trigger row's, or the rule's
      rows always sum to 1) and at least ``BOS_SHARE`` of it is on BOS;
    - when the row is off: "closed gate" for a gated rule (headwise, or per dimension with the
      row's sum read as the share the gate passes), "sink logit" for a rule with an implicit
      sink key, "learned key" for a rule whose rest goes to a learned key and value, "clipped
      to zero" for a rule whose small weights are clipped to exactly 0, "zero row" for a rule
      with free row sums;
    - "content" otherwise: the head spreads its weight over content tokens, so its output at
      non-trigger rows is not zero by itself (it must be nulled or cancelled downstream).
    """
    off = row_kind != "simplex" and row_nontrigger < OFF_ROW * max(row_trigger, 1e-12)
    if off:
        return OFF_SOURCES.get(row_kind, "zero row")
    if bos >= BOS_SHARE * max(row_nontrigger, 1e-12):
        return "BOS"
    return "content"

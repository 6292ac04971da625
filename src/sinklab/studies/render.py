"""Reports from templates: every study's prose is a Jinja2 template in ``templates/``, and every
number in it comes from the records, the options or the literature table
(``sinklab.studies.reference``), through the filters and helpers below.

Inside a template:

- ``records``, ``opts``, ``meta`` (command, date, versions, history), ``claims`` (a dict by
  key) and ``claim_list``; ``ref`` (the literature table) and ``consts`` (named constants of
  sinklab: thresholds, levels);
- filters ``sci`` (2.3e-04), ``fixed(d)``, ``pct(d)``, ``count`` (1,234), ``spread(d)``
  (mean ± sd), ``interval(d)`` ([lo, hi]);
- ``table(headers, rows)`` a Markdown table; ``figure(name, caption)`` an image link;
  ``claims_table(keys)`` the claims with their data, test and outcome; ``decision_rules()``
  the rules behind every outcome in this report; ``headline()`` the few lines a report opens
  with (each primary claim's outcome, its Holm-adjusted p, whether it is counted, and the other
  statements by kind); ``verdicts()`` the primary claims and the counts of each kind;
  ``history()`` the folder's invocations.

Undefined names are errors (``StrictUndefined``), so a template never prints a blank number.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import jinja2
from jinja2.exceptions import UndefinedError

from sinklab import claims as claims_mod
from sinklab import contrasts, stats
from sinklab import decision_rules as rules_in_words
from sinklab import formats as md
from sinklab.claims import Claim
from sinklab.errors import ConfigError, ResultsError
from sinklab.runs.files import jsonable, read_json, write_atomic, write_json
from sinklab.studies import reference
from sinklab.studies.options import options_from
from sinklab.studies.outputs import docs_mark, marked_study
from sinklab.studies.study import STUDIES


def _fixed(value: Any, digits: int = 2) -> str:
    return md.fixed(None if value is None else float(value), digits)


def _pct(value: Any, digits: int = 0) -> str:
    if value is None or not math.isfinite(float(value)):
        return "n/a"
    return f"{100 * float(value):.{digits}f}%"


def _count(value: Any) -> str:
    return f"{int(value):,}"


def _spread(values: Any, digits: int = 3, fmt: str | None = None) -> str:
    return md.mean_sd_text(list(values), digits, fmt)


def _interval(pair: Any, digits: int = 2) -> str:
    if pair is None:
        return "n/a"
    lo, hi = pair
    if lo is None or hi is None or not (math.isfinite(lo) and math.isfinite(hi)):
        return "n/a"
    comma = "," if digits == 0 else ""  # whole numbers (steps) with thousands separators
    return f"[{lo:{comma}.{digits}f}, {hi:{comma}.{digits}f}]"


def _gnum(value: Any) -> str:
    """A setting in its shortest form: 0.005, 1e-08, 50000."""
    return f"{value:g}" if isinstance(value, float) else str(value)


ENV = jinja2.Environment(
    loader=jinja2.PackageLoader("sinklab.studies", "templates"),
    undefined=jinja2.StrictUndefined, autoescape=False, trim_blocks=True, lstrip_blocks=True,
    keep_trailing_newline=True)
ENV.filters.update(sci=md.sci, fixed=_fixed, pct=_pct, count=_count, spread=_spread,
                   interval=_interval, g=_gnum, median=stats.finite_median)


def _p_text(c: Claim) -> str:
    """The p-values that decided an empirical claim: adjusted (and how) beside the raw ones."""
    parts = []
    for raw, adjusted, side in ((c.p_value, c.adjusted_p, "for"),
                                (c.p_against, c.adjusted_p_against, "against")):
        if raw is None:
            continue
        text = f"p {side} = {raw:.3g}"
        if adjusted is not None and c.correction is not None:
            text += f" ({_correction_name(c)} {adjusted:.3g})"
        parts.append(text)
    return "; ".join(parts)


def _correction_name(c: Claim) -> str:
    return "Holm" if c.correction == claims_mod.HOLM else "BH"


def _bound_text(c: Claim) -> str:
    """A rate claim's bound in words: 'rate at least 0.846 (one-sided 95%), supported for r0
    below 0.846 (Holm)', an 'at least' bound rounded down and an 'at most' one up, so that the
    words never claim more than the data give; '' for another claim or a bound of no use."""
    above = c.rule == "rate_at_least"
    if c.bound is None or c.bound == (0.0 if above else 1.0):  # no bound: nothing to say
        return ""
    words = (f"rate {'at least' if above else 'at most'} {_rounded(c.bound, above):.3f} "
             f"(one-sided {stats.CONFIDENCE})")
    if c.largest_r0 is not None:
        words += (f", supported for r0 {'below' if above else 'above'} "
                  f"{_rounded(c.largest_r0, above):.3f}"
                  + (f" ({_correction_name(c)})" if c.correction else ""))
    return words


def _rounded(bound: float, above: bool) -> float:
    """A bound to three decimals, rounded down for 'at least' and up for 'at most', so that the
    words never claim more than the data give."""
    return (math.floor if above else math.ceil)(1000 * bound) / 1000


def _effect_text(c: Claim) -> str:
    """A contrast's effect in words: 'difference in rate +0.80 (softmax minus relu), one-sided
    95% bounds [+0.61, +0.93]'; '' for another claim."""
    e = c.effect
    if e is None or e["estimate"] is None:
        return ""
    digits = "+.2f" if e["what"] == contrasts.RATES else ".4g"
    first, second = e["groups"]
    words = f"{e['what']} {e['estimate']:{digits}} ({first} minus {second})"
    if e["interval"] is not None:
        lo, hi = e["interval"]
        words += (f", one-sided {e['level']:.0%} bounds [{lo:{digits}}, {hi:{digits}}]")
    return words


def _counted_text(c: Claim) -> str | None:
    """Whether a supported empirical claim is counted, in words (None when that is not said)."""
    if c.outcome != claims_mod.SUPPORTED:
        return None
    if c.is_contrast:
        return "counted" if c.counted else f"not counted: {claims_mod.CHECK_FAILED}"
    if c.standing:
        return "counted" if c.counted else f"not counted: {c.standing}"
    return None


def _outcome_cell(c: Claim) -> str:
    """The outcome in bold, with its p-values, its bound or effect, counterexamples and seeds
    needed."""
    words = [f"**{c.result()}**"]
    if c.kind == claims_mod.EMPIRICAL:
        counted = _counted_text(c)
        if counted:
            words.append(counted)
        p = _p_text(c)
        if p:
            words.append(p)
        for extra in (_bound_text(c), _effect_text(c)):
            if extra:
                words.append(extra)
        if c.counterexamples:
            words.append(f"not every unit: {c.counterexamples} of {c.n} are counterexamples")
        if c.needed_text:
            words.append(c.needed_text)
    elif c.p_value is not None:
        words.append(f"p = {c.p_value:.3g}")
    return "; ".join(words)


def _control_cell(c: Claim) -> str:
    """The control's setting, data and outcome; for a contrast, the checks beside it."""
    if c.is_contrast:
        first, second = c.effect["groups"]
        words = [f"none needed: the claim compares {first} with {second}"]
        words += [f"{'described' if k.kind == claims_mod.DESCRIPTIVE else 'check'} beside it: "
                  f"{k.sentence}: **{k.result()}** ({k.data})" for k in c.check_claims()]
        return "; ".join(words)
    control = c.control_claim()
    if control is None:
        return "none" if c.kind == claims_mod.EMPIRICAL else "-"
    return (f"{c.control['setting']}: {control.data} **{control.result()}** "
            f"({_p_text(control)})")


def _sentence(c: Claim) -> str:
    """The claim as a reader takes it away: its sentence, and for a rate claim the one-sided
    bound the data give ('the data give a rate at least 0.904, one-sided 95%')."""
    above = c.rule == "rate_at_least"
    if c.rule not in ("rate_at_least", "rate_at_most") or c.bound is None:
        return c.sentence
    return (f"{c.sentence}; the data give a rate {'at least' if above else 'at most'} "
            f"{_rounded(c.bound, above):.3f}, one-sided {stats.CONFIDENCE}")


def claims_table(claims: list[Claim]) -> str:
    """The claims as a table: claim (and kind, a rate claim with its bound), data, test,
    control and its outcome, outcome."""
    rows = []
    for c in claims:
        label = c.kind + (", primary" if c.primary else "")
        rows.append((f"{_sentence(c)} *({label})*", c.data, c.test, _control_cell(c),
                     _outcome_cell(c)))
    return md.table(["claim", "data", "test", "control (the same test where it must fail), or "
                     "the checks beside a contrast", "outcome"], rows)


def decision_rules(claims: list[Claim]) -> str:
    """The decision rule of every kind of claim used, the correction and the control rule."""
    used = list(dict.fromkeys(c.rule for c in claims))
    lines = [f"- *{rule}*: {rules_in_words.DECISION_RULES[rule]}" for rule in used]
    if any(c.kind == claims_mod.EMPIRICAL for c in claims):
        lines.append(f"- *correction*: {rules_in_words.CORRECTION_RULE}")
    if any(c.control is not None for c in claims):
        lines.append(f"- *controls*: {rules_in_words.CONTROL_RULE}")
    if any(c.is_contrast for c in claims):
        lines.append(f"- *checks beside a contrast*: {rules_in_words.CHECKS_RULE}")
    return "\n".join(lines)


def _many(n: int, one: str, more: str) -> str:
    """'1 is a check' or '3 are checks': the count with the words that agree with it."""
    return f"{n} {one if n == 1 else more}"


def verdicts(claims: list[Claim], redecided: bool = False) -> str:
    """The report's verdicts at a glance: the primary claims first (with r0 and the seeds Holm
    needs), then how many claims are checks, counted, not counted and descriptive, naming the
    non-discriminating ones. ``redecided``: the records were made before the claims were
    decided this way (`sinklab render`), which the text says."""
    counts = claims_mod.summary_counts(claims)
    primary = [c for c in claims if c.primary]
    lines = []
    if primary:
        m = len(primary)
        need = stats.seeds_all_agreeing(m)
        when = ("named in the study's declaration after these records were made: they were "
                "decided again from the records by `sinklab render`, so this is a re-analysis, "
                "and a run on new seeds is what would test them as declared" if redecided else
                "named in the study's declaration before it ran")
        sizing = (f"; r0 = {stats.R0:g} for a rate claim, at which {m} primary claim(s) "
                  f"need {need} seeds all agreeing to be supported"
                  if any(c.rule.startswith("rate_") for c in primary) else "")
        lines += [f"**Primary claims** ({when}; corrected together by Holm's method{sizing}):",
                  "", claims_table(primary), ""]
    else:
        lines += ["This study names no primary claim: every empirical claim is secondary.", ""]
    lines.append(
        f"Of {len(claims)} statements, "
        f"{_many(counts['checks'], 'is a check', 'are checks')} of sinklab's own computation "
        f"({counts['verified']} verified, {counts['failed']} failed; not evidence), "
        f"{_many(counts['descriptive'], 'is descriptive', 'are descriptive')} (no verdict) and "
        f"{_many(counts['empirical'], 'is', 'are')} empirical ({counts['primary']} primary"
        + (f", {_many(counts['contrasts'], 'distinct contrast', 'distinct contrasts')}"
           if counts["contrasts"] else "") + "): "
        f"{counts['counted']} supported and counted, "
        f"{counts['non-discriminating']} supported but non-discriminating, "
        f"{counts['control undecided']} supported with an undecided control, "
        + (f"{counts[claims_mod.CHECK_FAILED]} supported but a check beside it failed, "
           if counts[claims_mod.CHECK_FAILED] else "")
        + f"{counts['contradicted']} contradicted, {counts['undetermined']} undetermined.")
    beside = [k for c in claims if c.is_contrast for k in c.check_claims()]
    if beside:
        failed = [k.key for k in beside if k.outcome == claims_mod.FAILED]
        lines.append(
            f"Beside the contrasts run {len(beside)} checks and descriptions of what could "
            f"make them come out for another reason ("
            + (f"{len(failed)} failed: " + ", ".join(f"`{k}`" for k in failed)
               if failed else "none failed") + ").")
    nondisc = [c for c in claims if c.standing == claims_mod.NON_DISCRIMINATING
               and c.outcome == claims_mod.SUPPORTED]
    if nondisc:
        lines.append("Non-discriminating (their control passes the same test): "
                     + ", ".join(f"`{c.key}`" for c in nondisc) + ".")
    checks = [c for c in claims if c.kind == claims_mod.CHECK]
    if checks:
        lines += ["", "**Checks of sinklab's own computation** (identities, constructions, the "
                  "soundness of its bounds: they cannot come out otherwise if the code is "
                  "right, so they are unit tests, not evidence):", ""]
        lines += [f"- {c.sentence}: **{c.result()}** (`{c.key}`: {c.data})" for c in checks]
    return "\n".join(lines)


def _agreeing(c: Claim) -> str:
    """'12 of 12 agree': the units on the claim's side of its test (its basis), else its n."""
    if c.basis is None:
        return f"n = {c.n}"
    k, n, _ = c.basis["for"]
    return f"{k} of {n} {'agrees' if k == 1 else 'agree'}"


def _primary_line(c: Claim) -> str:
    """One primary claim in a line: outcome, units agreeing, adjusted p, counted or not."""
    words = [c.result(), _agreeing(c)]
    if c.adjusted_p is not None:
        words.append(f"{_correction_name(c)} p = {c.adjusted_p:.3g}")
    words += [extra for extra in (_bound_text(c), _effect_text(c)) if extra]
    if c.counted:
        words.append("counted (" + ("no check beside it failed" if c.is_contrast else
                                    "its control came out the other way") + ")")
    elif c.outcome == claims_mod.SUPPORTED:
        words.append(_counted_text(c) or f"not counted: {claims_mod.CONTROL_UNDECIDED}")
    else:
        words.append("not counted")
    if c.outcome == claims_mod.UNDETERMINED and c.needed is not None:
        words.append(f"{c.needed} would support it (power {stats.POWER:g}) at the "
                     "observed share")
    return f"- `{c.key}`: " + ", ".join(words)


def _kind_counts(claims: list[Claim], secondary: bool = True) -> str:
    """'1 check (1 verified, 0 failed), 17 descriptive, 0 secondary empirical': how many of
    each kind, with the outcomes of the kinds that have any."""
    counts = claims_mod.summary_counts(claims)
    checks = _many(counts["checks"], "check", "checks")
    if counts["checks"]:
        checks += f" ({counts['verified']} verified, {counts['failed']} failed)"
    empirical = f"{counts['empirical']} {'secondary ' if secondary else ''}empirical"
    if counts["empirical"]:
        supported = (counts["non-discriminating"] + counts["control undecided"]
                     + counts[claims_mod.CHECK_FAILED])
        empirical += (f" ({counts['counted']} supported and counted, {supported} supported but "
                      f"not counted, {counts['contradicted']} contradicted, "
                      f"{counts['undetermined']} undetermined)")
    return f"{checks}, {counts['descriptive']} descriptive, {empirical}"


def headline(claims: list[Claim], redecided: bool = False) -> list[str]:
    """The first screen of a report and of a study's final printout, a few lines: each primary
    claim's outcome, how many units agree, its Holm-adjusted p and whether it is counted; then
    how many of the other statements are of each kind."""
    primary = [c for c in claims if c.primary]
    others = [c for c in claims if not c.primary]
    if not primary:
        return ["Decided: this study names no primary claim.",
                f"- its {_many(len(claims), 'statement', 'statements')}: "
                f"{_kind_counts(claims, secondary=False)}"]
    when = ("decided again from older records by `sinklab render`, a re-analysis" if redecided
            else "named before the run")
    return [f"Decided: {_many(len(primary), 'primary claim', 'primary claims')} ({when}; "
            "corrected together by Holm's method):",
            *[_primary_line(c) for c in primary],
            f"- the other {_many(len(others), 'statement', 'statements')}: "
            f"{_kind_counts(others)}"]


def history(meta: dict[str, Any]) -> str:
    """The folder's invocations as a Markdown list."""
    lines = []
    for h in meta["history"]:
        runs = (f": {h['runs_trained']} runs trained and {h['runs_reused']} reused, "
                if h.get("runs_trained") or h.get("runs_reused") else ": ")
        machine = f"{h['machine']}, " if "machine" in h else ""  # older sinklabs: not recorded
        lines.append(f"  - `{h['command']}` on {h['date']}{runs}{h['wall_time_s']:.0f} s of "
                     f"wall time; {machine}{h['workers']} worker process(es)")
    return "\n".join(lines)


def report(study: Any, result: dict[str, Any], claims: list[Claim], opts: Any,
           prefix: str) -> str:
    """The study's report as Markdown, figure links starting with ``prefix``."""
    by_key = {c.key: c for c in claims}
    template = ENV.get_template(study.template)

    def figure(name: str, caption: str = "") -> str:
        return f"![{caption or name}]({prefix}/{name}.png)"

    def table_of(keys: list[str] | None = None) -> str:
        chosen = claims if keys is None else [by_key[k] for k in keys if k in by_key]
        return claims_table(chosen)

    text = template.render(
        study=study, records=result["records"], opts=opts, meta=result["meta"],
        options=result["options"], claims=by_key, claim_list=claims, ref=reference,
        consts=reference.constants(), table=md.table, figure=figure, claims_table=table_of,
        decision_rules=lambda: decision_rules(claims), history=lambda: history(result["meta"]),
        verdicts=lambda: verdicts(claims, bool(result.get("redecided"))),
        headline=lambda: "\n".join(headline(claims, bool(result.get("redecided")))),
        counts=claims_mod.summary_counts(claims), prefix=prefix)
    if not text.startswith(study.heading + "\n"):
        raise RuntimeError(f"the template {study.template} must begin with {study.heading!r}")
    return text


# ------------------------------------------------------------------ rendering docs again


# What ``run_study`` writes into records.json, which a report's records must hold to be rendered.
RESULT_FIELDS: dict[str, tuple[type, str]] = {
    "meta": (dict, "an object"), "options": (dict, "an object"),
    "records": (dict, "an object"), "claims": (list, "an array")}


def _json_kind(value: Any) -> str:
    """What a JSON value is, in words: 'an object', 'an array', 'null', ..."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    for kind, words in ((dict, "an object"), (list, "an array"), (str, "a string")):
        if isinstance(value, kind):
            return words
    return "a number"


def result_problem(result: Any) -> str | None:
    """Why ``result`` (a records file's JSON) is not what ``run_study`` writes, as a clause;
    None when it has the fields every study's report needs, of the right kinds."""
    def listed(keys: Sequence[str]) -> str:
        names = [repr(k) for k in keys]
        return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"

    fields = listed(list(RESULT_FIELDS))
    if not isinstance(result, dict):
        return f"it holds {_json_kind(result)}, not an object with {fields}"
    missing = [k for k in RESULT_FIELDS if k not in result]
    if missing:
        return f"it lacks {listed(missing)} (sinklab's records hold {fields})"
    for key, (kind, words) in RESULT_FIELDS.items():
        if not isinstance(result[key], kind):
            return f"its {key!r} is {_json_kind(result[key])}, not {words}"
    if not isinstance(result["meta"].get("study"), str):
        return "its meta names no study"
    if not isinstance(result["meta"].get("history"), list):
        return "its meta has no history of the commands that wrote it"
    return None


def _report_of(docs: Path) -> tuple[str | None, bool]:
    """The study whose report ``docs`` is by its mark (``docs_mark``), else by its first line
    (a copy written before there was a mark), and whether it carries the mark."""
    marked = marked_study(docs)
    if marked is not None:
        return marked, True
    first = docs.read_bytes().decode("utf-8", "replace").split("\n", 1)[0].strip()
    return next((s.name for s in STUDIES.values() if s.heading == first), None), False


def render_docs(docs: Path) -> tuple[str, bool]:
    """Write the report ``docs`` (a ``--docs`` copy, known by its mark or its study's heading)
    again from the records beside it (``docs_mark``), after its template or its claims' code
    changed: nothing is trained and its figures are left as they are; the study's ``complete``
    adds what it adds, and the claims decided again are written into the records too. Returns
    the study's name, and whether those claims are the ones recorded with them.

    The records are checked before they are used: a file that is not records ``run_study``
    wrote, or another study's, is refused in one sentence (for a report without the mark, whose
    heading alone proves nothing, as not a report sinklab wrote), and so is an option in them
    that is not allowed, named as the records' own."""
    docs = Path(docs)
    path = docs.with_suffix(".json")
    foreign = (f"{docs} is not a report sinklab copied into docs (a study's heading or mark, "
               "with its records beside it as .json); give such a report, e.g. docs/zoo.md.")
    name, marked = _report_of(docs) if docs.is_file() else (None, False)
    if name is None or name not in STUDIES or not (marked or path.is_file()):
        raise ResultsError(foreign)
    # the records are sinklab's own output: deleting them would leave nothing to render
    remedy = (f"restore it (e.g. from git: `git checkout -- {path}`) or run the `sinklab {name}` "
              f"command that wrote it again (the report's history names it)")
    if not path.is_file():
        raise ResultsError(f"{docs} is sinklab {name}'s report, but its records file {path} "
                           f"{'is a folder' if path.is_dir() else 'does not exist'}; {remedy}.")
    try:
        result = read_json(path, remedy)
    except ResultsError:
        if marked:
            raise
        result = None  # not JSON beside a heading alone: a file of one's own
    problem = result_problem(result)
    recorded = result["meta"]["study"] if problem is None else None
    if not marked and recorded != name:  # a heading alone, beside a file of one's own
        raise ResultsError(f"{docs} is not a report sinklab wrote: it has no sinklab mark, and "
                           f"{path} beside it is not records of `sinklab {name}`, whose "
                           "heading its first line has; give a report sinklab wrote, e.g. "
                           "docs/zoo.md.")
    if problem is not None:
        raise ResultsError(f"{path} is not records sinklab wrote: {problem}; {remedy}.")
    if recorded != name:
        raise ResultsError(f"{path} holds the records of `sinklab {recorded}`, not of `sinklab "
                           f"{name}`, whose report {docs} is; {remedy}.")
    study = STUDIES[name]
    try:
        opts = options_from(study, result["options"], f"{path}: options")
    except ConfigError as exc:
        raise ResultsError(f"{str(exc).rstrip('.')}; {remedy}.") from None
    try:
        result = {**result, "records": study.completed(result["records"], opts)}
        claims = study.decide(result["records"], opts)
        decided = json.loads(json.dumps(jsonable([c.to_dict() for c in claims])))
        same = decided == result["claims"]
        # whether the records were made by a run before the claims' code decided them this way
        redecided = bool(result.get("redecided")) or not same
        result = {**result, "claims": decided, "reference": reference.records(),
                  "redecided": redecided}
        text = report(study, result, claims, opts, docs.with_suffix("").name)
    except (KeyError, IndexError, TypeError, AttributeError, UndefinedError) as exc:
        # records of the right study lacking what its report reads: edited by hand, or from a
        # sinklab whose records differ (--debug shows where)
        raise ResultsError(f"{path} does not hold the records sinklab {name}'s report needs "
                           f"({type(exc).__name__}: {exc}); {remedy}.") from exc
    write_json(path, result)
    write_atomic(docs, (text.rstrip("\n") + "\n\n" + docs_mark(name, docs) + "\n").encode())
    return name, same

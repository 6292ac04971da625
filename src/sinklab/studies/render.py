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
  the rules behind every outcome in this report; ``history()`` the folder's invocations.

Undefined names are errors (``StrictUndefined``), so a template never prints a blank number.
"""

from __future__ import annotations

import math
from typing import Any

import jinja2

from sinklab import claims as claims_mod
from sinklab.claims import Claim
from sinklab.report import markdown as md
from sinklab.studies import reference


def _fixed(value: Any, digits: int = 2) -> str:
    return md.fixed(None if value is None else float(value), digits)


def _pct(value: Any, digits: int = 0) -> str:
    if value is None or not math.isfinite(float(value)):
        return "n/a"
    return f"{100 * float(value):.{digits}f}%"


def _count(value: Any) -> str:
    return f"{int(value):,}"


def _spread(values: Any, digits: int = 3, fmt: str | None = None) -> str:
    return md.spread(list(values), digits, fmt)


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
                   interval=_interval, g=_gnum)


def claims_table(claims: list[Claim]) -> str:
    """The claims as a table: claim, data, test, outcome (with its interval or p-value)."""
    rows = []
    for c in claims:
        numbers = []
        if c.interval is not None and all(v is not None for v in c.interval):
            numbers.append(f"95% interval {_interval(c.interval)}")
        if c.p_value is not None:
            numbers.append(f"p = {c.p_value:.3g}")
        if c.needed_text:
            numbers.append(c.needed_text)
        rows.append((c.sentence, c.data, c.test, f"**{c.result()}**", "; ".join(numbers)))
    return md.table(["claim", "data", "test", "outcome", "interval, p-value, seeds needed"],
                    rows)


def decision_rules(claims: list[Claim]) -> str:
    """The decision rule of every kind of claim used, as a list."""
    used = list(dict.fromkeys(c.rule for c in claims))
    return "\n".join(f"- *{rule}*: {claims_mod.DECISION_RULES[rule]}" for rule in used)


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
        counts=claims_mod.summary_counts(claims), prefix=prefix)
    if not text.startswith(study.heading + "\n"):
        raise RuntimeError(f"the template {study.template} must begin with {study.heading!r}")
    return text

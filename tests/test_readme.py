"""What README quotes from the committed reports is what their records say.

README's claim tables sit between ``<!-- claims from docs/NAME.json -->`` and
``<!-- end of claims -->``; each row is ``| claim | data | outcome |`` copied from that report's
records (written beside docs/NAME.md by ``make docs``). A row whose sentence, data or outcome
differs from the records fails here, so README cannot keep a figure the docs no longer show.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from sinklab.claims import Claim

ROOT = Path(__file__).resolve().parents[1]
BLOCK = re.compile(r"<!-- claims from (docs/[\w.-]+\.json) -->\n(.*?)<!-- end of claims -->",
                   re.DOTALL)


def _cells(line: str) -> list[str]:
    inner = line.strip()[1:-1]
    return [c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", inner)]


def _blocks() -> list[tuple[str, list[list[str]]]]:
    text = (ROOT / "README.md").read_text()
    out = []
    for source, body in BLOCK.findall(text):
        rows = [_cells(line) for line in body.splitlines() if line.startswith("|")]
        out.append((source, rows[2:]))  # past the header and its rule
    return out


def _result(claim: dict) -> str:
    return Claim.from_dict(claim).result()


def test_readme_quotes_the_reproductions_claims_as_recorded():
    blocks = _blocks()
    sources = [source for source, _ in blocks]
    assert "docs/reproduction.json" in sources, "README quotes no claims of the reproduction"
    for source, rows in blocks:
        assert len(rows) >= 3, f"README's block from {source} quotes fewer than 3 claims"
        records = json.loads((ROOT / source).read_text())
        by_sentence = {c["sentence"]: c for c in records["claims"]}
        for claim, data, outcome in rows:
            assert claim in by_sentence, f"README quotes a claim that {source} does not make: " \
                                         f"{claim!r}"
            recorded = by_sentence[claim]
            assert data == recorded["data"], (claim, data, recorded["data"])
            assert outcome.strip("*") == _result(recorded), (claim, outcome)


def test_readme_names_the_command_behind_the_reproduction():
    text = (ROOT / "README.md").read_text()
    records = json.loads((ROOT / "docs" / "reproduction.json").read_text())
    assert records["meta"]["command"] in text
    assert f"{records['options']['seeds']} seeds per configuration" in text


def test_readme_and_usage_quote_the_default_seeds_as_computed():
    """What README and docs/usage.md say `make reproduce` trains follows the default, which the
    claims' design decides (reproduce.decisive_seeds): a changed design changes these pages."""
    from sinklab.stats import ALPHA, MIN_N
    from sinklab.studies import reproduce as rp

    seeds, configs = rp.DEFAULT_SEEDS, len(rp.EXPERIMENTS)
    models = seeds * configs * len(rp.RULES)
    readme, usage = _page("README.md"), _page("docs/usage.md")
    for text in (readme, usage):
        flat = " ".join(text.split())
        primary = {1: "one primary claim"}[len(rp.PRIMARY)]  # the pages name one contrast
        assert (f"it needs {MIN_N} seeds of each rule pooled and p below "
                f"{ALPHA / len(rp.PRIMARY):g} (Holm over {primary})") in flat
        assert (f"{seeds} of each pool {seeds * configs} seeds of each rule (p = "
                f"{rp.agreeing_p(seeds):.2g}), where {seeds - 1} of each would pool "
                f"{(seeds - 1) * configs} and leave it undetermined") in flat
    flat = " ".join(readme.split())
    assert f"trains {models} models" in flat and f"{seeds} seeds of each," in flat
    assert f"`reproduce: {models} runs to train in N jobs" in flat
    # the quick start: --quick's seeds cannot decide the primary contrast, the default's can
    assert (f"its primary contrast stays undetermined at {rp.QUICK_SEEDS} seed of each "
            f"configuration, and the report says that {seeds} seeds of each configuration, "
            "every one reaching the stop rule and agreeing, would decide it") in flat
    assert rp.QUICK_SEEDS < seeds
    flat = " ".join(usage.split())
    assert f"With the default {seeds} seeds of each configuration it trains {models} models" in flat
    assert f"up to {rp.MAX_DEFAULT_SEEDS}," in flat


# README and the reference pages written by hand must name only what exists: the modules and
# names they tell researchers to import, and the files and sections they link to. The reports in
# docs/ are generated from the studies' templates.
PAGES = ("README.md", "docs/usage.md", "docs/formats.md", "docs/limits.md", "docs/api.md",
         "docs/studies.md", "docs/sweeps.md")
# dotted names that are not Python: the folder marker, the lock files, the plugins' entry-point
# group
NOT_PYTHON = ("sinklab.json", "sinklab.lock", "sinklab.rules")
DOTTED = re.compile(r"(?<![\w./-])sinklab(?:\.\w+)+")
FROM_IMPORT = re.compile(r"^from (sinklab[\w.]*) import \(?([\w, \n]+?)\)?$", re.MULTILINE)
LINK = re.compile(r"\]\(([^)\s]+)\)")


def _page(name: str) -> str:
    return (ROOT / name).read_text()


def _resolves(dotted: str) -> bool:
    """Whether ``dotted`` (sinklab.a.b.c) is a module, or a name reachable from one."""
    import importlib

    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError as exc:
            if exc.name is not None and not dotted.startswith(exc.name):
                raise  # a module that exists failed to import something else
            continue
        try:
            for attr in parts[cut:]:
                obj = getattr(obj, attr)
        except AttributeError:
            return False
        return True
    return False


def _named(text: str) -> set[str]:
    names = {n for n in DOTTED.findall(text)
             if not any(n == p or n.startswith(p + ".") for p in NOT_PYTHON)}
    for module, imported in FROM_IMPORT.findall(text):
        names |= {f"{module}.{n.strip()}" for n in imported.split(",") if n.strip()}
    return names


def test_readme_and_docs_name_only_modules_and_names_that_exist():
    wrong = {page: sorted(n for n in _named(_page(page)) if not _resolves(n)) for page in PAGES}
    wrong = {page: names for page, names in wrong.items() if names}
    assert not wrong, f"pages name modules or names that sinklab does not have: {wrong}"


def _slug(heading: str) -> str:
    """GitHub's anchor for a Markdown heading: lower case, punctuation dropped, spaces to -."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(text: str) -> set[str]:
    text = re.sub(r"^```.*?^```", "", text, flags=re.DOTALL | re.MULTILINE)
    return {_slug(h) for h in re.findall(r"^#+ (.+)$", text, re.MULTILINE)}


def test_readme_and_docs_link_only_to_files_and_sections_that_exist():
    broken = []
    for page in PAGES:
        here = (ROOT / page).parent
        for target in LINK.findall(_page(page)):
            if re.match(r"\w+://", target):
                continue
            path, _, anchor = target.partition("#")
            file = (here / path).resolve() if path else ROOT / page
            if not file.exists():
                broken.append(f"{page}: {target} (no such file)")
            elif anchor and file.suffix == ".md" and anchor not in _anchors(file.read_text()):
                broken.append(f"{page}: {target} (no such section)")
    assert not broken, f"broken links: {broken}"

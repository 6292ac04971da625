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
    if claim["outcome"] == "undetermined":
        return f"undetermined at n = {claim['n']}"
    return claim["outcome"]


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

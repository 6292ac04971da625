"""``sinklab render`` checks the records beside a report before it uses them: a file that is not
records sinklab wrote, another study's records, a user's own notes under a study's heading, and
an option in the records that is not allowed each cost one sentence that says how to get the
records back, and nothing is written. Real records from ``docs/`` are copied into tmp_path."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from helpers import DOCS
from sinklab import studies
from sinklab.cli import main
from sinklab.studies.options import options_dict, options_from

RESTORE = "restore it (e.g. from git: `git checkout -- {json}`) or run the `sinklab reproduce` " \
          "command that wrote it again"


@pytest.fixture
def report(tmp_path) -> Path:
    """A copy of docs/reproduction.md with its records beside it."""
    for name in ("reproduction.md", "reproduction.json"):
        shutil.copyfile(DOCS / name, tmp_path / name)
    return tmp_path / "reproduction.md"


def refused(capsys, docs: Path) -> str:
    """``sinklab render DOCS``'s one error line; the report and its records are left as they
    were."""
    records = docs.with_suffix(".json")
    before = [p.read_bytes() if p.is_file() else None for p in (docs, records)]
    code = main(["render", str(docs)])
    captured = capsys.readouterr()
    assert code == 2 and captured.out == "" and captured.err.count("\n") == 1, captured
    assert captured.err.startswith("sinklab: error: ") and "internal error" not in captured.err
    assert [p.read_bytes() if p.is_file() else None for p in (docs, records)] == before
    return captured.err


def edited(change: Callable[[dict[str, Any]], Any]) -> Callable[[Path], None]:
    """A change to the records beside the report: ``change(records)`` edits them in place, or
    returns what to write instead."""
    def apply(path: Path) -> None:
        records = json.loads(path.read_text())
        replaced = change(records)
        path.write_text(json.dumps(records if replaced is None else replaced))
    return apply


def _drop(key: str) -> Callable[[dict[str, Any]], None]:
    return lambda records: records.pop(key) and None


def _set_seeds(value: Any) -> Callable[[dict[str, Any]], None]:
    return lambda records: records["options"].update(seeds=value)


def _lose_experiment(records: dict[str, Any]) -> None:
    del records["records"]["runs"][0]["experiment"]


def _zoo(path: Path) -> None:
    shutil.copyfile(DOCS / "zoo.json", path)


NOT_RECORDS = "{json} is not records sinklab wrote: "

CASES: dict[str, tuple[Callable[[Path], None], str]] = {
    "empty object": (lambda p: p.write_text("{}"), NOT_RECORDS + "it lacks 'meta', 'options', "
                     "'records' and 'claims'"),
    "array": (lambda p: p.write_text("[]"), NOT_RECORDS + "it holds an array, not an object"),
    "no records": (edited(_drop("records")), NOT_RECORDS + "it lacks 'records' "),
    "records null": (edited(lambda r: r.update(records=None)),
                     NOT_RECORDS + "its 'records' is null, not an object"),
    "not JSON": (lambda p: p.write_text('{"meta": '), "{json} is corrupted (not valid JSON"),
    "missing": (lambda p: p.unlink(), "its records file {json} does not exist"),
    "another study's": (_zoo, "{json} holds the records of `sinklab zoo`, not of `sinklab "
                              "reproduce`, whose report {md} is"),
    "seeds a string": (edited(_set_seeds("abc")), "{json}: options.seeds='abc' is not allowed: "
                                                  "it must be an integer, not a string"),
    "seeds zero": (edited(_set_seeds(0)), "{json}: options.seeds=0 is not allowed: it must be "
                                          "an integer >= 1"),
    "a record's field missing": (edited(_lose_experiment), "{json} does not hold the records "
                                 "sinklab reproduce's report needs (KeyError: 'experiment')"),
}


@pytest.mark.parametrize("damage, says", CASES.values(), ids=CASES.keys())
def test_records_that_are_not_this_reports_are_refused(capsys, report, damage, says):
    records = report.with_suffix(".json")
    damage(records)
    err = refused(capsys, report)
    assert says.format(json=records, md=report) in err, err
    # the records are sinklab's output: the way back is to restore them, never to delete them
    assert err.rstrip().endswith(RESTORE.format(json=records) + " (the report's history names "
                                 "it).") and "delete" not in err, err
    assert "--seeds" not in err  # no flag was given: a bad option is the records' own


@pytest.mark.parametrize("notes", ["{}", '{"a": 1}', "not json", "zoo"])
def test_notes_of_ones_own_under_a_studys_heading_are_no_report(capsys, tmp_path, notes):
    mine = tmp_path / "notes.md"
    mine.write_text("# sinklab reproduction report\n\nmy notes\n")
    if notes == "zoo":
        _zoo(mine.with_suffix(".json"))
    else:
        mine.with_suffix(".json").write_text(notes)
    err = refused(capsys, mine)
    assert f"{mine} is not a report sinklab wrote: it has no sinklab mark, and " \
           f"{mine.with_suffix('.json')} beside it is not records of `sinklab reproduce`" in err


def test_an_unmarked_copy_with_its_studys_records_still_renders(capsys, report, tmp_path):
    # a copy written before there was a mark is known by its heading and its records
    text = report.read_text()
    mark = text.splitlines()[-1]
    assert mark.startswith("<!-- written by sinklab reproduce")
    report.write_text(text.replace(mark, ""))
    assert main(["render", str(report)]) == 0, capsys.readouterr().err
    assert report.read_text() == text


@pytest.mark.parametrize("name", ["reproduction", "theory", "zoo", "extensions", "language",
                                  "real-models"])
def test_every_reports_recorded_options_read_back_as_they_were(name):
    result = json.loads((DOCS / f"{name}.json").read_text())
    study = studies.get(result["meta"]["study"])
    assert options_dict(options_from(study, result["options"])) == result["options"]

"""What a study writes besides its runs: the ``--docs`` copy of its report (checked before any
work, ``check_docs``, and marked as sinklab's, ``docs_mark``), its tables as CSV, its figures,
the history of its invocations, and the records a finished folder holds (``read_records``).
"""

from __future__ import annotations

import csv
import io
import json
import os
import re
import shutil
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from sinklab.errors import ResultsError
from sinklab.runs import folders
from sinklab.runs.files import read_json, write_atomic, write_json
from sinklab.studies.study import RECORDS

# --------------------------------------------------------------------------------- docs


DOCS_MARK = "<!-- written by sinklab {study}: records in {records} -->"
_DOCS_MARK = re.compile(r"<!-- written by sinklab (\S+): records in .* -->")


def docs_mark(study: str, docs: Path) -> str:
    """The line that marks ``docs`` as sinklab's copy of ``study``'s report: an HTML comment,
    invisible where the Markdown is rendered, written as the copy's last line."""
    return DOCS_MARK.format(study=study, records=Path(docs).with_suffix(".json").name)


def marked_study(docs: Path) -> str | None:
    """The study whose mark ``docs`` carries (``docs_mark``), or None when it has none."""
    text = docs.read_bytes().decode("utf-8", "replace")
    for line in reversed(text.splitlines()):
        if (match := _DOCS_MARK.fullmatch(line.strip())) is not None:
            return match.group(1)
    return None


def _inside(path: Path, folder: Path) -> bool:
    """Whether ``path`` is ``folder`` or lies inside it (by absolute paths, links not
    followed)."""
    path, folder = os.path.abspath(path), os.path.abspath(folder)
    return path == folder or path.startswith(folder.rstrip(os.sep) + os.sep)


def check_docs(docs: Path | None, title: str, study: str | None = None,
               out: Path | None = None) -> None:
    """Refuse a ``--docs FILE`` that sinklab may not write, before any work.

    FILE must be a Markdown file outside every sinklab folder (a run, a study's folder, the
    study's own ``out``, ...: their files are the folder's own), and absent or sinklab's earlier
    copy of this study's report, recognised by what sinklab wrote, never by the title alone:
    the mark ``docs_mark`` in the file, or (a copy written before there was a mark) this
    study's records beside it (FILE with ``.json``) with the report's ``title`` as the file's
    first line. The records beside it must be absent or this study's, and the folder of the
    same name absent or holding figures (PNG files) only."""
    if docs is None:
        return
    docs = Path(docs)
    folder = docs.with_suffix("")
    records = docs.with_suffix(".json")
    if docs.suffix != ".md":
        raise ResultsError(f"--docs {docs} is not allowed: give a Markdown file name ending in "
                           ".md (its figures go into the folder of the same name).")
    if out is not None and _inside(docs, out):
        raise ResultsError(f"--docs {docs} is inside the --out folder {out}, whose files are the "
                           "study's own; give a file outside it.")
    if out is not None and _inside(out, folder):
        which = "is" if _inside(folder, out) else "holds"
        raise ResultsError(f"--docs {docs} would put its figures into {folder}, which {which} "
                           f"the --out folder {out}; choose another name.")
    parent = next(folders.marked_parents(docs), None)
    if parent is not None:
        raise ResultsError(f"--docs {docs} is inside the sinklab folder {parent}, whose files "
                           "are sinklab's own; give a file outside it.")
    if (folder / folders.MARKER).exists():
        raise ResultsError(f"--docs {docs} would put its figures into {folder}, which is a "
                           "sinklab folder; choose another name.")
    ours = False  # records beside FILE that are this study's
    if records.exists() or records.is_symlink():
        try:
            ours = records.is_file() and not records.is_symlink() and \
                read_json(records)["meta"]["study"] == study
        except (ResultsError, KeyError, TypeError):
            ours = False
        if not ours:
            raise ResultsError(f"--docs {docs}: {records} exists and is not the records of an "
                               f"earlier copy of this report; choose another name.")
    if docs.exists() or docs.is_symlink():
        if not docs.is_file() or docs.is_symlink():
            raise ResultsError(f"--docs {docs} is not a regular file; choose another name.")
        marked = marked_study(docs)
        if marked is not None and marked != study:
            raise ResultsError(f"--docs {docs} is sinklab's copy of the report of sinklab "
                               f"{marked}, not of sinklab {study}; choose another file.")
        with docs.open("rb") as f:
            first = f.readline().decode("utf-8", "replace").rstrip("\r\n")
        if marked is None and not (ours and first == title):
            why = ("it has no sinklab mark, and its first line is not the report's title, though "
                   "the records beside it are this study's") if ours else \
                "it has neither sinklab's mark nor this study's records beside it"
            raise ResultsError(f"--docs {docs} exists and is not a copy of this report that "
                               f"sinklab wrote ({why}); choose another file.")
    if folder.exists() or folder.is_symlink():
        if not folder.is_dir() or folder.is_symlink():
            raise ResultsError(f"--docs {docs}: {folder} is not a folder; choose another name.")
        others = [p.name for p in folder.iterdir() if p.suffix != ".png" or not p.is_file()]
        if others:
            raise ResultsError(f"--docs {docs}: {folder} holds files that are not figures "
                               f"({', '.join(sorted(others)[:3])}); choose another name.")
    for above in docs.parents:
        if above.exists():
            if not above.is_dir():
                raise ResultsError(f"--docs {docs}: {above} is a file, not a folder.")
            break


def copy_to_docs(docs: Path, figures: list[Path], text: Callable[[str], str],
                 records: dict[str, Any] | None = None, study: str | None = None) -> None:
    """Write a report to ``docs`` with its figures copied into a folder of the same name and
    its records (when given) beside it as ``.json``, which tests read to check what README
    quotes; with ``study``, the report ends with the mark (``docs_mark``) by which a later
    ``--docs`` knows the file for sinklab's copy.

    ``text(prefix)`` renders the report with figure links starting with ``prefix``. Figures of
    an earlier copy that this report no longer draws are removed (the folder holds figures only,
    as ``check_docs`` made sure)."""
    folder = docs.with_suffix("")
    if records is not None:
        write_json(docs.with_suffix(".json"), records)
    folder.mkdir(parents=True, exist_ok=True)
    names = {fig.name for fig in figures}
    for old in folder.glob("*.png"):
        if old.name not in names:
            old.unlink()
    for fig in figures:
        shutil.copyfile(fig, folder / fig.name)
    report = text(folder.name)
    if study is not None:
        report = report.rstrip("\n") + "\n\n" + docs_mark(study, docs) + "\n"
    write_atomic(docs, report.encode())



# ------------------------------------------------------------------------------ outputs


def _csv_value(value: Any) -> Any:
    if isinstance(value, (list, tuple, dict)):
        return json.dumps(value)
    return "" if value is None else value


def to_csv(rows: Sequence[dict[str, Any]]) -> str:
    """Rows of a record table as CSV; columns in first-seen order, nested values as JSON."""
    columns: dict[str, None] = {}
    for row in rows:
        columns.update(dict.fromkeys(row))
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=list(columns), lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: _csv_value(row.get(k)) for k in columns})
    return buffer.getvalue()


def record_invocation(out: Path, invocation: dict[str, Any]) -> list[dict[str, Any]]:
    """Add a finished invocation to the folder's history in its marker; return the history."""
    marker = folders.read_marker(out) or {}
    history = [*marker.get("invocations", []), invocation]
    folders.update_marker(out, invocations=history)
    return history


def default_log(line: str) -> None:
    print(line, file=sys.stderr, flush=True)



def read_records(folder: Path, study: str) -> dict[str, Any]:
    """A finished study folder's ``records.json``, checked to be of ``study``."""
    folder = Path(folder)
    if not folder.is_dir():
        what = "does not exist" if not folder.exists() else "is a file, not a folder"
        raise ResultsError(f"{folder} {what}; give a folder written by `sinklab {study}`.")
    kind = folders.kind_of(folder)
    if kind != study:
        what = f"a sinklab {folders.describe(kind)}" if kind else "not a sinklab folder"
        raise ResultsError(f"{folder} is {what}, not a folder written by `sinklab {study}`.")
    if not (folder / RECORDS).is_file():
        raise ResultsError(f"{folder} has no {RECORDS} yet (its `sinklab {study}` has not "
                           "finished); run it to the end first.")
    return read_json(folder / RECORDS, f"run `sinklab {study}` with --out {folder} again, which "
                                       "writes it anew from the finished runs inside")


def without_bulk(result: dict[str, Any], bulk: Sequence[str]) -> dict[str, Any]:
    """The result with the record entries only figures need (``Study.bulk``) left out."""
    records = {k: v for k, v in result["records"].items() if k not in bulk}
    return {**result, "records": records}

"""``sinklab report DIR``: every result under DIR in one Markdown report and one self-contained
HTML page.

It finds the folders sinklab wrote (every study's folder and sweep folders by their
``sinklab.json`` marker, older sweeps by their ``sweep.db``) in DIR and the folders below it, and
gathers their reports in the studies' order: each report already says the command, date and versions
behind its numbers. A sweep's section is written here from its store. The HTML page embeds every
figure (base64 PNG), has a table of contents, and uses no JavaScript and no network.

Writes ``OUT/REPORT.md`` (figures linked where they are) and ``OUT/REPORT.html``; OUT defaults to
``DIR/report``, and is a report folder of its own (marked and locked like every folder sinklab
writes), so a folder that is not sinklab's is never written into.
"""

from __future__ import annotations

import base64
import html
import os
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import markdown

from sinklab import formats, studies
from sinklab.errors import ResultsError
from sinklab.runs import folders
from sinklab.runs.files import write_atomic
from sinklab.sweeps.store import DB, Store, is_diverged, shown_metrics
from sinklab.train import versions


@dataclass(frozen=True)
class Found:
    kind: str  # a study's name, or "sweep"
    folder: Path
    title: str
    report: str | None  # the study's report file; None for a sweep (written from its store)


def _study_of(kind: str, marker: dict[str, Any]) -> tuple[str, str] | None:
    """(title, report file) of a study folder: from its marker, or for a folder an older sinklab
    wrote (no study in its marker) from the registered study of that kind; None when the
    folder is not a study's."""
    info = marker.get("study")
    if isinstance(info, dict) and isinstance(info.get("report"), str):
        return str(info.get("title") or kind), info["report"]
    known = {s.name: s for s in studies.all_studies()}
    if kind in known:
        return known[kind].title, known[kind].report
    return None


def _rank(found: Found, order: list[str]) -> tuple[int, str]:
    if found.kind == "sweep":
        return len(order) + 1, str(found.folder)
    return (order.index(found.kind) if found.kind in order else len(order)), str(found.folder)


def find(root: Path, depth: int = 2, skipped: list[str] | None = None) -> list[Found]:
    """sinklab result folders in ``root`` and up to ``depth`` levels below, in report order:
    every registered study in its order, then studies this sinklab does not know (a plugin's,
    recognised by their marker), then sweeps.

    A folder whose marker or database is broken or not sinklab's is left out, with the reason
    appended to ``skipped``; symbolic links are not followed (they may lead anywhere)."""
    found = []
    queue = [(root, 0)]
    while queue:
        folder, level = queue.pop(0)
        try:
            marker = folders.read_marker(folder)
            if marker is None and (folder / DB).is_file():  # a sweep folder from before markers
                Store.read(folder).close()
                marker = {"kind": "sweep"}
        except ResultsError as exc:
            if skipped is not None:
                skipped.append(str(exc))
            continue
        if marker is not None:
            kind = marker["kind"]
            if kind == "sweep":
                found.append(Found("sweep", folder, "Sweep", None))
            elif (study := _study_of(kind, marker)) is not None:
                found.append(Found(kind, folder, *study))
        if level < depth:
            queue += [(p, level + 1) for p in sorted(folder.iterdir())
                      if p.is_dir() and not p.is_symlink() and not p.name.startswith(".")
                      and p.name != "runs"]
    order = [s.name for s in studies.all_studies()]
    return sorted(found, key=lambda f: _rank(f, order))


def _demote(text: str, levels: int) -> str:
    """Every Markdown heading ``levels`` levels down (the gathered report has its own)."""
    return re.sub(r"^(#{1,6}) ", lambda m: "#" * min(6, len(m.group(1)) + levels) + " ",
                  text, flags=re.MULTILINE)


def _relink(text: str, source: Path, out: Path) -> str:
    """Image links of a report in ``source`` made relative to ``out``."""
    def fix(match: re.Match[str]) -> str:
        target = match.group(2)
        if re.match(r"[a-z]+:", target) or target.startswith("/"):
            return match.group(0)
        return f"![{match.group(1)}]({os.path.relpath(source / target, out)})"

    return re.sub(r"!\[([^\]]*)\]\(([^)]+)\)", fix, text)


def sweep_section(folder: Path) -> str:
    """A sweep's report from its store: the command, the counts, every cell."""
    store = Store.read(folder)
    try:
        meta, rows, counts = store.meta(), store.rows(), store.counts()
    finally:
        store.close()
    spec = meta.get("spec_path", "?")
    lines = [f"# Sweep {folder.name}", "",
             f"- Command: `sinklab sweep {spec} --out {folder}` (sinklab "
             f"{meta.get('version', '?')}); `sinklab results {folder}` lists the same cells.",
             "- Cells: " + ", ".join(f"{v} {k}" for k, v in counts.items()), ""]
    if meta.get("origin") != "sweep":
        lines[2] = (f"- The runs of the {meta.get('origin')} folder {folder}, recorded by its "
                    "store.")
    table = []
    for r in rows:
        m = shown_metrics(r)  # a diverged cell's errors and masses are blank
        table.append([r["name"], r["status"], m.get("converged", "-"), m.get("steps", "-"),
                      "" if is_diverged(r) else formats.sci(m.get("linf_error")),
                      "" if is_diverged(r) else formats.fixed(m.get("bos_max"), 3),
                      r["reason"] or ""])
    lines.append(formats.table(["cell", "status", "converged", "steps", "test L∞",
                               "BOS mass (most sinking head)", "reason"], table))
    return "\n".join(lines) + "\n"


def gather(root: Path, out: Path, command: str,
           skipped: list[str] | None = None) -> tuple[str, list[Found]]:
    """The combined Markdown (image links relative to ``out``) and what it gathered."""
    found = find(root, skipped=skipped)
    if not found:
        names = ", ".join(s.name for s in studies.all_studies())
        raise ResultsError(f"{root} holds no sinklab results (folders of {names} or sweep); "
                           "run one of those commands with --out inside it.")
    v = versions()
    lines = ["# sinklab report", "",
             f"- Gathered by `{command}` on {datetime.now(UTC).strftime('%Y-%m-%d %H:%M UTC')}"
             f" (sinklab {v['sinklab']}, torch {v['torch']}, Python {v['python']}); each "
             "section names the command and versions behind its own numbers.",
             "- Contents: " + ", ".join(f"{f.title} (`{f.folder}`)" for f in found), "",
             "[TOC]", ""]
    for f in found:
        if f.report is None:
            text = sweep_section(f.folder)
        else:
            path = f.folder / f.report
            if not path.is_file():
                raise ResultsError(f"{f.folder} is a {f.kind} folder without {path.name}; rerun "
                                   f"its command to write it.")
            try:
                text = path.read_text(encoding="utf-8")
            except UnicodeDecodeError as exc:
                raise ResultsError(f"{path} is not UTF-8 text (byte {exc.start} cannot be "
                                   f"decoded), so it is not the report sinklab {f.kind} wrote; "
                                   f"run `sinklab {f.kind}` with --out {f.folder} again to "
                                   "write it anew.") from None
        lines += [f"## {f.title} (`{f.folder}`)", "",
                  _demote(_relink(text, f.folder, out), 2), ""]
    return "\n".join(lines), found


def contents(text: str) -> str:
    """A Markdown list of the second-level headings, linked with GitHub's anchors."""
    items = []
    for title in re.findall(r"^## (.+)$", text, flags=re.MULTILINE):
        anchor = re.sub(r"[^\w\- ]", "", title.lower()).replace(" ", "-")
        items.append(f"- [{title}](#{anchor})")
    return "\n".join(items) + "\n"


CSS = """body{font-family:sans-serif;max-width:72rem;margin:2rem auto;padding:0 1rem;
line-height:1.45;color:#222}table{border-collapse:collapse;margin:1rem 0;font-size:.85rem}
th,td{border:1px solid #ccc;padding:.2rem .45rem;text-align:left}th{background:#f3f3f3}
img{max-width:100%}code{background:#f3f3f3;padding:0 .2rem}.toc{background:#fafafa;
border:1px solid #ddd;padding:.5rem 1rem}"""


def to_html(markdown_text: str, out: Path, root: Path | None = None) -> str:
    """A standalone page: Markdown rendered, every local PNG inside ``root`` (default ``out``)
    embedded as a data URI. Nothing else is embedded: a report may link any file, but only the
    figures of the results gathered end up inside the page."""
    body = markdown.markdown(markdown_text, extensions=["tables", "toc", "md_in_html",
                                                         "fenced_code"],
                             extension_configs={"toc": {"toc_depth": "2-2"}})

    inside = str(Path(root or out).resolve()) + os.sep

    def embed(match: re.Match[str]) -> str:
        src = html.unescape(match.group(1))
        path = (out / src).resolve()
        if re.match(r"[a-z]+:", src) or not path.is_file() or path.suffix.lower() != ".png" \
                or not str(path).startswith(inside):
            return match.group(0)
        data = base64.b64encode(path.read_bytes()).decode()
        return f'src="data:image/png;base64,{data}"'

    body = re.sub(r'src="([^"]+)"', embed, body)
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>sinklab report</title><style>{CSS}</style></head><body>\n{body}\n"
            "</body></html>\n")


def run_report(root: Path, out: Path | None = None, command: str | None = None) -> dict[str, Any]:
    root = Path(root)
    if not root.is_dir():
        raise ResultsError(f"{root} is not a folder; give a folder that holds sinklab results.")
    out = Path(out) if out is not None else root / "report"
    folders.check_writable(out, "report")
    skipped: list[str] = []
    text, found = gather(root, out, command or f"sinklab report {root}", skipped)
    with folders.writing(out, "report"):
        write_atomic(out / "REPORT.md", text.replace("[TOC]\n", contents(text)).encode())
        write_atomic(out / "REPORT.html", to_html(text, out, root).encode())
    return {"found": [(f.kind, str(f.folder)) for f in found], "out": str(out),
            "skipped": skipped}

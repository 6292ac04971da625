"""README's Layout tree names exactly the package's modules and folders, and no two share a name.

README's ``## Layout`` section holds a fenced tree, one entry a line: a name (``model.py``,
``theory/``) and what it is; an entry indented under a folder lies inside it, and an entry at the
left margin is a path from the repository's root. Every ``.py`` file of ``src/sinklab`` (but
``__init__.py`` and ``__main__.py``) and every folder in it must have its line, and every line
must name something that exists, so the tree cannot go stale: a new module is one new line.
"""

from __future__ import annotations

import re
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "sinklab"
UNLISTED = {"__init__.py", "__main__.py"}  # every package has them; the tree leaves them out


def _layout_block(text: str) -> list[str]:
    """The lines of the first fenced block in README's ``## Layout`` section."""
    section = re.search(r"^## Layout\n(.*?)(?=^## |\Z)", text, re.DOTALL | re.MULTILINE)
    assert section, "README has no '## Layout' section"
    block = re.search(r"^```[^\n]*\n(.*?)^```", section.group(1), re.DOTALL | re.MULTILINE)
    assert block, "README's Layout section has no fenced tree"
    return block.group(1).splitlines()


def _entries(lines: list[str]) -> list[tuple[int, Path, bool]]:
    """(line number in the block, path from the repository root, is a folder) per entry."""
    entries = []
    parents: list[tuple[int, Path]] = []  # (indent, folder) of the open folders
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        indent = len(line) - len(line.lstrip(" "))
        name = line.split()[0]
        while parents and parents[-1][0] >= indent:
            parents.pop()
        path = (parents[-1][1] if parents else ROOT) / name.rstrip("/")
        is_folder = name.endswith("/")
        entries.append((number, path, is_folder))
        if is_folder:
            parents.append((indent, path))
    return entries


def _package_items() -> tuple[set[Path], set[Path]]:
    """The modules (every .py but __init__ and __main__) and folders of src/sinklab; a folder
    counts when it holds a file (one left with only __pycache__ by a move is not the package's)."""
    modules, folders = set(), {PACKAGE}
    for path in PACKAGE.rglob("*"):
        parts = path.relative_to(PACKAGE).parts
        if any(p == "__pycache__" or p.startswith(".") for p in parts) or not path.is_file():
            continue
        folders.update(p for p in path.parents if p.is_relative_to(PACKAGE))
        if path.suffix == ".py" and path.name not in UNLISTED:
            modules.add(path)
    return modules, folders


def _readme_entries() -> list[tuple[int, Path, bool]]:
    return _entries(_layout_block((ROOT / "README.md").read_text()))


def _shown(path: Path) -> str:
    return str(path.relative_to(ROOT))


def test_readme_layout_names_every_module_and_folder_of_the_package():
    named = {path for _, path, _ in _readme_entries()}
    modules, folders = _package_items()
    missing = sorted(_shown(p) + ("/" if p in folders else "") for p in (modules | folders) - named)
    assert not missing, f"README's Layout leaves out {missing}: give each one a line in the tree"


def test_readme_layout_names_nothing_that_does_not_exist():
    wrong = []
    for number, path, is_folder in _readme_entries():
        if is_folder and not path.is_dir():
            wrong.append(f"line {number}: {_shown(path)}/ is not a folder")
        elif not is_folder and not path.is_file():
            wrong.append(f"line {number}: {_shown(path)} is not a file")
    assert not wrong, f"README's Layout names what does not exist: {wrong}"


def test_no_two_modules_of_the_package_share_a_name():
    by_name: dict[str, list[str]] = defaultdict(list)
    for path in _package_items()[0]:
        by_name[path.name].append(_shown(path))
    shared = {name: sorted(paths) for name, paths in by_name.items() if len(paths) > 1}
    assert not shared, f"modules of src/sinklab that share a file name: {shared}"

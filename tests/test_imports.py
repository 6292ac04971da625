"""The package's import graph, read from the source: no cycle, no import hidden in a function
without a reason, and the help texts without torch.

An import inside a function is allowed only where it keeps start-up light: a light module
(one whose own imports reach none of ``HEAVY``) putting off a heavy one until it is needed, or
an optional extra (``OPTIONAL``) that may not be installed. Each says why in a comment on
its line or above its block of imports. Anything else inside a function (a cycle dodged, a
stdlib module) fails.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
HEAVY = {"torch", "scipy", "matplotlib", "jinja2", "markdown", "transformers", "ray"}
OPTIONAL = {"transformers", "gguf", "ray", "huggingface_hub", "accelerate", "markdown"}


@dataclass
class Import:
    importer: str
    target: str  # a sinklab module, or a third-party top-level package
    line: int
    in_function: bool
    reason: bool  # a comment on the line or directly above it


@dataclass
class Graph:
    modules: dict[str, Path]
    imports: list[Import] = field(default_factory=list)

    def edges(self, *, in_functions: bool = True) -> dict[str, set[str]]:
        out: dict[str, set[str]] = {m: set() for m in self.modules}
        for imp in self.imports:
            if imp.target in self.modules and (in_functions or not imp.in_function):
                out[imp.importer].add(imp.target)
        return out

    def reaches(self, module: str) -> set[str]:
        """The third-party packages ``module``'s top-level imports reach, through sinklab's."""
        top = self.edges(in_functions=False)
        seen, todo, found = {module}, [module], set()
        while todo:
            m = todo.pop()
            found |= {i.target for i in self.imports
                      if i.importer == m and not i.in_function and i.target not in self.modules}
            for n in top[m] - seen:
                seen.add(n)
                todo.append(n)
        return found


def _name(path: Path, src: Path) -> str:
    parts = list(path.relative_to(src).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _resolve(name: str, modules: dict[str, Path]) -> str:
    """The sinklab module an imported name lives in (``sinklab.lm.loading`` for
    ``sinklab.lm.loading.load``), or the top-level package of a third-party one."""
    if not name.startswith("sinklab"):
        return name.split(".")[0]
    while name not in modules:
        name = name.rpartition(".")[0]
    return name


def _comment_above(lines: list[str], at: int) -> bool:
    """Whether the block of imports that ends at line ``at`` (0-based) says why: a comment
    line above the block, or a comment on one of its imports, gives the reason of them all."""
    at -= 1
    while at >= 0 and (lines[at].strip().startswith(("from ", "import "))
                       or not lines[at].strip()):  # isort's groups are apart by a blank line
        if "#" in lines[at]:
            return True
        at -= 1
    return at >= 0 and lines[at].strip().startswith("#")


def build(src: Path = SRC) -> Graph:
    modules = {_name(p, src): p for p in sorted((src / "sinklab").rglob("*.py"))}
    graph = Graph(modules)
    for module, path in modules.items():
        text = path.read_text()
        lines = text.split("\n")
        tree = ast.parse(text)
        skipped: set[int] = set()  # under `if TYPE_CHECKING:`: never run
        in_function: set[int] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                skipped |= {id(n) for n in ast.walk(node)}
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                in_function |= {id(n) for n in ast.walk(node) if n is not node}
        for node in ast.walk(tree):
            if id(node) in skipped or not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif node.level == 0 and node.module:
                names = [f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in modules
                         else node.module for a in node.names]
            else:
                continue
            reason = "#" in lines[node.lineno - 1] or _comment_above(lines, node.lineno - 1)
            for name in names:
                target = _resolve(name, modules)
                if target != module and target != "__future__":
                    graph.imports.append(Import(module, target, node.lineno,
                                                id(node) in in_function, reason))
    return graph


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected group of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def misplaced(graph: Graph) -> list[str]:
    """The function-level imports that do not keep start-up light, or give no reason."""
    out = []
    for imp in graph.imports:
        if not imp.in_function:
            continue
        where = f"{imp.importer}:{imp.line} imports {imp.target}"
        if not imp.reason:
            out.append(f"{where} inside a function without saying why")
        elif imp.target in OPTIONAL:
            continue
        elif graph.reaches(imp.importer) & HEAVY:
            out.append(f"{where} inside a function, but {imp.importer} loads "
                       f"{', '.join(sorted(graph.reaches(imp.importer) & HEAVY))} anyway")
        elif imp.target in graph.modules and not graph.reaches(imp.target) & HEAVY:
            out.append(f"{where} inside a function, but {imp.target} is light")
        elif imp.target not in graph.modules and imp.target not in HEAVY:
            out.append(f"{where} inside a function, but {imp.target} is light")
    return out


# ---------------------------------------------------------------------------------- tests


def test_the_package_has_no_import_cycle():
    graph = build()
    assert len(graph.modules) > 40 and len(graph.imports) > 200  # the whole package was read
    assert cycles(graph.edges()) == []


def test_every_import_inside_a_function_keeps_start_up_light():
    assert misplaced(build()) == []


def _package(tmp_path: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = tmp_path / "sinklab" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return tmp_path


def test_a_cycle_hidden_in_a_function_is_found(tmp_path):
    src = _package(tmp_path, {
        "__init__.py": "",
        "a.py": "from sinklab import b\n",
        "b.py": "def f():\n    from sinklab import a  # lazy\n    return a\n",
        "c.py": "import torch\n",
    })
    graph = build(src)
    assert cycles(graph.edges()) == [["sinklab.a", "sinklab.b"]]
    assert cycles(graph.edges(in_functions=False)) == []
    assert misplaced(graph) == ["sinklab.b:2 imports sinklab.a inside a function, but "
                                "sinklab.a is light"]


def test_an_import_inside_a_function_needs_a_reason_and_a_light_importer(tmp_path):
    src = _package(tmp_path, {
        "__init__.py": "",
        "heavy.py": "import torch\n",
        "light.py": ("def f():\n    from sinklab import heavy\n\n\n"
                     "def g():\n    # torch, for --help\n    from sinklab import heavy\n"),
        "loaded.py": "import numpy\nfrom sinklab import heavy\n\n\ndef h():\n"
                     "    import scipy  # scipy\n    import transformers  # an extra\n",
        "typed.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                    "    from sinklab import heavy\n",
    })
    graph = build(src)
    assert misplaced(graph) == [
        "sinklab.light:2 imports sinklab.heavy inside a function without saying why",
        "sinklab.loaded:6 imports scipy inside a function, but sinklab.loaded loads torch anyway",
    ]
    assert graph.reaches("sinklab.typed") == {"typing"}  # a type-only import is not run


HELP_CHECK = """
import sys
from sinklab.cli import build_parser, main
commands = [[]] + [[name] for name in build_parser()._subparsers._group_actions[0].choices]
for command in commands:
    try:
        main(command + ["--help"])
    except SystemExit:
        pass
print(len(commands), " ".join(sorted(m for m in ("torch", "scipy", "matplotlib", "transformers")
                                     if m in sys.modules)))
"""


def test_the_help_texts_import_no_torch():
    out = subprocess.run([sys.executable, "-c", HELP_CHECK], capture_output=True, text=True,
                         check=True, cwd=SRC.parent)
    count, *loaded = out.stdout.split("\n")[-2].split(" ")
    assert int(count) >= 13  # sinklab and each of its commands
    assert [m for m in loaded if m] == []


@pytest.mark.parametrize("module", ["sinklab.lm.sources", "sinklab.lm.settings",
                                    "sinklab.theory.verdicts", "sinklab.definitions",
                                    "sinklab.errors", "sinklab.studies"])
def test_the_light_modules_stay_light(module):
    out = subprocess.run([sys.executable, "-c", f"import sys, {module}; "
                          "print('torch' in sys.modules)"], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "False"

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
    typing_only: bool = False  # under `if TYPE_CHECKING:`: never run, but an arrow all the same
    by_name: bool = False  # ``sinklab.heavy("name")``: how a light module defers a heavy one


@dataclass
class Graph:
    modules: dict[str, Path]
    imports: list[Import] = field(default_factory=list)

    def edges(self, *, in_functions: bool = True, typing: bool = True) -> dict[str, set[str]]:
        out: dict[str, set[str]] = {m: set() for m in self.modules}
        for imp in self.imports:
            if imp.target in self.modules and (in_functions or not imp.in_function) \
                    and (typing or not imp.typing_only):
                out[imp.importer].add(imp.target)
        return out

    def reaches(self, module: str) -> set[str]:
        """The third-party packages ``module``'s top-level imports reach, through sinklab's."""
        top = self.edges(in_functions=False, typing=False)
        seen, todo, found = {module}, [module], set()
        while todo:
            m = todo.pop()
            found |= {i.target for i in self.imports if i.importer == m and not i.in_function
                      and not i.typing_only and i.target not in self.modules}
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


def _heavy_name(call: ast.Call) -> str | None:
    """The module ``heavy("theory.stacks")`` asks for (``sinklab.heavy``), else None."""
    func = call.func
    name = func.id if isinstance(func, ast.Name) else \
        func.attr if isinstance(func, ast.Attribute) else None
    if name != "heavy" or len(call.args) != 1 or not isinstance(call.args[0], ast.Constant) \
            or not isinstance(call.args[0].value, str):
        return None
    return call.args[0].value


def build(src: Path = SRC) -> Graph:
    modules = {_name(p, src): p for p in sorted((src / "sinklab").rglob("*.py"))}
    graph = Graph(modules)
    for module, path in modules.items():
        text = path.read_text()
        lines = text.split("\n")
        tree = ast.parse(text)
        typing_only: set[int] = set()  # under `if TYPE_CHECKING:`: never run
        in_function: set[int] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                typing_only |= {id(n) for n in ast.walk(node)}
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                in_function |= {id(n) for n in ast.walk(node) if n is not node}
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and _heavy_name(node) is not None:
                graph.imports.append(Import(module, _resolve(f"sinklab.{_heavy_name(node)}",
                                                             modules),
                                            node.lineno, True, True, False, True))
                continue
            if not isinstance(node, (ast.Import, ast.ImportFrom)):
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
                                                id(node) in in_function, reason,
                                                id(node) in typing_only))
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
        if not imp.in_function or imp.typing_only:
            continue
        where = f"{imp.importer}:{imp.line} imports {imp.target}"
        if imp.by_name:
            if graph.reaches(imp.importer) & HEAVY:
                out.append(f"{where} by name, but {imp.importer} loads "
                           f"{', '.join(sorted(graph.reaches(imp.importer) & HEAVY))} anyway")
            elif not graph.reaches(imp.target) & HEAVY:
                out.append(f"{where} by name, but {imp.target} is light")
            continue
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


# The floors of the house, lowest first: a module imports only from its own floor or below, so
# the science never reaches up into the studies that use it. A module is on the floor of the
# longest name in the table that is it or a package above it (``sinklab`` names the package's
# own ``__init__`` only).
FLOORS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("ground: errors, numbers, formats, the rule table, settings and files", (
        "sinklab", "sinklab.errors", "sinklab.definitions", "sinklab.stats", "sinklab.formats",
        "sinklab.hooks", "sinklab.attention", "sinklab.config", "sinklab.task", "sinklab.runs",
        "sinklab.lm.settings", "sinklab.lm.sources", "sinklab.lm.head_sets",
        "sinklab.pretrain.runconfig", "sinklab.pretrain.corpora")),
    ("engine: models, training, measurements, claims, real models, language models", (
        "sinklab.kernels", "sinklab.first_key", "sinklab.model", "sinklab.train",
        "sinklab.evaluate", "sinklab.metrics", "sinklab.measure", "sinklab.plugins",
        "sinklab.plots", "sinklab.claims", "sinklab.contrasts", "sinklab.decision_rules",
        "sinklab.lm", "sinklab.pretrain")),
    ("science: the theorem made executable", ("sinklab.theory",)),
    ("running: run kinds and sweeps", ("sinklab.kinds", "sinklab.sweeps")),
    ("studies: the experiment commands", ("sinklab.studies",)),
    ("the top: the gathered report and the command line", (
        "sinklab.report", "sinklab.cli", "sinklab.__main__")),
)

MAX_LINES = 700  # a file that reads in one sitting
LONG_FILES: dict[str, str] = {}  # path under src/sinklab -> why it must stay longer


def floor_of(module: str) -> int | None:
    """The floor (index into ``FLOORS``) of ``module``, or None when the table has no place."""
    best, found = -1, None
    for floor, (_, names) in enumerate(FLOORS):
        for name in names:
            inside = name != "sinklab" and module.startswith(name + ".")  # the package's own
            if (module == name or inside) and len(name) > best:
                best, found = len(name), floor
    return found


def upward(graph: Graph) -> list[str]:
    """Every import that runs from a lower floor to a higher one, and every module that has
    no floor."""
    out = [f"{m} has no floor in FLOORS: give it one" for m in graph.modules
           if floor_of(m) is None]
    for imp in graph.imports:
        if imp.target not in graph.modules:
            continue
        low, high = floor_of(imp.importer), floor_of(imp.target)
        if low is not None and high is not None and high > low:
            out.append(f"{imp.importer}:{imp.line} ({FLOORS[low][0].split(':')[0]}) imports "
                       f"{imp.target} ({FLOORS[high][0].split(':')[0]})")
    return out


def long_files(src: Path = SRC) -> list[str]:
    """Source files over ``MAX_LINES`` lines that the allow-list does not name."""
    out = []
    for path in sorted((src / "sinklab").rglob("*.py")):
        name = str(path.relative_to(src / "sinklab"))
        lines = len(path.read_text().splitlines())
        if lines > MAX_LINES and name not in LONG_FILES:
            out.append(f"{name}: {lines} lines")
    return out


# ---------------------------------------------------------------------------------- tests


def test_the_package_has_no_import_cycle():
    graph = build()
    assert len(graph.modules) > 40 and len(graph.imports) > 200  # the whole package was read
    assert cycles(graph.edges()) == []


def test_no_import_runs_from_a_lower_floor_to_a_higher_one():
    assert upward(build()) == []


def test_the_library_never_imports_the_studies():
    graph = build()
    wrong = [f"{i.importer}:{i.line} imports {i.target}" for i in graph.imports
             if i.target.startswith("sinklab.studies") and floor_of(i.importer) is not None
             and floor_of(i.importer) < floor_of("sinklab.studies")]
    assert wrong == []


def test_every_source_file_reads_in_one_sitting():
    assert long_files() == []
    assert all(reason.strip() for reason in LONG_FILES.values())  # each one says why


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


def test_a_cycle_through_a_type_only_import_is_found_and_an_upward_arrow_named(tmp_path):
    src = _package(tmp_path, {
        "__init__.py": "",
        "stats.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                    "    from sinklab.studies import zoo\n",
        "studies/__init__.py": "",
        "studies/zoo.py": "from sinklab import stats\n",
        "elsewhere.py": "",
    })
    graph = build(src)
    assert cycles(graph.edges()) == [["sinklab.stats", "sinklab.studies.zoo"]]
    assert upward(graph) == ["sinklab.elsewhere has no floor in FLOORS: give it one",
                             "sinklab.stats:3 (ground) imports sinklab.studies.zoo (studies)"]


def test_a_module_asked_for_by_name_is_an_import(tmp_path):
    src = _package(tmp_path, {
        "__init__.py": "def heavy(name):\n    ...\n",
        "config.py": "from sinklab import heavy\n\n\ndef f():\n    return heavy('model')\n",
        "model.py": "import torch\nfrom sinklab import config\n",
        "task.py": "from sinklab import heavy\n\n\ndef g():\n    return heavy('errors')\n",
        "errors.py": "",
    })
    graph = build(src)
    assert cycles(graph.edges()) == [["sinklab.config", "sinklab.model"]]  # through heavy()
    assert misplaced(graph) == ["sinklab.task:5 imports sinklab.errors by name, but "
                                "sinklab.errors is light"]
    assert "sinklab.config:5 (ground) imports sinklab.model (engine)" in upward(graph)


def test_a_long_file_is_named(tmp_path):
    src = _package(tmp_path, {"__init__.py": "", "short.py": "x = 1\n" * MAX_LINES,
                              "deep/long.py": "x = 1\n" * (MAX_LINES + 1)})
    assert long_files(src) == [f"deep/long.py: {MAX_LINES + 1} lines"]


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
                                    "sinklab.theory.protocol", "sinklab.definitions",
                                    "sinklab.errors", "sinklab.studies"])
def test_the_light_modules_stay_light(module):
    out = subprocess.run([sys.executable, "-c", f"import sys, {module}; "
                          "print('torch' in sys.modules)"], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "False"

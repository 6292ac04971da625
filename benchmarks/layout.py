"""The package's layout in numbers: lines per file (the largest ten), files over the limit,
circles, imports from a lower floor to a higher one, and imports inside functions, read with
tests/test_imports.py's own parser (its ``FLOORS`` and ``MAX_LINES``).

    python benchmarks/layout.py              # this checkout's src/
    python benchmarks/layout.py OTHER/src    # another checkout's (a worktree of an older commit)
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

import test_imports as graph_of  # noqa: E402  (the tests' parser, from the path above)


def main(src: Path) -> None:
    graph = graph_of.build(src)
    files = sorted(((len(p.read_text().splitlines()), str(p.relative_to(src / "sinklab")))
                    for p in (src / "sinklab").rglob("*.py")), reverse=True)
    print(f"modules {len(graph.modules)}, lines {sum(n for n, _ in files):,}")
    print("largest ten: " + "; ".join(f"{name} {n:,}" for n, name in files[:10]))
    print(f"files over {graph_of.MAX_LINES} lines: "
          f"{sum(n > graph_of.MAX_LINES for n, _ in files)}")
    print(f"circles (through TYPE_CHECKING and heavy() too): {graph_of.cycles(graph.edges())}")
    up = [u for u in graph_of.upward(graph) if "has no floor" not in u]
    print(f"imports from a lower floor to a higher one: {len(up)}")
    for line in up:
        print(f"  {line}")
    inside = [i for i in graph.imports if i.in_function and not i.typing_only and not i.by_name]
    statements = {(i.importer, i.line) for i in inside}
    own = {(i.importer, i.line) for i in inside if i.target in graph.modules}
    print(f"import statements inside functions: {len(statements)}, {len(own)} of them of "
          "sinklab modules")
    print(f"modules asked for by name (sinklab.heavy): "
          f"{sum(i.by_name for i in graph.imports)}")


if __name__ == "__main__":
    main(Path(sys.argv[1]).resolve() if len(sys.argv) > 1 else ROOT / "src")

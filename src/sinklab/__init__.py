"""sinklab: study attention sinks in transformers, starting from the trigger-conditional task.

Importing the package does nothing but define names; see ``sinklab --help`` for the commands.
"""

import importlib
from types import ModuleType

__version__ = "0.1.0"


def heavy(name: str) -> ModuleType:
    """The sinklab module ``name`` (``"attention"``, ``"theory.stacks"``), imported when it is
    first needed.

    The declarations (run configs, the studies' options and cells) and every help text are read
    without torch, scipy or matplotlib. Where a declaration needs a module that loads them (the
    rule registry to check a rule's name, a run's settings to build a cell), it asks for it here
    by name instead of importing it inside the function: the reason is said once, here, and
    ``tests/test_imports.py`` reads these names as imports (for cycles and floors)."""
    return importlib.import_module(f"sinklab.{name}")

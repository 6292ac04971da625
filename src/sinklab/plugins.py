"""Attention rules of your own: loading the modules (plugins) that register them, here and on
every worker.

A plugin is a Python module that registers rules with ``sinklab.attention.register`` when it is
imported (``examples/plugins/softmax_t.py``). It is named in one of three ways, and loaded before
anything reads the registry:

- ``sinklab --plugin MODULE`` (on every subcommand, repeatable): MODULE is the path of a ``.py``
  file (``examples/plugins/softmax_t.py``) or an importable dotted name (``mylab.rules``); a
  name that ends in ``.py`` or holds a path separator is a path;
- ``SINKLAB_PLUGINS``: the same names, separated by commas;
- an installed package's entry point in the group ``sinklab.rules`` (in its pyproject.toml,
  ``[project.entry-points."sinklab.rules"]`` ``mylab = "mylab.rules"``): its value is a module,
  or an object in one, whose import registers the rules. Every ``sinklab`` command loads them.

From Python, ``load_plugins(["mylab.rules"])`` (or a plain ``import``) does the same.

Plugins travel with every job. ``loaded()`` lists what this process loaded, as ``Plugin``
records, and the sweep executors (``sinklab.sweeps.run``) hand them to each worker, which loads
them before it builds a config: spawned local processes and Ray tasks see the same rules. A
file plugin travels as its source text, so a worker runs exactly the code the driver ran, even
on another machine (anything the file imports must be importable there). A module plugin
travels by name, with the folder it was found in, which a worker on the same machine adds to its
path if it must; on another machine it must be installed.

A plugin that cannot be found, fails to import, or registers a name that exists is a
``PluginError`` of one sentence naming it and the error's first line (exit status 2 on the
command line), and whatever rules it had registered are removed again.

A plugin's rules are checked where they are used. A run's config calls its rule once on small
random scores with a causal mask, as a layer does (``sinklab.attention.check_contract``), before
``sinklab train``, ``sinklab sweep`` (every rule of the spec) or a study writes its folder: a rule
that raises, returns None or weights of the wrong shape, dtype or layout, gives non-finite
weights (or builds non-finite parameters) on finite input, or puts weight on a masked key, is a
``ConfigError`` of one sentence naming the rule, its plugin and what it returned against what is
expected (exit status 2).
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.metadata
import importlib.util
import json
import os
import re
import socket
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from sinklab import attention
from sinklab.errors import ConfigError, PluginError

GROUP = "sinklab.rules"  # the entry point group
ENV = "SINKLAB_PLUGINS"  # comma-separated plugins loaded by every command


@dataclass(frozen=True)
class Plugin:
    """A loaded plugin, as a worker needs it: ``spec`` as it was given (a file's absolute path,
    or a dotted module name), the module name it is imported under, and for a file its source
    text, for a module the ``sys.path`` folder it was found under (None when unknown)."""

    spec: str
    module: str
    source: str | None = None
    root: str | None = None

    @property
    def is_file(self) -> bool:
        return self.source is not None


_LOADED: dict[str, Plugin] = {}  # by spec, in load order


def is_path(spec: str) -> bool:
    """Whether a plugin's name is a file path rather than a dotted module name."""
    return spec.endswith(".py") or "/" in spec or os.sep in spec


def _file_module(path: Path) -> str:
    """The module name a plugin file is imported under: its stem, and a hash of its path so that
    two files of the same name do not collide."""
    stem = re.sub(r"\W", "_", path.stem)
    digest = hashlib.blake2b(str(path).encode(), digest_size=4).hexdigest()
    return f"_sinklab_plugin_{stem}_{digest}"


def _exec_file(plugin: Plugin) -> None:
    """Run a file plugin's source as the module ``plugin.module`` (its ``__file__`` the path)."""
    spec = importlib.util.spec_from_file_location(plugin.module, plugin.spec)
    module = importlib.util.module_from_spec(spec)
    setattr(module, attention.PLUGIN_ATTR, plugin.spec)
    sys.modules[plugin.module] = module  # dataclasses and typing look the module up by name
    try:
        exec(compile(plugin.source, plugin.spec, "exec"), module.__dict__)
    except BaseException:
        sys.modules.pop(plugin.module, None)
        raise


def _root(module: str) -> str | None:
    """The ``sys.path`` folder that holds the top-level package of ``module`` (imported)."""
    top = sys.modules.get(module.partition(".")[0])
    where = getattr(top, "__file__", None)
    if where is None:
        paths = list(getattr(top, "__path__", []))
        return str(Path(paths[0]).parent) if paths else None
    path = Path(where).resolve()
    return str(path.parent.parent if path.name == "__init__.py" else path.parent)


def _import(plugin: Plugin) -> None:
    """Import a module plugin; on a worker that cannot find it, try its recorded folder."""
    try:
        importlib.import_module(plugin.module)
        return
    except ModuleNotFoundError as exc:
        missing = exc.name or ""
        ours = plugin.module == missing or plugin.module.startswith(missing + ".")
        if not ours or plugin.root is None or not Path(plugin.root).is_dir() \
                or plugin.root in sys.path:
            raise
    sys.path.append(plugin.root)
    importlib.import_module(plugin.module)


def _label(origin: str, spec: str) -> str:
    """How a message names a plugin: ``--plugin rules.py``, ``rules.py (in SINKLAB_PLUGINS)``."""
    return f"{spec} (in {origin})" if origin == ENV else f"{origin} {spec}"


def _resolve(spec: str | Plugin, origin: str) -> Plugin:
    """A plugin record for a name given by ``origin`` (``--plugin``, ``SINKLAB_PLUGINS``), or
    the record itself (a worker's copy of the driver's)."""
    if isinstance(spec, Plugin):
        return spec
    if not isinstance(spec, str) or not spec.strip():
        raise PluginError(f"{_label(origin, repr(spec))} is not allowed: give the path of a "
                          ".py file or an importable module name such as mylab.rules.")
    spec = spec.strip()
    if not is_path(spec):
        if not all(part.isidentifier() for part in spec.split(".")):
            raise PluginError(f"{_label(origin, repr(spec))} is neither a .py file nor a "
                              "module name (dotted Python identifiers, such as mylab.rules).")
        return Plugin(spec, spec)
    path = Path(spec).expanduser().resolve()  # one file, one spec, however it is reached
    if not path.is_file():
        what = "is a folder, not a .py file" if path.is_dir() else "does not exist"
        raise PluginError(f"{_label(origin, spec)}: {path} {what}; give the path of a .py "
                          "file or an importable module name such as mylab.rules.")
    try:
        source = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise PluginError(f"{_label(origin, spec)} could not be read "
                          f"({attention.first_line(exc)}).") from None
    return Plugin(str(path), _file_module(path), source=source)


def load_plugins(modules: Iterable[str | Plugin], origin: str = "--plugin",
                 where: str = "") -> list[str]:
    """Load each plugin once (a ``.py`` file's path or a dotted module name, see the module
    docstring; or a ``Plugin`` record from ``loaded()``); return the names of the rules they
    registered. ``origin`` says where the names came from and ``where`` where they are loaded,
    for the error message."""
    added: list[str] = []
    for spec in modules:
        plugin = _resolve(spec, origin)
        if plugin.spec in _LOADED:
            continue
        added += _registering(
            lambda plugin=plugin: _exec_file(plugin) if plugin.is_file else _import(plugin),
            lambda exc, plugin=plugin: _failure(plugin, origin, where, exc))
        if not plugin.is_file and plugin.root is None:
            plugin = Plugin(plugin.spec, plugin.module, root=_root(plugin.module))
        _LOADED[plugin.spec] = plugin
    return added


def _registering(load: Callable[[], object], failure: Callable[[BaseException], str]
                 ) -> list[str]:
    """Run ``load`` (an import that registers rules) and return the names of the rules it
    registered; if it raises, the registry is left as it was and the error is a PluginError
    with the sentence ``failure(exc)``."""
    before = set(attention.RULES)
    try:
        load()
    except (Exception, SystemExit) as exc:
        for name in set(attention.RULES) - before:
            del attention.RULES[name]
        raise PluginError(failure(exc)) from None
    return [name for name in attention.RULES if name not in before]


def _failure(plugin: Plugin, origin: str, where: str, exc: BaseException) -> str:
    """One sentence for a plugin that failed to load: a module that is not there, or the
    first line of what its import raised."""
    if isinstance(exc, ModuleNotFoundError) and exc.name and (
            plugin.module == exc.name or plugin.module.startswith(exc.name + ".")):
        return (f"{_label(origin, plugin.spec)}: no module named {exc.name!r} can be "
                f"imported{where}; give the path of a .py file, or install the module (or add "
                "its folder to PYTHONPATH).")
    return (f"{_label(origin, plugin.spec)} could not be loaded{where}: "
            f"{attention.first_line(exc)}.")


def load_entry_points() -> list[str]:
    """Load every installed entry point of the group ``sinklab.rules``; return the names of the
    rules they registered. An entry point that fails is a PluginError naming it and its
    package."""
    added: list[str] = []
    for ep in importlib.metadata.entry_points(group=GROUP):
        if ep.module in _LOADED:
            continue
        package = ep.dist.name if ep.dist is not None else "an unknown package"
        origin = f"entry point {ep.name} = {ep.value} (group {GROUP}, package {package})"
        added += _registering(ep.load, lambda exc, origin=origin:
                              f"{origin} could not be loaded: {attention.first_line(exc)}.")
        _LOADED[ep.module] = Plugin(ep.module, ep.module, root=_root(ep.module))
    return added


def from_environment(value: str | None = None) -> list[str]:
    """The plugins named by ``SINKLAB_PLUGINS`` (or ``value``), comma separated."""
    text = os.environ.get(ENV, "") if value is None else value
    return [part.strip() for part in text.split(",") if part.strip()]


def load_all(flags: Sequence[str] = ()) -> list[str]:
    """What every ``sinklab`` command loads first: the entry points, ``SINKLAB_PLUGINS`` and
    ``--plugin`` flags, in that order; the names of the rules they registered."""
    return (load_entry_points() + load_plugins(from_environment(), ENV)
            + load_plugins(flags, "--plugin"))


def loaded() -> list[Plugin]:
    """The plugins a worker must load to see this process's registry: every plugin loaded here,
    and the module of any other rule registered from outside sinklab (imported directly, not
    through ``load_plugins``). A rule defined in a script run as ``__main__`` cannot travel."""
    plugins = list(_LOADED.values())
    known = {p.module for p in plugins} | {p.spec for p in plugins}
    for info in attention.RULES.values():
        module = getattr(info.rule, "__module__", "")
        if info.module == "sinklab" or module in known or module == "__main__" \
                or module not in sys.modules:
            continue
        known.add(module)
        plugins.append(Plugin(module, module, root=_root(module)))
    return plugins


def sources(rules: Iterable[str]) -> list[str]:
    """Where the rules named come from, for a record: the plugins (a file's path, a module's
    name) that registered those not sinklab's own, each once."""
    found: list[str] = []
    for name in rules:
        info = attention.RULES.get(name)
        if info is not None and info.module != "sinklab" and info.module not in found:
            found.append(info.module)
    return found


def load_on_worker(plugins: Sequence[Plugin]) -> None:
    """Load the driver's plugins in a worker process (a no-op for those loaded already)."""
    load_plugins(plugins, "plugin", f" on the worker on {socket.gethostname()}")


def check_rule(name: str, where: str) -> None:
    """A ConfigError unless the attention rule ``name`` is registered: ``where`` (a run folder,
    a sweep) was made with a rule that only a plugin registers."""
    if name not in attention.RULES:
        raise ConfigError(f"{where} uses the attention rule {name!r}, which is not registered "
                          f"here: {attention.PLUGIN_HINT} (`sinklab rules --plugin MODULE` "
                          "lists what a plugin registers).")


def check_run(run: Path) -> None:
    """``check_rule`` for the run folder ``run``: its config's rule must be registered. A
    folder without a readable config is left to the code that reads it (which names it)."""
    try:
        rule = json.loads((Path(run) / "config.json").read_text())["model"]["attention"]
    except (OSError, ValueError, KeyError, TypeError):
        return
    if isinstance(rule, str):
        check_rule(rule, str(run))

"""sinklab's error classes. Every one is bad input, said in one sentence: ``sinklab.cli`` prints
its message and exits with status 2 (1 for a diverged run or a failed sweep cell). This module
imports nothing, so a module that only raises an error stays light."""


class SinklabError(Exception):
    """An error caused by the user's input; the CLI prints its message as one sentence."""


class ConfigError(SinklabError, ValueError):
    """A configuration value, key or file that is not allowed."""


class ResultsError(SinklabError):
    """A results file or folder that is missing, corrupted or not sinklab's."""


class LMError(SinklabError):
    """A real model that cannot be found or loaded, or a missing optional dependency."""


class PluginError(SinklabError):
    """A plugin that cannot be loaded; the message names it and what went wrong."""


class Interrupted(KeyboardInterrupt):
    """A study stopped by an interrupt, with what it keeps in words (``sinklab.cli`` prints
    them, instead of the words for studies that keep finished runs)."""

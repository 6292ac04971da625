"""sinklab: study attention sinks in transformers, starting from the trigger-conditional task.

Importing the package does nothing but define names; see ``sinklab --help`` for the commands.
"""

__version__ = "0.1.0"

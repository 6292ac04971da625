"""Attention rules registered from outside sinklab, as a user's package would: the tests load
this package as a plugin before collection (``tests/conftest.py``), so every registry-wide test
runs on a parameter-free rule with a keyword argument (``relu_power``) and on a rule with learned
parameters (``learned_temperature``) that sinklab itself does not define."""

from . import power, temperature  # noqa: F401  (importing them registers their rules)

"""The tests' fixtures. Importing ``helpers`` here loads the test plugins before any test
module is collected (``helpers.PLUGIN_RULES``)."""

from __future__ import annotations

import pytest
import torch

import helpers  # noqa: F401  (loads the test plugins before collection)


@pytest.fixture(autouse=True)
def _threads():
    # Tests run on the CPU with one thread: deterministic and fair to CI's two cores.
    torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _registry():
    """Each test leaves the registry of rules (and the plugins loaded) as it found it: a test
    that loads a plugin of its own must not add rules that other tests' messages list."""
    from sinklab import attention, plugins

    rules, loaded = dict(attention.RULES), dict(plugins._LOADED)
    yield
    attention.RULES.clear()
    attention.RULES.update(rules)
    plugins._LOADED.clear()
    plugins._LOADED.update(loaded)


@pytest.fixture
def local_ray(monkeypatch):
    """A local Ray instance with two CPUs for one test, stopped after it. Token authentication
    is off for it (RAY_AUTH_MODE=disabled): Ray's default would write ~/.ray/auth_token."""
    ray = pytest.importorskip("ray")
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        yield ray
    finally:
        ray.shutdown()

"""Attention rules of one's own (sinklab.plugins): found through an installed entry point, a
dotted module name or a file path; listed by `sinklab rules`; trained from the command line with
keyword arguments; carried to spawned local workers and to Ray workers; refused in one sentence
when they cannot be loaded, or when a rule breaks the contract where it is used (before any
folder is written); and a model built with one has the same activation cache and hooks.

The registry-wide tests (tests/test_attention.py, tests/test_model.py, tests/test_attack.py) run
on the test plugins too: tests/conftest.py loads them before collection.
"""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from helpers import EXAMPLE_PLUGIN, PLUGIN_RULES, run_cli
from sinklab import attention, kernels, plugins
from sinklab.attention import RULES, rule_info
from sinklab.config import build_run_config
from sinklab.errors import ConfigError
from sinklab.hooks import Hooks
from sinklab.model import AttentionStack, run_with_cache
from sinklab.sweeps import run as sweep_run
from sinklab.sweeps.store import Store

RULE_SOURCE = '''
from torch import Tensor
from sinklab.attention import Arg, register


@register({name!r}, row_kind="free", kwargs={{"scale": Arg("multiplies every weight")}})
def rule(scores: Tensor, mask: Tensor, *, scale: float = 1.0) -> Tensor:
    """ReLU attention times a scale, registered by a test plugin."""
    return scores.relu() * mask * scale
'''


@pytest.fixture
def registry():
    """Leave the registry, the loaded plugins and the modules as they were before the test."""
    rules, loaded, modules = dict(RULES), dict(plugins._LOADED), set(sys.modules)
    try:
        yield
    finally:
        RULES.clear()
        RULES.update(rules)
        plugins._LOADED.clear()
        plugins._LOADED.update(loaded)
        for name in set(sys.modules) - modules:
            if name.startswith(("_sinklab_plugin_", "h1_")):
                del sys.modules[name]


def rule_module(folder: Path, module: str, rule: str) -> Path:
    """A module ``module``.py in ``folder`` that registers the rule ``rule``."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{module}.py"
    path.write_text(RULE_SOURCE.format(name=rule))
    return path


def dist_info(site: Path, package: str, entry_points: str) -> None:
    """An installed distribution's metadata in ``site``, as pip writes it: the honest way to
    give importlib.metadata an entry point."""
    info = site / f"{package}-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {package}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(textwrap.dedent(entry_points))


# --------------------------------------------------------------------------- finding plugins


def test_test_plugins_are_registered_with_their_modules():
    assert sorted(PLUGIN_RULES) == ["learned_temperature", "relu_power", "softmax_t"]
    assert rule_info("relu_power").module == "plugin_rules.power"
    assert rule_info("learned_temperature").module == "plugin_rules.temperature"
    assert rule_info("learned_temperature").parameters
    assert rule_info("softmax_t").module == str(EXAMPLE_PLUGIN)
    assert {s.spec for s in plugins.loaded()} >= {"plugin_rules", str(EXAMPLE_PLUGIN)}


def test_an_installed_entry_point_registers_its_rules(tmp_path, capsys, monkeypatch, registry):
    site = tmp_path / "site"
    rule_module(site, "h1_ep_rules", "ep_relu")
    dist_info(site, "h1-ep-rules", """
        [sinklab.rules]
        relu_scaled = h1_ep_rules:rule
        """)
    monkeypatch.syspath_prepend(str(site))
    code, out, err = run_cli(capsys, "rules")
    assert code == 0, err
    line = next(x for x in out.splitlines() if x.startswith("ep_relu "))
    assert "rows: free; no parameters; plugin h1_ep_rules. ReLU attention times a scale" in line
    assert "model.attention_args.scale: float = 1.0 -- multiplies every weight" in out
    found = plugins.Plugin("h1_ep_rules", "h1_ep_rules", root=str(site.resolve()))
    assert found in plugins.loaded()
    assert plugins.load_entry_points() == []  # once


def test_a_broken_entry_point_is_one_sentence(tmp_path, capsys, monkeypatch, registry):
    site = tmp_path / "site"
    site.mkdir()
    (site / "h1_broken.py").write_text("raise RuntimeError('no GPU here\\nsecond line')\n")
    dist_info(site, "h1-broken", "[sinklab.rules]\nbroken = h1_broken\n")
    monkeypatch.syspath_prepend(str(site))
    code, out, err = run_cli(capsys, "rules")
    assert code == 2 and out == ""
    assert err == ("sinklab: error: entry point broken = h1_broken (group sinklab.rules, package "
                   "h1-broken) could not be loaded: RuntimeError: no GPU here.\n")


def test_plugin_by_dotted_name_by_path_and_from_the_environment(tmp_path, capsys, monkeypatch,
                                                                registry):
    rule_module(tmp_path / "pkgs", "h1_dotted", "dotted_relu")
    monkeypatch.syspath_prepend(str(tmp_path / "pkgs"))
    path = rule_module(tmp_path / "elsewhere", "h1_file", "file_relu")  # not on sys.path
    code, out, err = run_cli(capsys, "rules", "--plugin", "h1_dotted", "--plugin", str(path))
    assert code == 0, err
    assert "dotted_relu rows: free; no parameters; plugin h1_dotted." in out
    assert f"file_relu  rows: free; no parameters; plugin {path}." in out
    assert rule_info("file_relu").module == str(path)
    # loaded once: naming them again (the file by another path) registers nothing twice
    monkeypatch.chdir(path.parent)
    assert plugins.load_plugins(["h1_dotted", "h1_file.py"]) == []
    monkeypatch.setenv("SINKLAB_PLUGINS", f" {rule_module(tmp_path, 'h1_env', 'env_relu')} ,")
    code, out, _ = run_cli(capsys, "--plugin", "h1_dotted", "rules")  # before the subcommand too
    assert code == 0 and "env_relu" in out


def test_a_rule_imported_directly_still_travels(tmp_path, monkeypatch, registry):
    rule_module(tmp_path, "h1_direct", "direct_relu")
    monkeypatch.syspath_prepend(str(tmp_path))
    __import__("h1_direct")
    found = plugins.Plugin("h1_direct", "h1_direct", root=str(tmp_path.resolve()))
    assert found in plugins.loaded()
    assert plugins.sources(["softmax", "direct_relu", "relu_power"]) == ["h1_direct",
                                                                         "plugin_rules.power"]


def test_a_plugin_that_fails_registers_nothing(tmp_path, registry):
    path = tmp_path / "half.py"
    path.write_text(RULE_SOURCE.format(name="half_relu") + "\nraise ValueError('oops')\n")
    with pytest.raises(plugins.PluginError, match=r"could not be loaded: ValueError: oops\.$"):
        plugins.load_plugins([str(path)])
    assert "half_relu" not in RULES and str(path) not in plugins._LOADED
    assert not any(m.startswith("_sinklab_plugin_half") for m in sys.modules)


def test_a_rule_name_must_be_an_identifier(registry):
    with pytest.raises(ValueError, match="attention rule name 'my rule' .* is not allowed"):
        attention.register("my rule", row_kind="free")(lambda s, m: s)


# ------------------------------------------------------------------------------- workers


def test_a_worker_runs_the_shipped_source_of_a_file_plugin(tmp_path, registry):
    """A Ray worker on another machine has no copy of the file: the job carries its text."""
    remote = plugins.Plugin("/nowhere/remote_rules.py", "_sinklab_plugin_remote_test",
                            source=RULE_SOURCE.format(name="remote_relu"))
    plugins.load_on_worker([remote])
    assert rule_info("remote_relu").module == "/nowhere/remote_rules.py"
    # a module found in a folder the driver had on its path, which this worker has not
    rule_module(tmp_path, "h1_rooted", "rooted_relu")
    try:
        plugins.load_on_worker([plugins.Plugin("h1_rooted", "h1_rooted", root=str(tmp_path))])
        assert "rooted_relu" in RULES
    finally:
        sys.path.remove(str(tmp_path))
    job = [("cell", build_run_config({"train": {"max_steps": 2}}).to_dict())]
    absent = plugins.Plugin("h1_absent", "h1_absent")
    (result,) = sweep_run.compute(job, [absent])
    assert result["name"] == "cell" and result["error"].startswith(
        "plugin h1_absent: no module named 'h1_absent' can be imported on the worker on ")


# ------------------------------------------------------------------- train, read, sweep


def test_train_a_plugin_rule_with_keyword_arguments_and_read_the_run(tmp_path, capsys,
                                                                     monkeypatch):
    out = tmp_path / "t2"
    code, stdout, err = run_cli(capsys, "train", "--plugin", str(EXAMPLE_PLUGIN),
                                "model.attention=softmax_t", "model.attention_args.t=2",
                                "train.max_steps=3", "eval.n_sequences=8", "--out", str(out))
    assert code == 0, err
    assert "softmax_t 1x1, seed 0: stopped without converging at 3 steps" in stdout
    config = json.loads((out / "config.json").read_text())
    assert config["model"]["attention"] == "softmax_t"
    assert config["model"]["attention_args"] == {"t": 2.0}
    assert json.loads((out / "summary.json").read_text())["engine"] == "pytorch"
    code, stdout, err = run_cli(capsys, "worst", str(out), "--attack-steps", "2",
                                "--restarts", "1")
    assert code == 0, err
    assert "1x1 softmax_t" in stdout and "not certified" in stdout
    code, _, err = run_cli(capsys, "train", "--plugin", str(EXAMPLE_PLUGIN),
                           "model.attention=softmax_t", "model.attention_args.t=0",
                           "--out", str(tmp_path / "t0"))
    assert code == 2 and "model.attention_args.t=0.0 is not allowed: softmax_t's t must be a " \
                         "number > 0." in err
    monkeypatch.delitem(RULES, "softmax_t")  # as in a later process without the plugin
    code, _, err = run_cli(capsys, "worst", str(out))
    assert code == 2 and err.count("\n") == 1
    assert f"{out} uses the attention rule 'softmax_t', which is not registered here: a rule " \
           "of your own needs its plugin loaded: --plugin MODULE" in err


MASK_BLIND_GATE = '''
import torch
from sinklab.attention import ParamRule, register


@register("blind_gate", row_kind="free")
class BlindGate(ParamRule):
    """ReLU attention times a learned per-head gate, and the mask forgotten."""

    def __init__(self, n_members, n_heads, d_model):
        super().__init__(n_members, n_heads, d_model)
        self.gate = torch.nn.Parameter(torch.ones(n_members, n_heads))

    def forward(self, scores, mask, x=None):
        gate = self.per_row(self.gate.sigmoid(), scores.shape[-2])[..., None]
        return (self.split(scores).relu() * gate).view_as(scores)
'''


def test_a_plugin_rule_that_breaks_the_contract_is_refused_before_its_folder(tmp_path, capsys,
                                                                            registry):
    path = tmp_path / "gate.py"
    path.write_text(MASK_BLIND_GATE)
    code, out, err = run_cli(capsys, "train", "--plugin", str(path), "model.attention=blind_gate",
                             "--out", str(tmp_path / "o"))
    assert code == 2 and out == "" and err.count("\n") == 1
    assert err.startswith(f"sinklab: error: attention rule 'blind_gate' (from plugin {path}) put "
                          "weight on masked keys on finite scores of shape (4, 10, 5)")
    assert not (tmp_path / "o").exists()


def test_a_plugin_argument_that_overflows_in_float32_is_refused_by_the_config():
    # learned_temperature multiplies the scores by e^init: e^100 is inf in float32
    with pytest.raises(ConfigError) as info:
        build_run_config({"model": {"attention": "learned_temperature",
                                    "attention_args": {"init": 100}}})
    assert str(info.value).startswith(
        "attention rule 'learned_temperature' (from plugin plugin_rules.temperature) with "
        "init=100.0 returned ")
    assert "non-finite weights (nan) on finite scores" in str(info.value)
    with pytest.raises(ConfigError, match=r"^model.attention_args.init=1e\+39 is not allowed: "
                                          "learned_temperature's init must be a finite number "
                                          r"with \|x\| <= 3.4028e38"):
        build_run_config({"model": {"attention": "learned_temperature",
                                    "attention_args": {"init": 1e39}}})


def test_plugin_rules_never_take_the_fused_kernel():
    for rule in PLUGIN_RULES:
        assert kernels.engine(rule, 8, 8) == "pytorch"


PLUGIN_SPEC = """seeds = 1

[base]
train.max_steps = 5
eval.n_sequences = 16
task.seq_len = 8
task.d_model = 8

[grid]
"model.attention" = ["relu_power", "learned_temperature", "softmax_t"]
"""


def check_plugin_sweep(out: Path) -> None:
    store = Store.read(out)
    try:
        rows = store.rows()
        assert [r["status"] for r in rows] == ["done"] * 3, [r["reason"] for r in rows]
        assert [r["config"]["model"]["attention"] for r in rows] == [
            "relu_power", "learned_temperature", "softmax_t"]
        assert store.plugins() == ["plugin_rules.power", "plugin_rules.temperature",
                                   str(EXAMPLE_PLUGIN)]
    finally:
        store.close()


@pytest.mark.slow
def test_a_sweep_of_plugin_rules_on_spawned_workers(tmp_path, capsys, monkeypatch):
    spec, out = tmp_path / "spec.toml", tmp_path / "sw"
    spec.write_text(PLUGIN_SPEC)
    code, _, err = run_cli(capsys, "sweep", str(spec), "--out", str(out), "--workers", "2",
                           "--plugin", str(EXAMPLE_PLUGIN))
    assert code == 0, err
    assert "3 to run in 3 ensembles on local (2 worker(s))" in err  # a pool of new processes
    check_plugin_sweep(out)
    # resuming in a process without the plugins names the ones the sweep ran with
    for rule in PLUGIN_RULES:
        monkeypatch.delitem(RULES, rule)
    code, _, err = run_cli(capsys, "sweep", str(spec), "--out", str(out))
    assert code == 2 and err.count("\n") == 1
    assert "grid key 'model.attention' (line 10): 'relu_power' is not a registered attention " \
           "rule" in err
    assert f"a rule of your own needs its plugin loaded: --plugin MODULE; {out} ran with " \
           f"--plugin plugin_rules.power --plugin plugin_rules.temperature --plugin " \
           f"{EXAMPLE_PLUGIN}." in err


@pytest.mark.slow
def test_a_sweep_of_plugin_rules_on_a_local_ray_instance(tmp_path, capsys, local_ray):
    # Ray's workers start from its own path: plugin_rules (in tests/) is found through the
    # folder the driver recorded, the example file through the text the job carries.
    spec, out = tmp_path / "spec.toml", tmp_path / "ray"
    spec.write_text(PLUGIN_SPEC)
    code, _, err = run_cli(capsys, "sweep", str(spec), "--out", str(out), "--executor", "ray",
                           "--workers", "2")
    assert code == 0, err
    check_plugin_sweep(out)


# ------------------------------------------------------------------------ cache and hooks


def test_cache_and_hooks_work_on_a_model_built_with_a_plugin_rule():
    cfg = build_run_config({"model": {"attention": "learned_temperature", "n_layers": 2,
                                      "n_heads": 2, "attention_args": {"init": 0.5}},
                            "task": {"seq_len": 8, "d_model": 8}})
    model = AttentionStack(cfg.model, cfg.task.d_model, residual=True)
    model.init_member(0, torch.Generator().manual_seed(0))
    assert torch.all(model.blocks[0].attn.rule.log_scale == 0.5)
    x = torch.randn(3, 8, 8, generator=torch.Generator().manual_seed(1))
    out, cache = run_with_cache(model, x)
    plain = model(x, return_weights=True)
    torch.testing.assert_close(out.out, plain.out)
    for layer in range(2):
        pattern = cache[f"blocks.{layer}.attn.pattern"]  # (E, B, H, Q, K)
        torch.testing.assert_close(pattern, plain.patterns[layer])
        torch.testing.assert_close(pattern.sum(-1), torch.ones(1, 3, 2, 8))  # a simplex rule
        assert torch.all(pattern.triu(1) == 0)
        result = cache[f"blocks.{layer}.attn.result"].sum(3)  # the heads' outputs sum up
        torch.testing.assert_close(cache[f"blocks.{layer}.resid_pre"] + result,
                                   cache[f"blocks.{layer}.resid_post"])
    hooks = Hooks({"blocks.1.attn.pattern": lambda w, name: torch.zeros_like(w)},
                  keep=["blocks.1.resid_pre", "blocks.1.resid_post"])
    edited = model(x, hooks=hooks)  # no attention in layer 1: it passes its input through
    torch.testing.assert_close(hooks.cache["blocks.1.resid_post"],
                               hooks.cache["blocks.1.resid_pre"])
    torch.testing.assert_close(edited.out, hooks.cache["blocks.1.resid_pre"])

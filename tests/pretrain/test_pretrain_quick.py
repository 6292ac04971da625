"""``sinklab pretrain --quick``: the options the user gives win over the quick preset and are
checked as without it, and a quick run says, at the end of its output and at the top of its
report, that it is a smoke test of the machinery."""

from __future__ import annotations

import json

import pytest

from sinklab.cli import main
from sinklab.studies import pretrain as pt
from sinklab.studies.options import build_options
from sinklab.studies.study import Execution

EXE = Execution(device="cpu")


def _options(*flags: str, **given: str):
    """The options as the command line builds them from ``given`` flags (field -> text)."""
    return build_options(pt.STUDY, flags={"quick": "--quick" in flags, **given})


def _cells(opts) -> dict[str, object]:
    return {cell.name: cell.config for cell in pt.cells(opts, EXE)}


def test_quick_alone_trains_its_preset():
    cells = _cells(_options("--quick", corpus="pydoc"))
    assert sorted(cells) == sorted(f"runs/{rule}_seed{s}" for rule in pt.QUICK_RULES
                                   for s in range(pt.QUICK_SEEDS))
    for cfg in cells.values():
        assert (cfg.model.d_model, cfg.model.n_heads, cfg.model.n_layers, cfg.model.context,
                cfg.train.tokens) == tuple(pt.QUICK[k] for k in ("d_model", "n_heads", "n_layers",
                                                                 "context", "tokens"))
        assert cfg.train.lr == pt.QUICK_LR


def test_sizes_tokens_rules_and_seeds_given_with_quick_win_over_its_preset():
    opts = _options("--quick", corpus="pydoc", d_model="64", n_heads="4", n_layers="3",
                    context="128", tokens="50000", seeds="5", softmax_seeds="3",
                    rules="softmax,relu,uniform", control_seeds="1")
    cells = _cells(opts)
    seeds = {rule: sum(name.startswith(f"runs/{rule}_seed") for name in cells)
             for rule in ("softmax", "relu", "uniform")}
    assert seeds == {"softmax": 3, "relu": 5, "uniform": 1}
    for cfg in cells.values():
        assert (cfg.model.d_model, cfg.model.n_heads, cfg.model.n_layers, cfg.model.context,
                cfg.train.tokens) == (64, 4, 3, 128, 50_000)
    # a seed option left out is --quick's, per rule, as without --quick it is the preset's
    opts = _options("--quick", corpus="pydoc", seeds="4")
    assert [opts.n_seeds(r) for r in pt.QUICK_RULES] == [pt.QUICK_SEEDS, 4]
    assert [opts.n_seeds(r) for r in ("softmax", "relu")] == [pt.QUICK_SEEDS, 4]
    full = _options(corpus="pydoc", d_model="64")
    assert full.softmax_seeds == pt.SEED_DEFAULTS["softmax_seeds"][0] and full.preset == "cpu"


@pytest.mark.parametrize("sizes", [["--d-model", "7", "--n-heads", "3"],
                                   ["--d-model", "64", "--n-heads", "3"],
                                   ["--context", "100000"]])
def test_sizes_given_with_quick_are_refused_as_without_it(tmp_path, capsys, sizes):
    errors = []
    for quick in ([], ["--quick"]):
        out = tmp_path / f"p{len(quick)}"
        code = main(["pretrain", *quick, "--corpus", "pydoc", *sizes, "--out", str(out)])
        err = capsys.readouterr().err
        assert code == 2 and err.startswith("sinklab: error: ") and not out.exists(), err
        errors.append(err)
    assert errors[0] == errors[1]


@pytest.mark.parametrize(("extra", "message"), [
    (["--variant-seeds", "3"], "--variant-seeds=3 is not allowed with --quick, which trains no "
                               "factors and no budget control: leave out one of them."),
    (["--budget-seeds", "0"], "--budget-seeds=0 is not allowed with --quick"),
    (["--preset", "gpu"], "--preset 'gpu' is not allowed with --quick, whose model and budget "
                          "are its own"),
    (["--seeds", "0"], "--seeds=0 is not allowed: it must be an integer >= 1."),
    (["--tokens", "5"], f"--tokens=5 is not allowed: the budget must hold at least one batch of "
                        f"{pt.QUICK['batch_size']} windows of {pt.QUICK['context']} tokens"),
])
def test_options_quick_cannot_use_are_refused_not_dropped(tmp_path, capsys, extra, message):
    code = main(["pretrain", "--quick", "--corpus", "pydoc", *extra, "--out", str(tmp_path / "p")])
    err = capsys.readouterr().err
    assert code == 2 and message in err and "Traceback" not in err, err


def test_a_quick_run_says_it_is_a_smoke_test_at_the_end_and_atop_its_report(tmp_path, capsys):
    out = tmp_path / "pq"
    code = main(["pretrain", "--quick", "--corpus", "pydoc", "--d-model", "8", "--n-heads", "2",
                 "--n-layers", "1", "--context", "16", "--tokens", "128", "--seeds", "1",
                 "--softmax-seeds", "1", "--workers", "1", "--out", str(out)])
    stdout, err = capsys.readouterr()
    assert code == 0, err
    lines = stdout.strip().splitlines()
    last = lines[lines.index(f"wrote {out / 'PRETRAIN.md'}") + 1]  # after the report, last
    assert last.startswith("pretrain: --quick is a smoke test of the machinery, not a study of "
                           "sinks") and "128 tokens a run" in last
    records = json.loads((out / "records.json").read_text())["records"]
    assert records["protocol"]["d_model"] == 8 and records["protocol"]["tokens"] == 128
    head = (out / "PRETRAIN.md").read_text().split("\n\n")[1]
    assert head.startswith("> **A smoke test of the machinery (`--quick`), not a study of "
                           "sinks.** Each run saw 128 tokens"), head
    assert "width 8 with 2 heads each" in (out / "PRETRAIN.md").read_text()

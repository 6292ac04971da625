"""What a newcomer's first hour rests on: each study's --quick trains the runs that can show its
main effect (1x1 softmax and ReLU reaching the stop rule), and each finished job's log line says
whether its heads sink. The quick runs themselves are timed by hand (docs/usage.md); here their
plans are checked, which costs no training."""

from __future__ import annotations

from sinklab import kinds
from sinklab.studies import extensions as ext
from sinklab.studies import reproduce as rp
from sinklab.studies import theory as th
from sinklab.studies import zoo
from sinklab.studies.study import Execution
from sinklab.theory import protocol

# steps the reproduction's 1x1 seeds 0-11 took to the stop rule at the paper's rate 1e-3
# (softmax 726-899, ReLU 661-726 here): a quick 1x1 cap must leave room for them
STEPS_1X1 = 900


def _summary(sink_heads: int, mass: float, status: str = "converged") -> dict:
    return {"kind": None, "steps": 800, "converged": status == "converged", "status": status,
            "seed": 0, "n_layers": 1, "n_heads": 1, "sink_heads": sink_heads,
            "bos_mass_nontrigger": [[mass]]}


def test_a_finished_jobs_log_line_says_whether_its_heads_sink():
    sink = kinds.describe([_summary(1, 0.99977)], 3.0)
    assert "sink heads 1 of 1" in sink and "BOS mass 1 - 2.30e-04" in sink
    none = kinds.describe([_summary(0, 0.0)], 3.0)
    assert "sink heads 0 of 1" in none and "BOS mass 0)" in none
    both = kinds.describe([_summary(0, 0.0), _summary(1, 0.5)], 3.0)
    assert "sink heads 0-1 of 1" in both and "0 to 0.5" in both
    # a diverged run has no masses to show
    assert "sink heads" not in kinds.describe([_summary(0, 0.0, "diverged")], 3.0)


def test_quick_zoo_trains_softmax_and_relu_long_enough_to_reach_the_stop_rule():
    opts = zoo.ZooOptions(quick=True)
    assert opts.rules == zoo.QUICK_RULES == ("softmax", "relu")
    assert zoo.cap("1x1", True) > STEPS_1X1
    # BOS capped at 0.01 as well as removed: one layer with BOS removed (or capped at 0.1) is
    # forced to fail by a proof, so without this the denied softmax claim has no seeds
    assert [d.name for d in zoo.denials(True)] == ["removed", "capped 0.01"]
    # rules given with --quick win over its two
    assert zoo.ZooOptions(quick=True, rules=("sigmoid",)).rules == ("sigmoid",)
    assert set(zoo.ZooOptions().rules) > set(zoo.QUICK_RULES)


def test_quick_extensions_and_reproduction_leave_room_for_1x1_to_reach_the_stop_rule():
    assert ext.steps("1x1", True) > STEPS_1X1
    cells = rp.cells(rp.ReproduceOptions(quick=True), Execution())
    one = [c for c in cells if c.config.model.n_layers == 1]
    assert one and all(c.config.train.max_steps > STEPS_1X1 for c in one)


def test_quick_theory_certifies_one_model_per_rule_and_skips_the_search():
    quick = th.TheoryOptions(quick=True)
    assert (quick.seeds, quick.plain_grid_seeds, quick.eps) == (1, 0, th.QUICK_EPS)
    names = [c.name for c in th.cells(quick, Execution())]
    assert not any(n.startswith("plain-grid/") for n in names)
    assert {"frontier/softmax_seed0", "frontier/relu_seed0"} <= set(names)
    # what the user gives wins over the quick settings
    given = th.TheoryOptions(quick=True, eps=(0.2,), plain_grid_seeds=1)
    assert (given.eps, given.plain_grid_seeds) == ((0.2,), 1)
    assert th.TheoryOptions().eps == protocol.DENIED_EPS

"""The Study layer: a study declared here, with no other code, gets its subcommand (options from
its dataclass, --config and overrides), trains and resumes its runs, is locked, writes its
records, claims and report, and appears in ``sinklab report``."""

from __future__ import annotations

import dataclasses
import json
import shutil
import threading
from dataclasses import dataclass, field
from types import SimpleNamespace

import pytest

from helpers import DOCS
from sinklab import claims as cl
from sinklab import studies
from sinklab.cli import main
from sinklab.config import build_run_config, check_count
from sinklab.runs import folders
from sinklab.runs.files import read_json
from sinklab.studies.options import build_options
from sinklab.studies.runner import run_study
from sinklab.studies.study import Cell, Context, Execution, FigureSpec, Study

TEMPLATE = """# Tiny study

Seeds {{ opts.seeds }}, steps {{ opts.steps }}; mean steps {{ records.mean_steps | fixed(1) }}.

{{ claims_table() }}

{{ decision_rules() }}

{{ figure("steps", "steps per seed") }}
"""


@dataclass
class TinyOptions:
    seeds: int = field(default=2, metadata={"help": "seeds", "metavar": "N"})
    steps: int = field(default=5, metadata={"help": "training steps per run"})
    rules: tuple[str, ...] = field(default=("softmax", "relu"), metadata={"help": "rules"})
    fancy: bool = field(default=False, metadata={"help": "a flag"})

    def __post_init__(self) -> None:
        check_count("--seeds", self.seeds)


def _cells(opts: TinyOptions, exe: Execution) -> list[Cell]:
    return [Cell(f"runs/{rule}_seed{s}",
                 build_run_config({"model": {"attention": rule},
                                   "train": {"seed": s, "max_steps": opts.steps,
                                             "device": exe.device},
                                   "eval": {"n_sequences": 16}}),
                 group=(rule,), label=rule)
            for rule in opts.rules for s in range(opts.seeds)]


def _collect(ctx: Context) -> dict:
    runs = [{"name": c.name, **{k: ctx.summary(c.name)[k] for k in ("steps", "converged")}}
            for c in _cells(ctx.opts, ctx.exe)]
    return {"runs": runs, "mean_steps": sum(r["steps"] for r in runs) / len(runs)}


def _claims(records: dict, opts: TinyOptions) -> list[cl.Claim]:
    n = len(records["runs"])

    def stopped(budget: int) -> cl.Claim:
        return cl.rate_at_least("tiny.stopped", "Runs stopped at their budget at a rate above "
                                "0.7", sum(r["steps"] == budget for r in records["runs"]), n,
                                "runs")

    return [cl.with_control(stopped(opts.steps), stopped(opts.steps + 1), "a budget not given"),
            cl.descriptive("tiny.converged", "How many runs reached the stop rule",
                           f"{sum(r['converged'] for r in records['runs'])} of {n} runs", n=n)]


def _draw(ax, records, opts) -> None:
    ax.bar(range(len(records["runs"])), [r["steps"] for r in records["runs"]])


@pytest.fixture
def tiny(tmp_path):
    template = tmp_path / "templates"
    template.mkdir()
    study = Study(name="tiny", title="Tiny study", help="a study declared in a test",
                  description="Trains a few tiny runs.", options=TinyOptions,
                  template="tiny.md.j2", cells=_cells, tables=("runs",),
                  analysis=SimpleNamespace(collect=_collect, claims=_claims, FIGURES=(
                      FigureSpec("steps", _draw, size=(3, 2)),)))
    from sinklab.studies import render

    loader = render.ENV.loader
    import jinja2

    render.ENV.loader = jinja2.ChoiceLoader([jinja2.DictLoader({"tiny.md.j2": TEMPLATE}),
                                             loader])
    studies.all_studies()
    studies.register(study)
    try:
        yield study
    finally:
        studies.unregister("tiny")
        render.ENV.loader = loader


def test_a_declared_study_gets_its_subcommand_and_runs(tiny, tmp_path, capsys):
    out = tmp_path / "tiny"
    config = tmp_path / "tiny.toml"
    config.write_text("[tiny]\nseeds = 3\nsteps = 4\n")
    # defaults < file < overrides < flags
    code = main(["tiny", "--out", str(out), "--config", str(config), "tiny.steps=6",
                 "--rules", "relu", "--workers", "1"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    result = read_json(out / "records.json")
    from sinklab.studies import render

    # what was decided, a few lines, then the report's path
    first = render.headline([cl.Claim.from_dict(c) for c in result["claims"]])
    assert first[0] == "Decided: this study names no primary claim."
    *said, took = captured.out.splitlines()  # its last line: the time it took
    assert said == [*first, f"wrote {out / 'REPORT.md'}"]
    assert took.startswith("took ") and took.endswith(" of CPU time on 1 worker(s)"), took
    assert result["options"] == {"seeds": 3, "steps": 6, "rules": ["relu"], "fancy": False}
    assert [r["name"] for r in result["records"]["runs"]] == [f"runs/relu_seed{s}"
                                                             for s in range(3)]
    assert all(r["steps"] == 6 for r in result["records"]["runs"])
    assert [c["outcome"] for c in result["claims"]] == ["undetermined", "described"]
    report = (out / "REPORT.md").read_text()
    assert report.startswith("# Tiny study\n\nSeeds 3, steps 6; mean steps 6.0.")
    assert "undetermined at n = 3" in report and "](figures/steps.png)" in report
    assert (out / "figures" / "steps.png").stat().st_size > 0
    assert (out / "runs.csv").read_text().splitlines()[0] == "name,steps,converged"
    assert (out / "claims.csv").read_text().startswith("key,")
    marker = folders.read_marker(out)
    assert marker["kind"] == "tiny" and marker["study"]["report"] == "REPORT.md"
    assert marker["invocations"][0]["runs_trained"] == 3

    # a rerun trains nothing and records a second invocation
    code = main(["tiny", "--out", str(out), "--config", str(config), "tiny.steps=6",
                 "--rules", "relu"])
    assert code == 0, capsys.readouterr().err
    history = folders.read_marker(out)["invocations"]
    assert [h["runs_trained"] for h in history] == [3, 0]
    assert history[1]["runs_reused"] == 3

    # resume: one more seed trains one run
    code = main(["tiny", "--out", str(out), "--seeds", "4", "--steps", "6", "--rules", "relu"])
    assert code == 0, capsys.readouterr().err
    assert folders.read_marker(out)["invocations"][-1]["runs_trained"] == 1

    # other settings for a finished run are refused, not overwritten
    code = main(["tiny", "--out", str(out), "--steps", "7", "--rules", "relu"])
    assert code == 2 and "holds a run with different settings" in capsys.readouterr().err

    # sinklab report finds the folder from its marker
    code = main(["report", str(tmp_path)])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert f"tiny      {out}" in captured.out
    gathered = (tmp_path / "report" / "REPORT.md").read_text()
    assert "## Tiny study (`" in gathered and "undetermined at n = 4" in gathered


def test_study_options_are_checked_with_one_sentence(tiny, tmp_path, capsys):
    out = tmp_path / "tiny"
    for argv, words in (
            (["--seeds", "0"], "--seeds=0 is not allowed"),
            (["--seeds", "x"], "--seeds='x' is not allowed: it must be an integer"),
            (["tiny.nope=1"], "tiny.nope is not an option of sinklab tiny"),
            (["model.attention=relu"], "is not an option override"),
            (["--config", str(tmp_path / "missing.toml")], "does not exist")):
        code = main(["tiny", "--out", str(out), *argv])
        err = capsys.readouterr().err
        assert code == 2 and words in err and err.count("\n") == 1, (argv, err)
    assert not out.exists()  # nothing was written
    bad = tmp_path / "bad.toml"
    bad.write_text("[model]\nattention = 'relu'\n")
    code = main(["tiny", "--out", str(out), "--config", str(bad)])
    assert code == 2 and "has the table [model], which is not a study's" in \
        capsys.readouterr().err
    # another study's table is left to that study
    other = tmp_path / "other.toml"
    other.write_text("[reproduce]\nseeds = 10\n[tiny]\nseeds = 1\n")
    assert build_options(tiny, str(other)).seeds == 1


def test_a_study_folder_is_locked_and_kept_apart(tiny, tmp_path, capsys):
    out = tmp_path / "tiny"
    opts = build_options(tiny, flags={"seeds": 1, "steps": 2, "rules": ("relu",)})
    assert opts == TinyOptions(seeds=1, steps=2, rules=("relu",))
    out.mkdir()
    release = threading.Event()
    held = threading.Event()

    def hold() -> None:
        import subprocess
        import sys
        code = (f"import sys, time; from sinklab.runs import folders\n"
                f"with folders.hold(__import__('pathlib').Path({str(out)!r})):\n"
                f"    print('held', flush=True); sys.stdin.readline()\n")
        proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, text=True)
        assert proc.stdout.readline().strip() == "held"
        held.set()
        release.wait(60)
        proc.communicate("\n", timeout=60)

    thread = threading.Thread(target=hold)
    thread.start()
    try:
        assert held.wait(60)
        code = main(["tiny", "--out", str(out), "--seeds", "1"])
        err = capsys.readouterr().err
        assert code == 2 and "is being written by another sinklab process (pid" in err
    finally:
        release.set()
        thread.join(60)
    # a folder that is not sinklab's is never written into
    other = tmp_path / "theirs"
    other.mkdir()
    (other / "notes.txt").write_text("mine")
    with pytest.raises(Exception, match="is not an empty folder or a sinklab tiny folder"):
        run_study(tiny, other, opts)
    assert sorted(p.name for p in other.iterdir()) == ["notes.txt"]


def test_records_json_is_plain_json(tiny, tmp_path):
    out = tmp_path / "tiny"
    opts = build_options(tiny, flags={"seeds": 1, "steps": 2, "rules": ("softmax",)})
    result = run_study(tiny, out, opts, Execution(workers=1), log=lambda line: None)
    json.dumps(result, allow_nan=False)
    assert read_json(out / "records.json") == result


def test_the_documented_example_study_runs(tmp_path, capsys):
    """docs/studies.md's example, executed as written: it registers, gets its subcommand and
    writes its report (the template is the one the page describes)."""
    import re

    import jinja2

    from sinklab.studies import render

    page = (DOCS / "studies.md").read_text()
    code = re.search(r"```python\n(.*?)```", page, re.DOTALL).group(1)
    template = ("# My study\n\n{{ claims_table() }}\n\n{{ decision_rules() }}\n\n"
                "{{ figure('errors') }}\n")
    loader = render.ENV.loader
    render.ENV.loader = jinja2.ChoiceLoader([jinja2.DictLoader({"mystudy.md.j2": template}),
                                             loader])
    studies.all_studies()
    try:
        exec(compile(code, "docs/studies.md", "exec"), {})
        out = tmp_path / "mine"
        assert main(["mystudy", "--out", str(out), "--seeds", "2", "--steps", "3",
                     "--workers", "1"]) == 0, capsys.readouterr().err
        result = read_json(out / "records.json")
        assert [c["key"] for c in result["claims"]] == ["relu.no_sink", "softmax.error"]
        assert result["claims"][0]["primary"] and result["claims"][0]["control"]
        assert (out / "REPORT.md").read_text().startswith("# My study\n")
        assert (out / "figures" / "errors.png").is_file()
    finally:
        studies.unregister("mystudy")
        render.ENV.loader = loader


# --------------------------------------------------------- options named as they were given


def test_a_refused_option_is_named_as_it_was_given(tiny, tmp_path, capsys):
    """A flag by its flag, an override by its key, a file's value by the file and its table;
    for a study whose checks name the flag themselves (the tiny one) and for one that names
    its options through ``named`` (sinklab lm)."""
    config = tmp_path / "x.toml"
    config.write_text("[tiny]\nseeds = 0\n[lm]\nn_tokens = -5\n")
    for argv, words in (
            (["tiny", "--seeds", "0"], "--seeds=0 is not allowed"),
            (["tiny", "tiny.seeds=0"], "tiny.seeds=0 is not allowed"),
            (["tiny", "--config", str(config)],
             f"config file {str(config)!r}: [tiny] seeds=0 is not allowed"),
            (["tiny", "tiny.seeds=x"], "tiny.seeds='x' is not allowed: it must be an integer"),
            (["lm", "--tokens", "10^9"], "--tokens='10^9' is not allowed: it must be an integer"),
            (["lm", "lm.n_tokens=10^9"], "lm.n_tokens='10^9' is not allowed"),
            (["lm", "lm.n_tokens=-5"], "lm.n_tokens=-5 is not allowed: it must be an integer >="),
            (["lm", "--tokens", "-5"], "--tokens=-5 is not allowed"),
            (["lm", "--config", str(config)],
             f"config file {str(config)!r}: [lm] n_tokens=-5 is not allowed"),
            (["lm", "lm.probes=p.txt", "lm.probes_field=body"],  # two options, both named
             "lm.probes_field body names a field of a .jsonl lm.probes file"),
            (["zoo", "zoo.rules=relu,relu"], "zoo.rules lists 'relu' twice"),
            (["theory", "--eps", "0.1,0.1"], "--eps lists 0.1 twice")):
        code = main([*argv, "--out", str(tmp_path / "o")])
        err = capsys.readouterr().err
        assert code == 2 and err.count("\n") == 1, (argv, err)
        assert err.startswith(f"sinklab: error: {words}"), (argv, err)
    assert not (tmp_path / "o").exists()


# ----------------------------------------------------------------------------- --docs FILE


def _ok(capsys, argv: list[str]) -> str:
    """Run a command that must succeed; its stderr."""
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 0, err
    return err


def test_docs_copies_are_known_by_their_mark_never_by_their_title(tiny, tmp_path, capsys):
    out, docs = tmp_path / "tiny", tmp_path / "docs" / "tiny.md"
    args = ["tiny", "--out", str(out), "--seeds", "1", "--steps", "2", "--rules", "relu",
            "--workers", "1"]
    _ok(capsys, [*args, "--docs", str(docs)])
    text = docs.read_text()
    assert text.startswith("# Tiny study\n")
    assert text.endswith("\n<!-- written by sinklab tiny: records in tiny.json -->\n")
    _ok(capsys, [*args, "--docs", str(docs)])  # refreshed

    # a copy written before there was a mark: its records beside it say it is this study's
    docs.write_text(text.replace("<!-- written by sinklab tiny: records in tiny.json -->\n", ""))
    _ok(capsys, [*args, "--docs", str(docs)])
    assert docs.read_text().endswith("records in tiny.json -->\n")

    # a file of someone else's that begins with the same title is theirs
    mine = tmp_path / "notes" / "mine.md"
    mine.parent.mkdir()
    mine.write_text("# Tiny study\n\nmy own notes, not to be overwritten\n")
    code = main([*args, "--docs", str(mine)])
    err = capsys.readouterr().err
    assert code == 2 and "mine.md exists and is not a copy of this report that sinklab wrote" \
        in err and err.count("\n") == 1, err
    assert mine.read_text() == "# Tiny study\n\nmy own notes, not to be overwritten\n"
    assert sorted(p.name for p in mine.parent.iterdir()) == ["mine.md"]


def test_render_writes_a_docs_copy_again_from_its_records_alone(tiny, tmp_path, capsys):
    out, docs = tmp_path / "tiny", tmp_path / "docs" / "tiny.md"
    _ok(capsys, ["tiny", "--out", str(out), "--seeds", "1", "--steps", "2", "--rules", "relu",
                 "--workers", "1", "--docs", str(docs)])
    text = docs.read_text()
    shutil.rmtree(out)  # nothing but the copy and its records is read
    docs.write_text(text.replace("Tiny study", "An edited title", 1))
    assert main(["render", str(docs)]) == 0
    said = capsys.readouterr().out
    assert docs.read_text() == text
    assert said == f"wrote {docs} (tiny): the claims decided again from its records are the ones " \
                   "recorded\n"
    # records whose claims the code no longer decides that way: the report follows the code
    records = json.loads(docs.with_suffix(".json").read_text())
    records["claims"][0]["outcome"] = "contradicted" if \
        records["claims"][0]["outcome"] != "contradicted" else "supported"
    docs.with_suffix(".json").write_text(json.dumps(records))
    assert main(["render", str(docs)]) == 0
    assert "not the ones recorded" in capsys.readouterr().out and docs.read_text() == text
    # a file that is no report copy, or one without its records, is refused in one sentence
    mine = tmp_path / "notes.md"
    mine.write_text("# Tiny study\n\nmy notes\n")
    code = main(["render", str(mine)])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "is not a report sinklab copied" in err, err
    assert mine.read_text() == "# Tiny study\n\nmy notes\n"


def test_docs_inside_a_sinklab_folder_is_refused_before_any_work(tiny, tmp_path, capsys):
    run = tmp_path / "run"
    _ok(capsys, ["train", "train.max_steps=2", "eval.n_sequences=8", "--out", str(run)])
    out = tmp_path / "tiny"
    args = ["tiny", "--out", str(out), "--seeds", "1", "--steps", "2", "--workers", "1"]
    before = sorted(p.name for p in run.iterdir())
    for docs, words in ((run / "notes.md", f"is inside the sinklab folder {run}"),
                        (out / "notes.md", f"is inside the --out folder {out}"),
                        (tmp_path / "tiny.md", f"which is the --out folder {out}")):
        code = main([*args, "--docs", str(docs)])
        err = capsys.readouterr().err
        assert code == 2 and words in err and err.count("\n") == 1, (docs, err)
    assert sorted(p.name for p in run.iterdir()) == before
    assert not out.exists()


# ---------------------------------------------------------- mending a study's folder


def _finished_tiny(tmp_path, capsys) -> tuple[list[str], object]:
    out = tmp_path / "tiny"
    args = ["tiny", "--out", str(out), "--seeds", "2", "--steps", "2", "--rules", "relu",
            "--workers", "1"]
    _ok(capsys, args)
    return args, out


def test_a_corrupted_study_marker_is_rebuilt_and_no_run_trains_again(tiny, tmp_path, capsys):
    args, out = _finished_tiny(tmp_path, capsys)
    finished = {p.name: (p / "model.pt").stat().st_mtime_ns for p in (out / "runs").iterdir()}
    (out / "sinklab.json").write_text('{"kind": "tiny", "form')
    code = main(args)
    err = capsys.readouterr().err
    assert code == 0, err
    assert f"tiny: {out / 'sinklab.json'} was corrupted (not valid JSON); rebuilt it" in err
    assert "0 runs to train" in err and "2 already finished" in err
    marker = folders.read_marker(out)
    assert marker["kind"] == "tiny" and [h["runs_trained"] for h in marker["invocations"]] \
        == [2, 0]  # the history came back from records.json
    assert (out / "sinklab.json.corrupt").read_text() == '{"kind": "tiny", "form'
    assert {p.name: (p / "model.pt").stat().st_mtime_ns for p in (out / "runs").iterdir()} \
        == finished


def test_a_corrupted_study_marker_with_something_foreign_is_not_rebuilt(tiny, tmp_path, capsys):
    args, out = _finished_tiny(tmp_path, capsys)
    (out / "sinklab.json").write_text("{not json")
    (out / "notes.txt").write_text("mine")
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    code = main(args)
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, err
    assert "also holds notes.txt, which sinklab tiny does not write, so it is not rebuilt: " \
           f"move that out of {out} and run this command again" in err
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before
    (out / "notes.txt").unlink()  # what the sentence says leads on: the marker is rebuilt
    assert "0 runs to train" in _ok(capsys, args)


def test_a_run_whose_marker_is_corrupted_trains_again(tiny, tmp_path, capsys):
    args, out = _finished_tiny(tmp_path, capsys)
    (out / "runs" / "relu_seed1" / "sinklab.json").write_text("{not json")
    code = main(args)
    err = capsys.readouterr().err
    assert code == 0, err
    assert "relu_seed1/sinklab.json is corrupted (not valid JSON), so the run's completion " \
           "record is lost; it is trained again" in err
    assert folders.read_marker(out)["invocations"][-1]["runs_trained"] == 1
    assert folders.check_complete(out / "runs" / "relu_seed1")


def test_a_junk_study_store_is_rebuilt_from_the_run_folders(tiny, tmp_path, capsys):
    from sinklab.sweeps.store import Store

    args, out = _finished_tiny(tmp_path, capsys)
    (out / "sweep.db").write_bytes(b"not a database" * 300)
    code = main(["results", str(out)])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, err
    assert "sweep.db is corrupted or not a sinklab database" in err
    assert f"run `{' '.join(['sinklab', *args])}` again" in err  # the command that wrote it
    code = main(args)
    err = capsys.readouterr().err
    assert code == 0, err
    assert "moved it to sweep.db.corrupt and rebuilt it from the completion records of the 2 " \
           "finished run(s)" in err and "0 runs to train" in err
    assert (out / "sweep.db.corrupt").read_bytes() == b"not a database" * 300
    rows = Store.read(out).rows()
    assert [(r["name"], r["status"]) for r in rows] == [("runs/relu_seed0", "done"),
                                                        ("runs/relu_seed1", "done")]
    assert all(r["metrics"]["steps"] == 2 for r in rows)
    assert folders.read_marker(out)["invocations"][-1]["runs_trained"] == 0
    _ok(capsys, ["results", str(out)])


def test_reuse_must_be_a_sinklab_study_folder(tmp_path, capsys):
    mine = tmp_path / "mine"
    (mine / "runs").mkdir(parents=True)
    sweep = tmp_path / "sw"
    sweep.mkdir()
    (sweep / "sinklab.json").write_text('{"kind": "sweep", "format": 1}')
    for source, words in ((mine, f"--reuse {mine} is not a sinklab folder (it has no "
                                 "sinklab.json), so it holds no finished runs to adopt"),
                          (sweep, f"--reuse {sweep} is a sinklab sweep folder, not a study's "
                                  "folder")):
        code = main(["extensions", "--quick", "--reuse", str(source), "--out",
                     str(tmp_path / "o")])
        err = capsys.readouterr().err
        assert code == 2 and words in err and err.count("\n") == 1, err
    assert not (tmp_path / "o").exists()


def test_verdicts_lead_with_primary_claims_and_set_checks_apart():
    from sinklab.studies import render

    def rate(key, k):
        return cl.rate_at_least(key, f"claim {key}", k, 10, "x")

    decided = cl.finalize([cl.with_control(rate("p", 10), rate("p", 0), "control"),
                           cl.with_control(rate("s", 10), rate("s", 10), "control passes"),
                           cl.check("c", "an identity", 0.0, 1e-9, "error"),
                           cl.descriptive("d", "a description", "data")], primary=["p"])
    text = render.verdicts(decided, redecided=True)
    assert text.startswith("**Primary claims** (named in the study's declaration after these "
                           "records were made")
    assert text.index("claim p") < text.index("Of 4 statements, 1 is a check")
    assert "1 is a check" in text and "1 supported but non-discriminating" in text
    assert "Non-discriminating (their control passes the same test): `s`." in text
    assert "- an identity: **verified**" in text
    assert "before it ran" in render.verdicts(decided)


def test_headline_says_what_was_decided_in_a_few_lines():
    from sinklab.studies import render

    def rate(key, k, n=10):
        return cl.rate_at_least(key, f"claim {key}", k, n, "x")

    decided = cl.finalize([cl.with_control(rate("p", 12, 12), rate("p", 0, 12), "control"),
                           cl.with_control(rate("q", 3, 3), rate("q", 0, 3), "control"),
                           cl.with_control(rate("s", 10), rate("s", 10), "control passes"),
                           cl.check("c", "an identity", 0.0, 1e-9, "error"),
                           cl.descriptive("d", "a description", "data")], primary=["p", "q"])
    p, q = decided[0], decided[1]
    lines = render.headline(decided)
    assert lines == [
        "Decided: 2 primary claims (named before the run; corrected together by Holm's "
        "method):",
        f"- `p`: supported, 12 of 12 agree, Holm p = {p.adjusted_p:.3g}, rate at least 0.779 "
        "(one-sided 95%), supported for r0 below 0.735 (Holm), counted (its control came out "
        "the other way)",
        f"- `q`: undetermined at n = 3, 3 of 3 agree, Holm p = {q.adjusted_p:.3g}, rate at least "
        f"0.368 (one-sided 95%), not counted, {q.needed} would support it (power 0.8) at the "
        "observed share",
        "- the other 3 statements: 1 check (1 verified, 0 failed), 1 descriptive, 1 secondary "
        "empirical (0 supported and counted, 1 supported but not counted, 0 contradicted, 0 "
        "undetermined)"]
    assert p.correction == cl.HOLM and p.adjusted_p == pytest.approx(2 * 0.7**12)
    assert "re-analysis" in render.headline(decided, redecided=True)[0]


def test_more_cells_trains_rounds_read_off_finished_runs_and_a_rerun_replays_them(
        tiny, tmp_path, capsys):
    """A study whose second round depends on the first: one more run per finished run, under
    ``more_folders``; a rerun names the same runs and trains none; a round under a folder the
    study does not declare is a programming error, said as such."""

    asked = []

    def more(ctx):
        asked.append(1)
        done = [c for c in _cells(ctx.opts, ctx.exe)
                if folders.check_complete(ctx.out / c.name)]
        return [dataclasses.replace(c, name=c.name.replace("runs/", "again/"))
                for c in done if ctx.summary(c.name)["steps"] == ctx.opts.steps]

    studies.unregister("tiny")
    with_more = SimpleNamespace(**vars(tiny.analysis), more_cells=more)
    studies.register(dataclasses.replace(tiny, analysis=with_more, more_folders=("again",)))
    out = tmp_path / "rounds"
    args = ["tiny", "--out", str(out), "--seeds", "1", "--rules", "relu", "--workers", "1"]
    code = main(args)
    err = capsys.readouterr().err
    assert code == 0, err
    assert "tiny: 1 more runs to train" in err and len(asked) == 2  # a second ask: none new
    assert folders.check_complete(out / "again" / "relu_seed0")
    code = main(args)
    err = capsys.readouterr().err
    assert code == 0 and "more runs to train" not in err
    assert folders.read_marker(out)["invocations"][-1]["runs_reused"] == 2
    studies.unregister("tiny")
    with_more = SimpleNamespace(**vars(tiny.analysis), more_cells=more)
    studies.register(dataclasses.replace(tiny, analysis=with_more, more_folders=()))
    code = main(["tiny", "--out", str(tmp_path / "undeclared"), "--seeds", "1", "--rules",
                 "relu", "--workers", "1"])
    assert code != 0 and "which neither its cells nor its more_folders use" in \
        capsys.readouterr().err


@pytest.mark.parametrize("analysis, says", [
    ("sinklab_tests_no_such_analysis", "its analysis module 'sinklab_tests_no_such_analysis' "
                                       "cannot be imported"),
    (SimpleNamespace(claims=_claims), "defines no collect(ctx)"),
])
def test_an_analysis_that_cannot_be_read_is_one_sentence_before_anything_is_written(
        tiny, tmp_path, capsys, analysis, says):
    studies.unregister("tiny")
    studies.register(dataclasses.replace(tiny, analysis=analysis))
    out = tmp_path / "tiny"
    code = main(["tiny", "--out", str(out), "--seeds", "1", "--workers", "1"])
    err = capsys.readouterr().err
    assert code == 2 and says in err and err.count("\n") == 1, err
    assert "Traceback" not in err and not out.exists()

"""Watch a softmax sink being born: one small language model trained on real text, its sink
measured as it forms (``sinklab birth``).

One run of ``sinklab.pretrain.training.train`` at the protocol of the pretraining study's pilot
base (``BIRTH``: 4 layers of width 128 with 4 heads, windows of 256 bytes, BOS in front of each,
a constant rate of 0.01 after warm-up, bfloat16 autocast; the test keeps the two equal), on the
BBC News text, with every measurement printed as it is logged: the validation loss, the sink
rate (the share of heads and windows whose first-key importance exceeds Gu et al.'s 0.3), the
first-token mass, and the heads that sink (a head's sink rate over the windows at least
``HEAD_RATE``). At the end: when the sink appeared (the first point from which the sink rate
stays at least ``SINK_RATE``), in which layers, and ``birth.png``, the emergence curve. The
default seed is one of the pilot's whose sink formed within the budget; other seeds may form it
later or not at all, which the pilot's table in docs/language.md counts.

A stopped run resumes where it stopped (rerun the same command); a finished one is read back
and drawn again.

    sinklab birth --out runs/birth        # about 10 minutes on two cores
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sinklab.definitions import HEAD_SINK_RATE, MODEL_SINK_RATE
from sinklab.errors import ConfigError
from sinklab.pretrain.curves import held_from, mean_of, sink_heads, sink_layers
from sinklab.pretrain.runconfig import PretrainConfig
from sinklab.runs import folders
from sinklab.runs.files import read_json

SINK_RATE = MODEL_SINK_RATE  # a model sinks at this rate, as in the pretraining study
HEAD_RATE = HEAD_SINK_RATE  # a head sinks at this rate
BIRTH: dict[str, Any] = dict(
    corpus="bbc", attention="softmax", d_model=128, n_layers=4, n_heads=4, context=256,
    batch_size=16, warmup=50, log_every=25, eval_windows=32, probe_windows=0,
    schedule="constant", lr=1e-2, weight_decay=0.1, precision="bfloat16")
TOKENS = 8_000_000  # the pilot's base budget
SEED = 2001  # a pilot seed whose sink formed within that budget (docs/language.md, the pilot)
FIGURE = "birth.png"


def config(tokens: int = TOKENS, seed: int = SEED, device: str = "auto") -> PretrainConfig:
    """The run's settings (``BIRTH``) at ``tokens`` and ``seed``."""
    return PretrainConfig.make(**BIRTH, tokens=tokens, seed=seed, device=device)


def line(point: dict[str, Any]) -> str:
    """One logged point as a line of the watch."""
    heads = sink_heads(point)
    named = ", ".join(f"L{layer}H{head} {point['first_mass'][layer][head]:.2f}"
                      for layer, head in heads) or "none"
    rate, mass = mean_of(point["sink_rate"]), mean_of(point["first_mass"])
    return (f"{point['tokens']:>11,} tokens  loss {point['val_loss']:.3f}  sink rate "
            f"{rate:.3f}  first-token mass {mass:.3f}  sink heads (their first-token mass): "
            f"{named}")


def born(curve: list[dict[str, Any]]) -> int | None:
    """The tokens of the first point from which the sink rate stays at least ``SINK_RATE``."""
    return held_from(curve, [mean_of(p["sink_rate"]) >= SINK_RATE for p in curve])


def verdict(curve: list[dict[str, Any]]) -> str:
    """What the run shows, in a sentence or two."""
    when = born(curve)
    end = curve[-1]
    if when is None:
        best = max(curve, key=lambda p: mean_of(p["sink_rate"]))
        return (f"no sink held to the end within {end['tokens']:,} tokens: the highest sink rate "
                f"was {mean_of(best['sink_rate']):.3f} at {best['tokens']:,} tokens (a sink needs "
                f"{SINK_RATE:g}); train longer with --tokens.")
    where = ", ".join(str(layer) for layer in sink_layers(end)) or "no single head"
    return (f"softmax formed a first-token sink at {when:,} tokens (its sink rate at least "
            f"{SINK_RATE:g} from there to the end); at {end['tokens']:,} tokens its sink heads "
            f"are in layer(s) {where}, the sink rate is {mean_of(end['sink_rate']):.3f}, the "
            f"first token's residual norm is {max(end['resid_ratio']):.1f}x the others' "
            "(largest layer).")


def draw(curve: list[dict[str, Any]], path: Path) -> Path:
    """The emergence curve: the sink rate, the first-token mass and each layer's largest head
    sink rate against training tokens, the validation loss beside them."""
    # matplotlib loads only when a figure is drawn, not for the command's help
    from matplotlib.figure import Figure

    from sinklab.plots import save_figure

    tokens = [p["tokens"] / 1e6 for p in curve]
    fig = Figure(figsize=(10, 3.6))
    left, right = fig.subplots(1, 2)
    left.plot(tokens, [mean_of(p["sink_rate"]) for p in curve], color="C3", lw=2,
              label="sink rate (heads x windows)")
    left.plot(tokens, [mean_of(p["first_mass"]) for p in curve], color="C0", lw=2,
              label="first-token mass")
    for layer in range(len(curve[0]["sink_rate"])):
        left.plot(tokens, [max(p["sink_rate"][layer]) for p in curve], lw=1, ls=":",
                  color=f"C{4 + layer % 6}", label=f"layer {layer}: its most sinking head")
    left.axhline(SINK_RATE, color="grey", lw=0.8, ls="--")
    when = born(curve)
    if when is not None:
        left.axvline(when / 1e6, color="C3", lw=0.8)
    left.set_xlabel("training tokens (millions)")
    left.set_ylim(0, 1.05)  # a head sinking in every window sits at 1, above the frame's top
    left.set_title("the sink being born")
    left.legend(fontsize=7, loc="center right")
    right.plot(tokens, [p["val_loss"] for p in curve], color="k")
    right.set_xlabel("training tokens (millions)")
    right.set_ylabel("validation loss (nats per byte)")
    right.set_title("the language model learning")
    save_figure(fig, path)
    return path


def watch(folder: Path, cfg: PretrainConfig, say: Callable[[str], None] = print
          ) -> dict[str, Any]:
    """Train (or resume, or read back) the run in ``folder``, saying each point as it comes;
    the figure and the verdict at the end. The run's summary, with ``verdict`` and
    ``figure`` added."""
    # torch loads only when a run is watched, not for the command's help
    from sinklab.pretrain import training

    folder = Path(folder)
    if folders.check_complete(folder):
        if read_json(folder / training.CONFIG) != json.loads(json.dumps(cfg.to_dict())):
            raise ConfigError(f"{folder} holds a finished run with other settings than these: "
                              "choose another --out, or give the settings it was run with.")
        say(f"birth: {folder} holds a finished run; its curve:")
        for point in training.read_curve(folder):
            say(line(point))
        summary = read_json(folder / training.SUMMARY)
    else:
        summary = training.train(cfg, folder, log=say, on_point=lambda p: say(line(p)))
    curve = training.read_curve(folder)
    figure = draw(curve, folder / FIGURE)
    return {**summary, "verdict": verdict(curve), "figure": str(figure)}

"""The paper's reference numbers, for side-by-side comparison.

The paper reports heat maps only. These values were read off its figures by colour (precision
about +-0.01): for each head, the mean BOS weight over the non-trigger rows 1..15 except 7
(0-indexed) and the BOS weight and mean per-key weight at the trigger row. Each multi-layer
figure is one example model, so its head order is arbitrary. Step counts are from the authors'
reference code, seed 0 (ranges over 5 seeds where known).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PaperReference:
    """What the paper shows for one (configuration, rule)."""

    bos_mass_nontrigger: list[list[float]]  # [layer][head]
    bos_mass_trigger: list[list[float]]
    trigger_key_mean: list[list[float]]  # mean weight per key 1..j at the trigger row
    steps: int
    steps_range: tuple[int, int] | None = None

    @property
    def sink_heads_per_layer(self) -> list[int]:
        return [sum(v >= 0.9 for v in layer) for layer in self.bos_mass_nontrigger]


PAPER: dict[tuple[str, str], PaperReference] = {
    ("1x1", "softmax"): PaperReference([[1.00]], [[0.00]], [[0.15]], 900, (795, 920)),
    ("1x1", "relu"): PaperReference([[0.00]], [[0.20]], [[0.47]], 700, (662, 740)),
    ("2x2", "softmax"): PaperReference(
        [[0.92, 1.00], [0.93, 1.00]],
        [[0.05, 0.04], [0.11, 0.03]],
        [[0.14, 0.14], [0.13, 0.14]],
        15_000,
    ),
    ("2x2", "relu"): PaperReference(
        [[0.00, 0.00], [0.00, 0.00]],
        [[0.05, 0.07], [0.00, 0.00]],
        [[0.17, 0.19], [0.25, 0.27]],
        12_800,
    ),
    ("4x4", "softmax"): PaperReference(
        [[0.31, 0.98, 0.27, 0.13], [1.00, 0.18, 1.00, 1.00],
         [1.00, 1.00, 0.91, 0.15], [0.19, 1.00, 0.21, 0.14]],
        [[0.01, 0.00, 0.84, 0.12], [0.16, 0.50, 0.15, 0.14],
         [0.08, 0.09, 0.09, 0.78], [0.46, 0.05, 0.13, 0.08]],
        [[0.15, 0.15, 0.03, 0.13], [0.12, 0.07, 0.13, 0.13],
         [0.13, 0.13, 0.13, 0.03], [0.08, 0.14, 0.13, 0.13]],
        21_500,
    ),
    ("4x4", "relu"): PaperReference(
        [[0.00] * 4 for _ in range(4)],
        [[0.03, 0.03, 0.02, 0.02], [0.00, 0.00, 0.01, 0.00],
         [0.00, 0.00, 0.00, 0.00], [0.00, 0.00, 0.00, 0.00]],
        [[0.05, 0.07, 0.06, 0.07], [0.09, 0.11, 0.09, 0.12],
         [0.14, 0.15, 0.11, 0.12], [0.15, 0.15, 0.12, 0.16]],
        6_700,
    ),
}

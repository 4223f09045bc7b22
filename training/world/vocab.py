"""The shapes world's vocabulary: shapes, colours, size classes, relations.

Everything the generator, the captioner and the evaluation agree on lives here, so a
change of vocabulary is one edit.
"""

from __future__ import annotations

SHAPES: tuple[str, ...] = ("circle", "square", "triangle", "diamond", "cross")

# Reference RGB of each colour; the renderer jitters around it.
COLOURS: dict[str, tuple[int, int, int]] = {
    "red": (220, 35, 35),
    "orange": (245, 140, 20),
    "yellow": (240, 215, 30),
    "green": (40, 165, 55),
    "cyan": (30, 205, 225),
    "blue": (35, 65, 225),
    "purple": (145, 50, 195),
}
COLOUR_NAMES: tuple[str, ...] = tuple(COLOURS)

# Object radius as a fraction of the image side, per size class. The gaps between classes
# keep "small" vs "large" unambiguous; the spread inside a class gives the hard pair-ranking
# case (two shapes of the same size class).
SIZE_RANGES: dict[str, tuple[float, float]] = {
    "small": (0.075, 0.11),
    "medium": (0.125, 0.16),
    "large": (0.18, 0.235),
}
SIZES: tuple[str, ...] = tuple(SIZE_RANGES)

RELATIONS: tuple[str, ...] = ("left of", "right of", "above", "below")
RELATION_PHRASES: dict[str, str] = {
    "left of": "to the left of",
    "right of": "to the right of",
    "above": "above",
    "below": "below",
}
INVERSE_RELATION: dict[str, str] = {
    "left of": "right of",
    "right of": "left of",
    "above": "below",
    "below": "above",
}

# Colour-shape combinations never rendered in training: one per shape, five distinct
# colours, so every colour and every shape is still seen in training with other partners.
HELD_OUT_COMBOS: frozenset[tuple[str, str]] = frozenset(
    {
        ("red", "triangle"),
        ("yellow", "cross"),
        ("green", "circle"),
        ("blue", "square"),
        ("purple", "diamond"),
    }
)

NEGATION_WORDS: tuple[str, ...] = ("no", "not", "without", "but not")

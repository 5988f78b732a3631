"""The embedded default corpus: structured text generated from a fixed seed, shipped as package data.

Why generated: a run on the default corpus must reproduce on any machine with no download, and the
text must be ours to ship. Public-domain literature is not available offline, so the corpus is
synthetic: arithmetic facts (``17 + 25 = 42.``), times tables, counting runs and sentences of a
small procedural grammar (``the small fox sees a red bird near the river.``). It has structure at
every scale a byte-level model can learn in a few minutes on a CPU: the format of a line, word
spelling, grammar, and (slowly) the arithmetic itself.

The generator uses its own PRNG (SplitMix64, Steele et al. 2014), not :mod:`random`, so the bytes
depend on nothing but this file. ``python -m meshwise.train.embedded_corpus`` rewrites
``embedded/corpus.txt``; a test checks that the shipped file equals :func:`generate`'s output.
"""

from __future__ import annotations

import sys
from importlib import resources
from pathlib import Path

SEED = 20240601
TARGET_BYTES = 256 * 1024
RESOURCE = "embedded/corpus.txt"
MASK64 = (1 << 64) - 1


class SplitMix64:
    """x += 0x9E3779B97F4A7C15; z = x; z = (z ^ z>>30) * 0xBF58476D1CE4E5B9; z = (z ^ z>>27) * 0x94D049BB133111EB; z ^ z>>31."""

    def __init__(self, seed: int) -> None:
        self.state = seed & MASK64

    def next(self) -> int:
        self.state = (self.state + 0x9E3779B97F4A7C15) & MASK64
        z = self.state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
        return z ^ (z >> 31)

    def below(self, n: int) -> int:
        """An integer in [0, n) (modulo bias below 2^-50 for the small n used here)."""
        return self.next() % n

    def pick(self, options: tuple[str, ...]) -> str:
        return options[self.below(len(options))]


DETERMINERS = ("the", "a", "every", "one", "that")
ADJECTIVES = ("small", "red", "quick", "old", "quiet", "bright", "green", "tired", "brave", "round")
NOUNS = ("fox", "bird", "cat", "river", "child", "farmer", "stone", "tree", "boat", "lamp", "horse", "cloud")
VERBS = ("sees", "follows", "finds", "carries", "watches", "meets", "paints", "counts", "hears", "builds")
PREPOSITIONS = ("near", "under", "behind", "beside", "over", "past")
PLACES = ("the river", "the hill", "the old bridge", "the market", "the forest", "the sea", "the gate")


def _noun_phrase(rng: SplitMix64) -> str:
    words = [rng.pick(DETERMINERS)]
    if rng.below(2):
        words.append(rng.pick(ADJECTIVES))
    words.append(rng.pick(NOUNS))
    return " ".join(words)


def sentence(rng: SplitMix64) -> str:
    """determiner [adjective] noun verb determiner [adjective] noun [preposition place] ."""
    text = f"{_noun_phrase(rng)} {rng.pick(VERBS)} {_noun_phrase(rng)}"
    if rng.below(3) == 0:
        text += f" {rng.pick(PREPOSITIONS)} {rng.pick(PLACES)}"
    return text + "."


def arithmetic(rng: SplitMix64) -> str:
    kind = rng.below(4)
    a, b = rng.below(100), rng.below(100)
    if kind == 0:
        return f"{a} + {b} = {a + b}."
    if kind == 1:
        a, b = max(a, b), min(a, b)
        return f"{a} - {b} = {a - b}."
    if kind == 2:
        a, b = 1 + rng.below(12), 1 + rng.below(12)
        return f"{a} * {b} = {a * b}."
    start = rng.below(90)
    return "count: " + " ".join(str(n) for n in range(start, start + 3 + rng.below(6))) + "."


def generate(target_bytes: int = TARGET_BYTES, seed: int = SEED) -> str:
    """Paragraphs of 4-9 lines, each line a sentence or an arithmetic fact, until ``target_bytes``."""
    rng = SplitMix64(seed)
    parts: list[str] = []
    size = 0
    while size < target_bytes:
        lines = [sentence(rng) if rng.below(2) else arithmetic(rng) for _ in range(4 + rng.below(6))]
        paragraph = "\n".join(lines) + "\n\n"
        parts.append(paragraph)
        size += len(paragraph)
    return "".join(parts)


def read() -> bytes:
    """The shipped corpus (package data)."""
    return resources.files("meshwise.train").joinpath(RESOURCE).read_bytes()


def main() -> int:
    path = Path(__file__).with_name("embedded") / "corpus.txt"
    path.parent.mkdir(exist_ok=True)
    path.write_text(generate())
    print(f"wrote {path} ({path.stat().st_size:,} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

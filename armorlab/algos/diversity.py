"""Diversity of the correct answers a policy samples for one prompt: mode collapse, measured.

A task with several correct derivations per prompt (armorlab.tasks.scratchpad) lets a policy keep
many of them or collapse onto one. Among the correct samples of one prompt (compared as whole
completions), the number of distinct ones and the entropy of their empirical distribution say
which: a policy that writes one derivation has 1 and 0 nats, however accurate it is. Pure Python,
no I/O.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Hashable, Iterable, Sequence


def distinct(samples: Iterable[Hashable]) -> int:
    """How many different samples there are."""
    return len(set(samples))


def empirical_entropy(samples: Iterable[Hashable]) -> float:
    """Shannon entropy (nats) of the samples' empirical distribution: H = −Σ_s (c_s/n)·log(c_s/n),
    c_s the count of sample s among n; 0 for one repeated sample (or none), log n for n different."""
    counts = Counter(samples)
    n = sum(counts.values())
    return -sum(c / n * math.log(c / n) for c in counts.values()) if n else 0.0


def correct_diversity(groups: Iterable[Sequence[tuple[Hashable, bool]]]) -> tuple[float, float, float]:
    """Over prompt groups of (sample, correct) pairs: (Σ distinct correct samples, Σ their entropy,
    groups with at least one correct sample). Divide the sums by the count for the means over the
    groups that have a correct sample (a group without one says nothing about which derivation a
    policy prefers); the counts add over processes before dividing."""
    total_distinct = total_entropy = groups_with = 0.0
    for group in groups:
        correct = [s for s, ok in group if ok]
        if correct:
            total_distinct += distinct(correct)
            total_entropy += empirical_entropy(correct)
            groups_with += 1
    return total_distinct, total_entropy, groups_with

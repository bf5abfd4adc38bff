"""Held-out sets that are held out: problem-text normalisation and training de-duplication (the named
``eval_sets``, built as the task's own prompts and checked for overlap with training, are
mathfile.build_eval_sets').

Normalisation (``problem_key``): Unicode NFKC, case folded, LaTeX spacing commands (``\\,``
``\\;`` ``\\:`` ``\\!`` ``\\␣`` ``~`` ``\\quad`` ``\\qquad``) and ``\\left``/``\\right`` removed,
then every whitespace character removed. Two problems are the same when their keys are equal; a
conversation's key is that of its messages' contents joined. Training keeps the first row of each
key (mathfile.build, before the split, so the val/test slices share no problem with training).
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

_LATEX_SPACING = re.compile(r"\\(?:qquad|quad|left|right)(?![A-Za-z])|\\[,;:! ]|~")
_WHITESPACE = re.compile(r"\s+")


def problem_key(problem: str | Sequence[Mapping[str, str]]) -> str:
    """The normalised text two copies of one problem share (module docstring)."""
    if not isinstance(problem, str):
        problem = "\n".join(m["content"] for m in problem)
    text = unicodedata.normalize("NFKC", problem).casefold()
    return _WHITESPACE.sub("", _LATEX_SPACING.sub(" ", text))


def first_of_each(problems: Iterable[Any]) -> tuple[list[int], int]:
    """(indices of the first row of each normalised problem, how many rows repeated one before)."""
    seen: set[str] = set()
    keys: dict[str, str] = {}  # repeats are mostly verbatim (DAPO-Math-17k): normalise each text once
    kept: list[int] = []
    dropped = 0
    for i, problem in enumerate(problems):
        if isinstance(problem, str):
            key = keys.get(problem) or keys.setdefault(problem, problem_key(problem))
        else:
            key = problem_key(problem)
        if key in seen:
            dropped += 1
            continue
        seen.add(key)
        kept.append(i)
    return kept, dropped

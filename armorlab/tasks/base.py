"""The Task record every task builder returns (contract C2)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # datasets is heavy; only builders import it
    from datasets import Dataset

RewardFunc = Callable[..., list[float]]


@dataclass
class Task:
    """A verifiable task: held-out splits, TRL reward functions and the completion format.

    ``train``/``val``/``test`` are ``datasets.Dataset`` with the columns ``prompt`` (plain text)
    and ``answer`` (str). TRL passes dataset columns to reward functions as keyword arguments,
    which is why the column is called ``answer``.
    """

    name: str
    train: Dataset
    val: Dataset
    test: Dataset
    reward_funcs: list[RewardFunc]
    # Prompts a supervised warm start may learn from: never overlaps val/test. For arithmetic it
    # is the whole non-held-out pool (independent of train_size, so every train_size shares one
    # base model); for math it is the train split. An optional ``target`` column gives the
    # completion to learn per row (scratchpad: a mix of derivation styles), else
    # ``target_completion(answer)``.
    warm_start: Dataset
    # answer -> the completion text (eos excluded) a correct policy would write.
    target_completion: Callable[[str], str]
    # The most characters a correct completion can have, when the task bounds it (arithmetic: every
    # correct completion has exactly this many; scratchpad: its longest derivation), else None.
    completion_chars: int | None = None
    settings: dict[str, Any] = field(default_factory=dict)

    def score(self, completions: Sequence[Any], answers: Sequence[Any]) -> list[float]:
        """Same scoring as the reward functions (summed over them), without TRL's kwargs."""
        prompts = [None] * len(completions)
        totals = [0.0] * len(completions)
        for func in self.reward_funcs:
            for i, value in enumerate(func(prompts=prompts, completions=list(completions),
                                           answer=list(answers))):
                totals[i] += value
        return totals

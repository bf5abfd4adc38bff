"""Synthetic arithmetic with exact-match reward: fixed-width prompts and answers.

Prompt: ``operands`` numbers zero-padded to ``digits`` width, joined by operators drawn from
``operators``, then ``=``: ``07+42=`` (digits 2), ``003*120-045=`` (digits 3, 3 operands).
Evaluation follows the usual precedence (``*`` before ``+``/``-``, left to right).

Answer: the exact result, zero-padded to the width of the largest result the settings allow
(``ANSWER_BOUND``), with a leading ``+``/``-`` sign whenever ``-`` is among the operators
(``07+42=`` → ``049``; ``07-42=`` → ``-035``; ``07-02=`` → ``+005``). So every prompt has the
same number of characters and every correct completion too, for a whole task: with a char
tokenizer no batch needs padding and the completion length is fixed.

Splits: every problem is an index into the space of all ``(10^digits)^operands ·
|operators|^(operands-1)`` problems. A permutation of that space seeded by ``split_seed`` gives
val (first ``val_size``), test (next ``test_size``) and then the train pool, so the splits never
overlap and val/test stay identical whatever ``train_size`` is. ``train_size`` = the first
prompts of the pool (the fixed small set of the over-optimisation setting); null = the whole
pool (capped at ``POOL_CAP``), i.e. fresh prompts at every step. The tiny model's supervised
warm start reads the pool from ``warm_start_offset`` on, which depends on neither train_size
nor (up to ``WARM_START_RESERVE``) val/test sizes, so all those runs share one base model.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from armorlab.errors import ArmorLabError
from armorlab.tasks.base import Task
from armorlab.tasks.rewards import exact_match_reward

POOL_CAP = 100_000
# The tiny model's warm start reads the pool from this position of the seeded order on (or
# from val+test when more is held out), so val_size/test_size changes up to it keep one base model.
WARM_START_RESERVE = 1024
# Below this space size the split is a full permutation; above, order-preserving rejection
# sampling (the space can be 10^24 problems). The method depends on the space only, never on
# the requested sizes, so growing train_size never changes val/test.
_PERMUTE_MAX = 1 << 22


def space_size(digits: int, operands: int, operators: str) -> int:
    return (10 ** digits) ** operands * len(operators) ** (operands - 1)


def decode(index: int, digits: int, operands: int, operators: str) -> tuple[list[int], list[str]]:
    """Problem index → (operand values, operators) by mixed-radix digits."""
    base = 10 ** digits
    values = []
    for _ in range(operands):
        index, v = divmod(index, base)
        values.append(v)
    ops = []
    for _ in range(operands - 1):
        index, o = divmod(index, len(operators))
        ops.append(operators[o])
    return values, ops


def evaluate(values: Sequence[int], ops: Sequence[str]) -> int:
    """Exact value with ``*`` binding tighter than ``+``/``-`` (no eval of strings)."""
    total, term = 0, values[0]
    sign = 1
    for op, v in zip(ops, values[1:], strict=True):
        if op == "*":
            term *= v
        else:
            total += sign * term
            sign, term = (1 if op == "+" else -1), v
    return total + sign * term


def answer_bound(digits: int, operands: int, operators: str) -> int:
    """Largest |result| the settings allow: all products when ``*`` is allowed, else all sums.

    With M = 10^digits − 1 ≥ 9, a product of k operands beats any sum of products over the same
    k operands (M^a + M^b ≤ M^(a+b) for M ≥ 2), so M^n bounds every mix; without ``*`` the
    magnitude is at most n·M (``-`` alone reaches −(n−1)·M).
    """
    m = 10 ** digits - 1
    return m ** operands if "*" in operators else operands * m


def format_answer(value: int, digits: int, operands: int, operators: str) -> str:
    width = len(str(answer_bound(digits, operands, operators)))
    body = str(abs(value)).zfill(width)
    if "-" in operators:
        return ("-" if value < 0 else "+") + body
    return body


def problem(index: int, digits: int, operands: int, operators: str) -> tuple[str, str]:
    values, ops = decode(index, digits, operands, operators)
    prompt = "".join(str(v).zfill(digits) + op for v, op in zip(values, [*ops, "="], strict=True))
    return prompt, format_answer(evaluate(values, ops), digits, operands, operators)


def split_indices(space: int, count: int, seed: int) -> list[int]:
    """The first ``count`` problem indices of the seeded order over ``range(space)``."""
    if space <= _PERMUTE_MAX:
        return np.random.default_rng(seed).permutation(space)[:count].tolist()
    # Python ints: the space can exceed int64. count ≤ held-out + POOL_CAP ≪ space, so rejecting
    # repeats costs almost nothing.
    rng = random.Random(seed)
    seen: dict[int, None] = {}
    while len(seen) < count:
        seen.setdefault(rng.randrange(space), None)
    return list(seen)


def warm_start_offset(cfg: Mapping[str, Any]) -> int:
    """Position in the seeded order where the warm-start pool begins (≥ val_size + test_size)."""
    space = space_size(cfg["digits"], cfg["operands"], cfg["operators"])
    return max(cfg["val_size"] + cfg["test_size"], min(WARM_START_RESERVE, space // 4))


def build(cfg: Mapping[str, Any]) -> Task:
    """Arithmetic task from the resolved ``task`` section (config.TASK_FIELDS["arithmetic"])."""
    from datasets import Dataset

    digits, operands, operators = cfg["digits"], cfg["operands"], cfg["operators"]
    space = space_size(digits, operands, operators)
    held = cfg["val_size"] + cfg["test_size"]
    if held >= space:
        raise ArmorLabError(f"val_size + test_size = {held} leaves no training problems: only {space} "
                            f"exist with these settings", key="task.val_size", value=cfg["val_size"])
    pool = min(space - held, POOL_CAP)
    if cfg["train_size"] is not None and cfg["train_size"] > pool:
        raise ArmorLabError(f"only {pool} training problems available (space {space} minus "
                            f"{held} held out)", key="task.train_size", value=cfg["train_size"])
    order = split_indices(space, held + pool, cfg["split_seed"])

    def rows(idx: Sequence[int]) -> Dataset:
        pairs = [problem(i, digits, operands, operators) for i in idx]
        return Dataset.from_dict({"prompt": [p for p, _ in pairs], "answer": [a for _, a in pairs]})

    val_end = cfg["val_size"]
    test_end = val_end + cfg["test_size"]
    pool_rows = rows(order[test_end:])
    train = pool_rows if cfg["train_size"] is None else pool_rows.select(range(cfg["train_size"]))
    warm = pool_rows.select(range(warm_start_offset(cfg) - test_end, len(pool_rows)))
    width = len(format_answer(0, digits, operands, operators))
    return Task(name="arithmetic", train=train, val=rows(order[:val_end]), test=rows(order[val_end:test_end]),
                reward_funcs=[exact_match_reward], warm_start=warm, target_completion=str,
                completion_chars=width, settings=dict(cfg))

"""Multi-term addition/subtraction with a scratchpad: several correct derivations per prompt, each
checkable step by step.

Prompt: the arithmetic task's (``07+42+05=``, operands zero-padded to ``digits``; the same problem
space and splits, so val/test never overlap train and ``train_size`` changes train only).

Completion: a running sum over the terms in an order of the policy's choosing, each step written
out: a first term, then ``+y=z`` or ``-y=z`` per remaining term, ``z`` the new partial result:
``07+42+05=`` → ``7+42=49+5=54``, or ``5+42=47+7=54``, or ``42+5=47+7=54`` — the order of the
partial results is free (n terms: up to n! derivations). Terms are signed: in ``12-34+56=`` the
terms are 12, −34 and 56, so ``56-34=22+12=34`` and ``12-34=-22+56=34`` and ``-34+56=22+12=34``
are all right (a negative number is written with its ``-``).

Reward (``derivation_reward``): 1.0 only when the first number and every step's signed operand
are terms of the prompt not used yet, every partial result is exact, every term is used (n − 1
steps) and the last result is the answer; else 0.0. Leading zeros are read as numbers (``07`` is 7).

Answer column: the problem and its value, ``7+42+5=54`` (the verifier needs the terms, and TRL
hands reward functions the dataset's ``answer`` column). ``target_completion`` writes the
left-to-right derivation; the tiny model's warm start learns from a seeded mix of STYLES (column
``target`` of ``warm_start``), so the base model already writes several correct derivations of
one prompt and RL can collapse them onto one (``train/correct_distinct``, docs/metrics.md).
"""

from __future__ import annotations

import random
import re
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from armorlab.errors import ArmorLabError
from armorlab.tasks import arithmetic
from armorlab.tasks.base import Task
from armorlab.tasks.rewards import _pairs, completion_text

_CHAIN_RE = re.compile(r"(-?\d{1,12})((?:[+-]\d{1,12}=-?\d{1,13})+)")
_STEP_RE = re.compile(r"([+-])(\d{1,12})=(-?\d{1,13})")
# Warm-start mix: each pool row gets one style, drawn with this seed offset from split_seed.
STYLE_SEED = 7


# --------------------------------------------------------------------------- problems
def terms_of(values: Sequence[int], ops: Sequence[str]) -> list[int]:
    """The signed terms of ``v0 op1 v1 op2 v2 ...`` (``+``/``-`` only): [v0, ±v1, ±v2, ...]."""
    return [values[0], *(v if op == "+" else -v for op, v in zip(ops, values[1:], strict=True))]


def format_answer(terms: Sequence[int]) -> str:
    """The answer column: ``7+42-5=44``, the problem without padding and its value."""
    text = str(terms[0]) + "".join(("+" if t >= 0 else "-") + str(abs(t)) for t in terms[1:])
    return f"{text}={sum(terms)}"


def parse_answer(answer: str) -> tuple[list[int], int] | None:
    """``7+42-5=44`` → ([7, 42, −5], 44); None when it is not of that form."""
    if not isinstance(answer, str) or "=" not in answer:
        return None
    left, _, right = answer.strip().partition("=")
    parts = re.fullmatch(r"-?\d+(?:[+-]\d+)*", left)
    if parts is None or re.fullmatch(r"-?\d+", right) is None:
        return None
    terms = [int(t) for t in re.findall(r"[+-]?\d+", left)]
    return terms, int(right)


# --------------------------------------------------------------------------- derivations
def running_sum(order: Sequence[int]) -> str:
    """The derivation that adds the terms in ``order`` one by one: ``7+42=49+5=54``."""
    text, acc = str(order[0]), order[0]
    for t in order[1:]:
        acc += t
        text += f"{'+' if t >= 0 else '-'}{abs(t)}={acc}"
    return text


# The warm start's styles: each a running sum over the terms in its own order.
STYLES: dict[str, Callable[[list[int]], list[int]]] = {
    "left to right": lambda terms: list(terms),
    "right to left": lambda terms: list(reversed(terms)),
    "largest first": lambda terms: sorted(terms, reverse=True),
}


def derivation(terms: Sequence[int], style: str = "left to right") -> str:
    return running_sum(STYLES[style](list(terms)))


def check_derivation(text: str, terms: Sequence[int], value: int) -> bool:
    """Whether ``text`` derives ``value`` from ``terms`` by valid steps (see the module docstring)."""
    chain = _CHAIN_RE.fullmatch(text)
    if chain is None:
        return False
    available = Counter(terms)
    acc = int(chain.group(1))
    available[acc] -= 1
    if available[acc] < 0:
        return False
    steps = 0
    for op, digits, result in _STEP_RE.findall(chain.group(2)):
        y = int(digits) if op == "+" else -int(digits)
        available[y] -= 1
        if available[y] < 0 or int(result) != acc + y:
            return False
        acc, steps = acc + y, steps + 1
    return steps == len(terms) - 1 and acc == value


def derivation_reward(prompts: Sequence[Any] | None = None, completions: Sequence[Any] | None = None,
                      answer: Sequence[Any] | None = None, **kwargs: Any) -> list[float]:
    """1.0 where the completion is a valid derivation of the answer's value from its terms."""
    out = []
    for completion, gold in _pairs(completions if completions is not None else [], answer):
        text = completion_text(completion)
        problem = parse_answer(gold) if isinstance(gold, str) else None
        ok = text is not None and problem is not None and check_derivation(text, *problem)
        out.append(1.0 if ok else 0.0)
    return out


def longest_derivation(digits: int, operands: int, operators: str) -> int:
    """Characters of the longest correct derivation the settings allow (a generation bound): a first
    term, then per step an operator, a term, ``=`` and a partial result, every number at most
    operands·(10^digits − 1) in magnitude and signed when ``-`` is allowed."""
    term = digits + (1 if "-" in operators else 0)
    partial = len(str(operands * (10 ** digits - 1))) + (1 if "-" in operators else 0)
    return term + (operands - 1) * (1 + digits + 1 + partial)


def gold_derivation(answer: str) -> str:
    """The left-to-right derivation of an answer (``target_completion``)."""
    problem = parse_answer(answer)
    if problem is None:
        raise ArmorLabError("not a scratchpad answer (terms=value, e.g. 7+42+5=54)", key="answer", value=answer)
    return derivation(problem[0])


# --------------------------------------------------------------------------- build
def build(cfg: Mapping[str, Any]) -> Task:
    """Scratchpad task from the resolved ``task`` section (config.TASK_FIELDS["scratchpad"])."""
    from datasets import Dataset

    digits, operands, operators = cfg["digits"], cfg["operands"], cfg["operators"]
    space = arithmetic.space_size(digits, operands, operators)
    held = cfg["val_size"] + cfg["test_size"]
    if held >= space:
        raise ArmorLabError(f"val_size + test_size = {held} leaves no training problems: only {space} "
                            f"exist with these settings", key="task.val_size", value=cfg["val_size"])
    pool = min(space - held, arithmetic.POOL_CAP)
    if cfg["train_size"] is not None and cfg["train_size"] > pool:
        raise ArmorLabError(f"only {pool} training problems available (space {space} minus "
                            f"{held} held out)", key="task.train_size", value=cfg["train_size"])
    order = arithmetic.split_indices(space, held + pool, cfg["split_seed"])

    def problem(i: int) -> tuple[str, list[int]]:
        values, ops = arithmetic.decode(i, digits, operands, operators)
        prompt = "".join(str(v).zfill(digits) + op for v, op in zip(values, [*ops, "="], strict=True))
        return prompt, terms_of(values, ops)

    def rows(idx: Sequence[int], styled: bool = False) -> Dataset:
        problems = [problem(i) for i in idx]
        data: dict[str, list[str]] = {"prompt": [p for p, _ in problems],
                                      "answer": [format_answer(t) for _, t in problems]}
        if styled:
            rng = random.Random(cfg["split_seed"] * 1_000_003 + STYLE_SEED)
            names = list(STYLES)
            data["target"] = [derivation(t, rng.choice(names)) for _, t in problems]
        return Dataset.from_dict(data)

    val_end, test_end = cfg["val_size"], cfg["val_size"] + cfg["test_size"]
    train_idx = order[test_end:]
    if cfg["train_size"] is not None:
        train_idx = train_idx[:cfg["train_size"]]
    warm_idx = order[arithmetic.warm_start_offset(cfg):]
    return Task(name="scratchpad", train=rows(train_idx), val=rows(order[:val_end]),
                test=rows(order[val_end:test_end]), reward_funcs=[derivation_reward],
                warm_start=rows(warm_idx, styled=True),
                target_completion=gold_derivation,
                completion_chars=longest_derivation(digits, operands, operators), settings=dict(cfg))

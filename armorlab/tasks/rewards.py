"""Verifiable reward functions with TRL's ``reward_funcs`` signature.

``f(prompts, completions, answer, **kwargs) -> list[float]``: one float per completion, 1.0 when
the completion is right and 0.0 otherwise. They never raise: a malformed completion (None,
non-text, garbage) or a missing answer scores 0.0, because one bad sample must not kill a
training run. They are module-level functions so they pickle (TRL and multiprocessing need that)
and TRL logs them under their ``__name__``.
"""

from __future__ import annotations

import logging
import math
import re
import threading
from collections.abc import Sequence
from functools import lru_cache
from typing import Any

log = logging.getLogger(__name__)

# End-of-sequence markers of common tokenizers. TRL decodes with skip_special_tokens=True so
# these are normally gone; a caller decoding without that still gets the text before them.
EOS_MARKERS = ("</s>", "<|endoftext|>", "<|im_end|>", "<|eot_id|>", "<eos>", "<|end|>")
# math-verify's extraction is regex + sympy; a huge completion could stall it, and off the main
# thread there is no timeout. The boxed final answer sits at the end, so only the tail is parsed.
MATH_TAIL_CHARS = 4000
MATH_TIMEOUT_S = 5


def completion_text(completion: Any) -> str | None:
    """The text of one completion up to its first eos marker, whitespace-trimmed; None if not text.

    Accepts a plain string or TRL's conversational form (a list of message dicts, the last
    message's ``content`` is the completion).
    """
    if isinstance(completion, dict):
        completion = completion.get("content")
    elif isinstance(completion, (list, tuple)) and completion:
        last = completion[-1]
        completion = last.get("content") if isinstance(last, dict) else None
    if not isinstance(completion, str):
        return None
    cut = len(completion)
    for marker in EOS_MARKERS:
        at = completion.find(marker)
        if at != -1:
            cut = min(cut, at)
    return completion[:cut].strip()


def _pairs(completions: Any, answer: Any) -> list[tuple[Any, Any]]:
    """(completion, answer) per completion; a missing answer list or entry pairs with None."""
    try:
        items = list(completions)
    except TypeError:
        return []
    try:
        answers = list(answer) if answer is not None and not isinstance(answer, str) else []
    except TypeError:
        answers = []
    return [(c, answers[i] if i < len(answers) else None) for i, c in enumerate(items)]


# --------------------------------------------------------------------------- exact match
def exact_match_reward(prompts: Sequence[Any] | None = None, completions: Sequence[Any] | None = None,
                       answer: Sequence[Any] | None = None, **kwargs: Any) -> list[float]:
    """1.0 where the trimmed completion equals the answer string exactly, else 0.0."""
    out = []
    for completion, gold in _pairs(completions if completions is not None else [], answer):
        text = completion_text(completion)
        ok = text is not None and isinstance(gold, str) and text == gold.strip()
        out.append(1.0 if ok else 0.0)
    return out


# --------------------------------------------------------------------------- math-verify
_BOXED = re.compile(r"\\boxed\{([^{}]*)\}")


def non_finite_answer(text: Any) -> bool:
    """Whether an answer (boxed or not) is a number no float holds: NaN, an infinity spelled as a
    float (``inf``, ``-Infinity``) or a literal past float range (``1e400``). math-verify reads
    ``nan`` as the product n·a·n and ``1e400`` as 1·e·400, so two of them "match"; none is an
    answer. LaTeX's ``\\infty`` (limits, intervals) is not such a spelling and stays an answer."""
    if not isinstance(text, str):
        return False
    inner = text.strip().strip("$").strip()
    if inner.startswith("\\boxed{") and inner.endswith("}"):
        inner = inner[len("\\boxed{"):-1].strip()
    try:
        value = float(inner.replace(",", ""))
    except (ValueError, OverflowError):
        return False
    return not math.isfinite(value)


def _timeout_s() -> int | None:
    # math-verify times out with signal.alarm, which raises outside the main thread (TRL's
    # async rewards, data-loader threads, executors). There it runs without a timeout; the
    # tail cut above bounds the work instead.
    return MATH_TIMEOUT_S if threading.current_thread() is threading.main_thread() else None


@lru_cache(maxsize=1)
def _prediction_config() -> list[Any]:
    """Boxed-answer extraction as RLVR math recipes use it (open-r1's accuracy reward)."""
    from latex2sympy2_extended import NormalizationConfig
    from math_verify import LatexExtractionConfig

    return [LatexExtractionConfig(
        normalization_config=NormalizationConfig(nits=False, malformed_operators=False, basic_latex=True,
                                                 boxed="all", units=True),
        boxed_match_priority=0, try_extract_without_anchor=False)]


@lru_cache(maxsize=8192)
def _parse_gold(answer: str) -> tuple[Any, ...]:
    from math_verify import parse

    text = answer if "\\boxed" in answer else f"\\boxed{{{answer}}}"
    return tuple(parse(text, parsing_timeout=_timeout_s()))


def parse_gold(answer: str) -> list[Any]:
    """math-verify's parse of a reference answer (plain ``0.5``, LaTeX ``\\frac{1}{2}`` or boxed)."""
    try:
        return list(_parse_gold(answer.strip()))
    except Exception:  # math-verify raises on threads or odd input; an unparsable gold scores 0
        log.debug("cannot parse gold answer %r", answer, exc_info=True)
        return []


def math_verify_score(completion: Any, answer: Any) -> float:
    """1.0 if the completion's boxed answer is mathematically equal to ``answer``, else 0.0.

    Several boxed answers count as one set (math-verify's ``boxed="all"``), so hedging with
    two candidates does not match a single reference answer.
    """
    text = completion_text(completion)
    if not text or not isinstance(answer, str) or not answer.strip() or non_finite_answer(answer):
        return 0.0
    try:
        from math_verify import parse, verify

        gold = parse_gold(answer)
        if not gold:
            return 0.0
        timeout = _timeout_s()
        pred = parse(text[-MATH_TAIL_CHARS:], extraction_config=_prediction_config(),
                     parsing_timeout=timeout)
        if not pred or any(non_finite_answer(b) for b in _BOXED.findall(text[-MATH_TAIL_CHARS:])):
            return 0.0  # math-verify turns `inf` into ∞: the spelling is checked as written
        return 1.0 if verify(gold, pred, timeout_seconds=timeout) else 0.0
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException:  # math-verify's TimeoutException is a BaseException; never fail a run
        log.debug("math-verify failed on %r", text[:200], exc_info=True)
        return 0.0


def math_verify_reward(prompts: Sequence[Any] | None = None, completions: Sequence[Any] | None = None,
                       answer: Sequence[Any] | None = None, **kwargs: Any) -> list[float]:
    """math-verify reward: boxed-answer extraction, symbolic/numeric equality with the answer."""
    return [math_verify_score(c, a) for c, a in _pairs(completions if completions is not None else [], answer)]


# --------------------------------------------------------------------------- DAPO-Math's "Answer:" line
# The prompt DAPO-Math-17k's rows carry (Yu et al. 2025, arXiv 2503.14476, the DAPO-Math-17k data set):
# the answer goes on a last line "Answer: ...", which verl's ``math_dapo`` scorer reads.
DAPO_PROMPT_TEMPLATE = (
    "Solve the following math problem step by step. The last line of your response should be of the form "
    "Answer: $Answer (without quotes) where $Answer is the answer to the problem.\n\n{problem}\n\n"
    'Remember to put your answer on its own line after "Answer:".')
# verl 0.9.1 math_dapo: the answer pattern, and the completion's tail it reads (its longest MATH-500
# answer is 159 characters)
ANSWER_LINE = re.compile(r"(?i)Answer\s*:\s*([^\n]+)")
ANSWER_TAIL_CHARS = 300


def answer_line(completion: Any) -> str | None:
    """The text after the last "Answer:" in the completion's last 300 characters (as verl's
    ``math_dapo`` extracts it), None when there is none."""
    text = completion_text(completion)
    found = ANSWER_LINE.findall(text[-ANSWER_TAIL_CHARS:]) if text else []
    return found[-1].strip() if found else None


def answer_line_score(completion: Any, answer: Any) -> float:
    """1.0 when the last "Answer:" line equals ``answer`` (math-verify equivalence), else 0.0; a
    completion without such a line is scored on its boxed answer, as verl's ``math_dapo`` falls
    back to ``\\boxed{}``."""
    found = answer_line(completion)
    if found is None:
        return math_verify_score(completion, answer)
    return math_verify_score(f"\\boxed{{{found}}}", answer)


def answer_line_reward(prompts: Sequence[Any] | None = None, completions: Sequence[Any] | None = None,
                       answer: Sequence[Any] | None = None, **kwargs: Any) -> list[float]:
    """DAPO-Math's reward: the "Answer:" line (boxed answer as fallback) against the reference answer."""
    return [answer_line_score(c, a) for c, a in _pairs(completions if completions is not None else [], answer)]


SCORERS = {"boxed": math_verify_reward, "answer_line": answer_line_reward}


# --------------------------------------------------------------------------- overlong reward shaping
def soft_overlong_penalty(length: int, max_len: int, buffer: int, factor: float = 1.0) -> float:
    """DAPO (Yu et al. 2025, arXiv 2503.14476, §3.4, Eq. 13) soft overlong punishment, as verl's
    DAPO reward manager adds it: 0 up to L_max − L_cache tokens, then falling linearly to −factor
    at L_max: min(−(|y| − (L_max − L_cache)) / L_cache · factor, 0)."""
    return min(-(length - (max_len - buffer)) / buffer * factor, 0.0)


class OverlongPenalty:
    """Reward function adding ``soft_overlong_penalty`` per completion (TRL sums the reward
    functions, as verl adds it to the score). Counts tokens of ``completion_ids`` (eos included,
    as verl's response length). ``shapes_length``: anchors and validation judge correctness
    without it (the trainer's ``_reward_values``)."""

    __name__ = "overlong_penalty"
    shapes_length = True

    def __init__(self, max_len: int, buffer: int, factor: float) -> None:
        self.max_len, self.buffer, self.factor = int(max_len), int(buffer), float(factor)

    def __call__(self, prompts: Any = None, completions: Any = None, completion_ids: Any = None,
                 **kwargs: Any) -> list[float]:
        return [soft_overlong_penalty(len(ids), self.max_len, self.buffer, self.factor) for ids in completion_ids or ()]

"""Held-out sets that are held out: problem-text normalisation, training de-duplication, the named
``eval_sets`` built as the task's own prompts, and the overlap check between them and training.

Normalisation (``problem_key``): Unicode NFKC, case folded, LaTeX spacing commands (``\\,``
``\\;`` ``\\:`` ``\\!`` ``\\␣`` ``~`` ``\\quad`` ``\\qquad``) and ``\\left``/``\\right`` removed,
then every whitespace character removed. Two problems are the same when their keys are equal; a
conversation's key is that of its messages' contents joined. Training keeps the first row of each
key (mathfile.build, before the split, so the val/test slices share no problem with training).
"""

from __future__ import annotations

import logging
import re
import unicodedata
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from armorlab.errors import ArmorLabError

log = logging.getLogger(__name__)

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


@dataclass
class EvalSet:
    """One named held-out set: ``data`` (prompt, answer rows), logged under ``<role>/<name>/``."""

    name: str
    role: str
    data: Any  # datasets.Dataset
    samples: int
    k: int
    path: str
    dropped: int = 0  # rows repeating an earlier problem of the set (a file repeated n times for avg@n)

    @property
    def prefix(self) -> str:
        return f"{self.role}/{self.name}"


def build_eval_sets(cfg: Mapping[str, Any], task: Any) -> dict[str, EvalSet]:
    """The resolved config's ``eval_sets`` as the task's prompts; a set sharing problems with the
    task's training rows is an error naming the count and the file unless ``allow_eval_overlap``."""
    from datasets import Dataset

    # lazy: mathfile imports this module
    from armorlab.tasks.mathfile import _column, load_records, make_prompt

    tc, settings = cfg["task"], task.settings
    train_keys = {problem_key(p) for p in task.train["prompt"]} if cfg.get("eval_sets") else set()
    out = {}
    for name, spec in (cfg.get("eval_sets") or {}).items():
        where = f"eval_sets.{name}"
        rows = load_records(spec["path"], spec["split"], key=f"{where}.path")
        problems = _column(rows, spec["problem_key"], "problem_key", spec["path"], conversations=True,
                           section=where)
        answers = _column(rows, spec["answer_key"], "answer_key", spec["path"], section=where)
        prompts = [make_prompt(p, template=tc["prompt_template"], system=tc["system_prompt"],
                               chat=settings["chat"]) for p in problems]
        kept, dropped = first_of_each(prompts)  # a repeat would count twice in n and break pass@k
        if dropped:
            log.warning("%s: %d of %d rows repeat an earlier problem and are dropped (for avg@n of each "
                        "problem, set samples: n)", where, dropped, len(prompts))
            prompts, answers = [prompts[i] for i in kept], [answers[i] for i in kept]
        shared = sum(problem_key(p) in train_keys for p in prompts)
        if shared and not cfg.get("allow_eval_overlap"):
            raise ArmorLabError(f"{shared} of its {len(prompts)} problems are also training problems of "
                                f"{tc['path']} (after normalising whitespace, case and LaTeX spacing): it is not "
                                "held out. Remove them, or set allow_eval_overlap: true if you mean it",
                                key=f"{where}.path", value=spec["path"], file=spec["path"])
        if shared:
            log.warning("%s shares %d of %d problems with training (allow_eval_overlap: true)", where, shared,
                        len(prompts))
        out[name] = EvalSet(name, spec["role"], Dataset.from_dict({"prompt": prompts, "answer": answers}),
                            spec["samples"], spec["k"], spec["path"], dropped)
    return out

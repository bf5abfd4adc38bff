"""Math task from the user's data, scored with math-verify.

Data (``task.path``): a JSONL/parquet file, a directory written by ``datasets``' ``save_to_disk``
(a Dataset, or a DatasetDict read at ``task.split``), or a hub dataset id the local Hugging Face
cache holds (nothing is downloaded). Columns ``problem_key`` and ``answer_key``.

Prompts: a text problem goes through ``prompt_template`` (``{problem}`` marks its place); a
problem may also be a conversation in TRL's format (``[{"role": "user", "content": ...}]``).
With ``chat`` (default: when the model's tokenizer has a chat template) every prompt is sent as a
conversation — ``system_prompt`` first, then the user turn — and TRL applies the tokenizer's chat
template; otherwise the prompt is plain text (``system_prompt`` + blank line + the problem).
The answer may be plain (``0.5``), LaTeX (``\\frac{1}{2}``) or boxed; completions score when their
``\\boxed{}`` answer equals it. Rows repeating an earlier row's problem (normalised text,
tasks/heldout.py) are dropped, then shuffled with ``split_seed``: val = first ``val_size``,
test = next ``test_size``, train = the rest (capped at ``train_size``).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from armorlab.core.fsutil import open_regular
from armorlab.core.identity import hub_snapshot
from armorlab.core.model_dir import entry_problem
from armorlab.errors import ArmorLabError
from armorlab.tasks.base import Task
from armorlab.tasks.heldout import first_of_each, problem_key
from armorlab.tasks.rewards import DAPO_PROMPT_TEMPLATE, SCORERS, non_finite_answer, parse_gold

log = logging.getLogger(__name__)

JSON_SUFFIXES = (".jsonl", ".json", ".ndjson")
PARQUET_SUFFIXES = (".parquet", ".pq")


def _read_jsonl(path: Path, key: str = "task.path") -> list[dict[str, Any]]:
    rows = []
    with open(open_regular(path), encoding="utf-8") as fh:
        for number, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ArmorLabError(f"line {number} is not valid JSON ({exc.msg})", key=key,
                                    value=str(path), file=str(path)) from None
            except ValueError as exc:  # a number past int()'s 4,300 digits: not a JSONDecodeError
                raise ArmorLabError(f"line {number} holds a number Python cannot read ({exc}): write it as a "
                                    "string", key=key, value=str(path), file=str(path)) from None
            except RecursionError:
                raise ArmorLabError(f"line {number} is nested too deeply to be a record", key=key,
                                    value=str(path), file=str(path)) from None
            if not isinstance(row, dict):
                raise ArmorLabError(f"line {number} is not a JSON object", key=key,
                                    value=str(path), file=str(path))
            rows.append(row)
    return rows


def _read_parquet(path: Path, key: str = "task.path") -> list[dict[str, Any]]:
    import pyarrow.parquet as pq

    try:
        return pq.read_table(path).to_pylist()
    except Exception as exc:  # pyarrow raises several types for a corrupt file
        raise ArmorLabError(f"cannot read parquet: {exc}", key=key, value=str(path),
                            file=str(path)) from None


def load_rows(path: str | Path, key: str = "task.path") -> list[dict[str, Any]]:
    """All records of a JSONL/parquet file, with clear errors for a missing or unreadable one."""
    path = Path(path).expanduser()
    suffix = path.suffix.lower()
    if suffix not in JSON_SUFFIXES + PARQUET_SUFFIXES:
        raise ArmorLabError(f"must be a JSONL ({', '.join(JSON_SUFFIXES)}) or parquet file",
                            key=key, value=str(path), file=str(path))
    if not path.is_file():
        problem = entry_problem(path) if os.path.lexists(path) else None
        raise ArmorLabError(f"the data path {problem}" if problem else "file not found", key=key,
                            value=str(path), file=str(path))
    try:
        rows = _read_jsonl(path, key) if suffix in JSON_SUFFIXES else _read_parquet(path, key)
    except (OSError, UnicodeDecodeError) as exc:
        raise ArmorLabError(f"cannot read file: {exc}", key=key, value=str(path),
                            file=str(path)) from None
    if not rows:
        raise ArmorLabError("file holds no records", key=key, value=str(path), file=str(path))
    return rows


def _pick_split(data: Any, split: str, where: str, key: str = "task.split") -> Any:
    from datasets import DatasetDict

    if isinstance(data, DatasetDict):
        if split not in data:
            raise ArmorLabError(f"no split '{split}' (splits: {', '.join(data)})", key=key,
                                value=split, file=where)
        return data[split]
    return data


def load_records(path: str, split: str = "train", key: str = "task.path") -> list[dict[str, Any]]:
    """Records of a data file, a ``save_to_disk`` directory or a cached hub dataset id."""
    local = Path(path).expanduser()
    if local.is_file() or local.suffix.lower() in JSON_SUFFIXES + PARQUET_SUFFIXES:
        return load_rows(local, key)
    if local.is_dir():
        from datasets import load_from_disk

        try:
            data = load_from_disk(str(local))
            rows = _pick_split(data, split, path, _split_key(key)).to_list()
        except ArmorLabError:
            raise
        except Exception as exc:  # noqa: BLE001 - a damaged dir fails in datasets' internals in many ways
            raise ArmorLabError(f"cannot read the saved dataset (damaged save_to_disk directory?): "
                                f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}",
                                key=key, value=path, file=path) from None
    else:
        from datasets import load_dataset


        snapshot = hub_snapshot(path, "dataset")
        if snapshot is None:
            raise ArmorLabError("not a file, a directory or a hub dataset in the local Hugging Face cache",
                                key=key, value=path)
        try:  # the snapshot is a local folder: datasets reads its files, offline
            rows = _pick_split(load_dataset(str(snapshot)), split, path, _split_key(key)).to_list()
        except ArmorLabError:  # a missing split: named as such, not as an unreadable dataset
            raise
        except (OSError, ValueError) as exc:
            raise ArmorLabError(f"cannot read the cached hub dataset: {exc}", key=key, value=path,
                                file=str(snapshot)) from None
    if not rows:
        raise ArmorLabError("the dataset holds no records", key=key, value=path, file=path)
    return rows


def _split_key(path_key: str) -> str:
    return path_key.rsplit(".", 1)[0] + ".split"


def _is_conversation(value: Any) -> bool:
    return (isinstance(value, list) and bool(value)
            and all(isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
                    for m in value))


def _column(rows: list[dict[str, Any]], key: str, field: str, path: str, *,
            conversations: bool = False, section: str = "task") -> list[Any]:
    """A column as strings; with ``conversations``, TRL-format message lists are kept as lists."""
    out: list[Any] = []
    for number, row in enumerate(rows, 1):
        if key not in row:
            raise ArmorLabError(f"record {number} has no column '{key}' (columns: {', '.join(sorted(row))})",
                                key=f"{section}.{field}", value=key, file=path)
        value = row[key]
        if conversations and _is_conversation(value):
            out.append([{"role": m["role"], "content": m["content"]} for m in value])
            continue
        if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 4000:
            raise ArmorLabError(f"record {number}: column '{key}' holds an integer of over 1,200 digits: write it "
                                "as a string", key=f"{section}.{field}", value=key, file=path)
        if isinstance(value, bool) or not isinstance(value, (str, int, float)) or str(value).strip() == "":
            kinds = "a non-empty string, a number" + (" or a list of {role, content} messages" if conversations
                                                      else "")
            raise ArmorLabError(f"record {number}: column '{key}' must be {kinds}, got {value!r}",
                                key=f"{section}.{field}", value=key, file=path)
        if field == "answer_key" and non_finite_answer(str(value)):
            raise ArmorLabError(f"record {number}: answer {value!r} is not a finite number (NaN, an infinity or "
                                "past float range): no completion can be scored against it",
                                key=f"{section}.{field}", value=key, file=path)
        out.append(str(value))
    return out


def make_prompt(problem: str | list[dict[str, str]], *, template: str | None, system: str | None,
                chat: bool) -> str | list[dict[str, str]]:
    """One prompt as TRL takes it: plain text, or a conversation TRL renders with the chat template."""
    if isinstance(problem, str):
        template = DAPO_PROMPT_TEMPLATE if template == "dapo" else template
        text = template.replace("{problem}", problem) if template else problem
        if not chat:
            return f"{system}\n\n{text}" if system else text
        messages = [{"role": "user", "content": text}]
    else:
        if not chat:
            raise ArmorLabError("conversational problems need chat prompts (a model with a chat template, "
                                "or chat: true)", key="task.chat", value=chat)
        messages = list(problem)
    if system and messages[0]["role"] != "system":
        messages = [{"role": "system", "content": system}, *messages]
    return messages


def boxed(answer: str) -> str:
    return answer if "\\boxed" in answer else f"\\boxed{{{answer}}}"


def build(cfg: Mapping[str, Any], *, chat: bool = False) -> Task:
    """Math task from the resolved ``task`` section (config.TASK_FIELDS["math"]); ``chat`` is the
    default for ``cfg["chat"] is None`` (whether the model's tokenizer has a chat template)."""
    from datasets import Dataset

    path = cfg["path"]
    rows = load_records(path, cfg["split"])
    # one row per problem before the split: no val/test problem repeats in training (tasks/heldout.py)
    kept, dropped = first_of_each(_column(rows, cfg["problem_key"], "problem_key", path, conversations=True))
    if dropped:
        log.warning("%s: %d of %d rows repeat an earlier problem (normalised text) and are dropped", path,
                    dropped, len(rows))
        rows = [rows[i] for i in kept]
    problems = _column(rows, cfg["problem_key"], "problem_key", path, conversations=True)
    answers = _column(rows, cfg["answer_key"], "answer_key", path)
    use_chat = chat if cfg["chat"] is None else cfg["chat"]
    prompts = [make_prompt(p, template=cfg["prompt_template"], system=cfg["system_prompt"], chat=use_chat)
               for p in problems]
    held = cfg["val_size"] + cfg["test_size"]
    if held >= len(rows):
        distinct = f" ({dropped} repeated problems dropped)" if dropped else ""
        raise ArmorLabError(f"val_size + test_size = {held} leaves no training rows in a file of "
                            f"{len(rows)} distinct problems{distinct}", key="task.val_size", value=cfg["val_size"],
                            file=path)
    unparsable = [a for a in answers if not parse_gold(a)]
    if unparsable:
        log.warning("%d of %d answers in %s cannot be parsed by math-verify and always score 0, e.g. %r",
                    len(unparsable), len(answers), path, unparsable[0])
    order = np.random.default_rng(cfg["split_seed"]).permutation(len(rows)).tolist()
    val_end, test_end = cfg["val_size"], held
    train_idx = order[test_end:]
    if cfg["train_size"] is not None:
        train_idx = train_idx[:cfg["train_size"]]

    def rows_at(idx: list[int]) -> Dataset:
        return Dataset.from_dict({"prompt": [prompts[i] for i in idx], "answer": [answers[i] for i in idx]})

    train = rows_at(train_idx)
    return Task(name="math", train=train, val=rows_at(order[:val_end]), test=rows_at(order[val_end:test_end]),
                reward_funcs=[SCORERS[cfg.get("scorer", "boxed")]], warm_start=train, target_completion=boxed,
                completion_chars=None, settings={**cfg, "chat": use_chat, "dedup_dropped": dropped})


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

"""Named held-out evaluation sets (``eval_sets``) and the metric the kept checkpoint is selected on
(``keep_select``): their config checks, torch-free (docs/metrics.md, docs/papers.md).

```yaml
eval_sets:
  math500: {path: data/math500.jsonl, role: val, samples: 1}          # val/math500/acc, …
  aime24:  {path: HuggingFaceH4/aime_2024, role: test, samples: 32}   # test/aime24/acc = avg@32
allow_eval_overlap: false       # true: accept a set that shares problems with training
keep_select: {metric: val/math500/acc, mode: max}
```
Each set is a math file read as ``task.path`` is (JSONL/parquet, a ``save_to_disk`` directory, a
hub id already in the Hugging Face cache: nothing downloads), prompted as the task's problems.
``role`` says whether its metrics are logged under ``val/<name>/`` (may select checkpoints) or
``test/<name>/`` (reported, never selected on). ``samples`` = n completions per problem (avg@n is
``acc``), ``k`` the k of ``pass@k`` (≤ n, default n), estimated without bias from the n samples.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from armorlab.core.checks import Invalid, boolean, choice, integer, optional, text
from armorlab.core.identity import data_identity
from armorlab.errors import ArmorLabError

# a set's name is a path segment of its metric names (val/<name>/acc): no '/', space or control character
SET_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]{0,63}")
ROLES = ("val", "test")
MAX_SAMPLES = 1024  # completions per problem: the papers report avg@32 at most; a typo of 10^6 fails here
SET_DEFAULTS: dict[str, Any] = {"role": "test", "samples": 1, "k": None, "split": "train",
                                "problem_key": "problem", "answer_key": "answer", "fingerprint": None}
SET_CHECKS = {"path": text, "role": choice(*ROLES), "samples": integer(1, MAX_SAMPLES),
              "k": optional(integer(1, MAX_SAMPLES)), "split": text, "problem_key": text,
              "answer_key": text, "fingerprint": optional(text)}
VAL_METRIC = "val/acc"    # the validation score selections and comparisons use unless told (docs/metrics.md)
TEST_METRIC = "test/acc"  # ... and the held-out score they report at the selected step
DEFAULT_KEEP_SELECT = {"metric": VAL_METRIC, "mode": "max"}


def eval_sets_shape(v: Any) -> dict[str, Any] | None:
    """The field check (also ArmorLabConfig's): a mapping of set names, or null. The sets'
    own keys are checked by ``resolve_eval_sets``, which names each key."""
    if v is None or v == {}:
        return None
    if not isinstance(v, Mapping):
        raise Invalid("must be a mapping {<set name>: {path, role, samples, k}} or null")
    return dict(v)


def keep_select_shape(v: Any) -> dict[str, str] | None:
    """``{metric: val/..., mode: max|min}`` or null (= val/acc, max)."""
    if v is None:
        return None
    if not isinstance(v, Mapping) or set(map(str, v)) - {"metric", "mode"}:
        raise Invalid("must be a mapping {metric: <val/... metric>, mode: max|min} or null")
    metric, mode = v.get("metric", VAL_METRIC), v.get("mode", "max")
    if not isinstance(metric, str) or not metric.startswith("val/") or metric.count("/") > 2:
        raise Invalid("metric must be a validation metric such as val/acc or val/<set>/acc (a test/ metric is "
                      "reported, never selected on)")
    if mode not in ("max", "min"):
        raise Invalid("mode must be max or min")
    out = {"metric": metric, "mode": mode}
    return None if out == DEFAULT_KEEP_SELECT else out


FIELD_SPECS: dict[str, tuple[Any, Any, str, Any]] = {
    "eval_sets": (None, eval_sets_shape, "named held-out sets separate from training: {<name>: {path, role: "
                  "val|test, samples: n (avg@n), k (pass@k, ≤ n), split, problem_key, answer_key}}; logged as "
                  "<role>/<name>/acc, pass@k, n (docs/metrics.md)", dict | None),
    "allow_eval_overlap": (False, boolean, "accept held-out sets that share problems with training (after "
                           "normalisation); false: such a set is an error naming the count and the file",
                           bool),
    "keep_select": (None, keep_select_shape, "the validation metric the kept checkpoint and selected.json are "
                    "chosen on: {metric: val/acc or val/<set>/acc, mode: max|min}; null = val/acc, max",
                    dict | None),
}


def _err(message: str, key: str, value: Any, file: str | None) -> ArmorLabError:
    return ArmorLabError(message, key=key, value=value, file=file)


def resolve_eval_sets(cfg: dict[str, Any], file: str | None, check_paths: bool = True) -> None:
    """Check every set's keys in place (each error names ``eval_sets.<name>.<key>``), fill their
    defaults and, with ``check_paths``, each path's identity (absolute path + fingerprint, part of
    the run id, as ``task.path``'s); then check that ``keep_select`` names a metric the run logs."""
    sets = cfg.get("eval_sets")
    if sets:
        if cfg["task"]["name"] != "math":
            raise _err("held-out sets are math problems scored with math-verify: they need task: {name: math} "
                       "(or eval_sets: null)", "eval_sets", sorted(map(str, sets)), file)
        cfg["eval_sets"] = {name: _resolve_set(name, raw, file, check_paths) for name, raw in sets.items()}
    select = cfg.get("keep_select")
    if select:
        parts = select["metric"].split("/")
        if len(parts) == 3 and (parts[1] not in (sets or {}) or cfg["eval_sets"][parts[1]]["role"] != "val"):
            vals = [n for n, s in (cfg.get("eval_sets") or {}).items() if s["role"] == "val"]
            raise _err(f"names no held-out set with role: val (those: {', '.join(vals) or 'none'})",
                       "keep_select.metric", select["metric"], file)


def _resolve_set(name: Any, raw: Any, file: str | None, check_paths: bool) -> dict[str, Any]:
    if not isinstance(name, str) or not SET_NAME_RE.fullmatch(name):
        raise _err("a set name is part of its metric names (val/<name>/acc): 1-64 letters, digits or _ . + -, "
                   "starting with a letter or digit", "eval_sets", name, file)
    where = f"eval_sets.{name}"
    if isinstance(raw, str):
        raw = {"path": raw}
    if not isinstance(raw, Mapping):
        raise _err("must be a path or a mapping {path, role, samples, k}", where, raw, file)
    unknown = sorted(set(map(str, raw)) - set(SET_CHECKS))
    if unknown:
        raise _err(f"unknown key (known: {', '.join(SET_CHECKS)})", f"{where}.{unknown[0]}", raw[unknown[0]], file)
    if "path" not in raw:
        raise _err("a held-out set needs its data: path (a JSONL/parquet file, a save_to_disk directory or a "
                   "hub dataset id in the local Hugging Face cache)", f"{where}.path", None, file)
    out = {}
    for key, check in SET_CHECKS.items():
        value = raw.get(key, SET_DEFAULTS.get(key))
        try:
            out[key] = check(value)
        except Invalid as exc:
            raise _err(str(exc), f"{where}.{key}", value, file) from None
    if out["k"] is None:
        out["k"] = out["samples"]
    if out["k"] > out["samples"]:
        raise _err(f"pass@k needs k ≤ samples = {out['samples']} completions per problem", f"{where}.k", out["k"],
                   file)
    if check_paths:
        ident = data_identity(out["path"], key=f"{where}.path", file=file)
        out["path"], out["fingerprint"] = ident["path"], ident["fingerprint"]
    return out

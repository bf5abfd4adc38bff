"""MkDocs hook (``hooks:`` in mkdocs.yml): the docs site's reference tables, generated from the code
every time the site is built, so none of them is a hand-kept copy that can go stale.

A page asks for a table with a marker on a line of its own::

    <!-- generated: config-fields -->

and ``on_page_markdown`` replaces the marker with the table before MkDocs renders the page (so
``mkdocs build --strict`` checks the generated links and anchors like hand-written ones). An unknown
name stops the build. The sources:

- the configuration reference: ``armorlab.core.config`` (FIELDS, TASK_FIELDS, MODEL_FIELDS_TINY, the
  defaults dicts, LOGGING_KEYS), the objective registry (``armorlab.algos.objectives``: each
  objective's metadata and preset) and ``armorlab.core.trl_fields`` (GRPOConfig's fields, classified);
- the layers: the import-linter contracts in ``pyproject.toml`` (the one statement of the rules, run
  by ``tests/test_layout.py``) and that test's TORCH_FREE (read with ``ast``), the modules of each
  part (their docstrings), the exit codes (``armorlab/core/exits.py``) and the old module paths
  (``armorlab._moved.MOVED``).

Why a hook and not the mkdocs-gen-files plugin: a hook is MkDocs' own mechanism (no extra package to
install, pin or keep working offline), and substituting a marker keeps each generated table inside a
hand-written page, next to the prose that explains it. The generators are plain functions
(``GENERATORS``), which ``tests/test_docs.py`` calls without MkDocs.
"""

from __future__ import annotations

import ast
import io
import json
import re
import sys
import tokenize
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import tomllib

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # this checkout's armorlab, whether or not it is the installed one
    sys.path.insert(0, str(ROOT))

MARKER = re.compile(r"^<!--\s*generated:\s*([a-z0-9-]+)\s*-->[ \t]*$", re.MULTILINE)
LAYOUT_TEST = ROOT / "tests" / "test_layout.py"


# --------------------------------------------------------------------------- formatting
def cell(text: Any) -> str:
    """Text for a markdown table cell: one line, pipes escaped."""
    return " ".join(str(text).split()).replace("|", "\\|")


def value(v: Any) -> str:
    """A config value as YAML would write it, in a code span."""
    if v is None:
        text = "null"
    elif isinstance(v, bool):
        text = "true" if v else "false"
    elif isinstance(v, str):
        text = v if v else '""'
    elif isinstance(v, (list, tuple, dict)):
        text = json.dumps(v, ensure_ascii=False)
    else:
        text = repr(v)
    return f"`{cell(text)}`"


def type_name(t: Any) -> str:
    """``float | None`` → ``float or null``; None (a section field without a declared type) → ``—``."""
    if t is None:
        return "—"
    text = t.__name__ if isinstance(t, type) else str(t).replace("typing.", "")
    return " or ".join("null" if part.strip() == "None" else part.strip() for part in text.split("|"))


def table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def first_sentence(doc: str) -> str:
    """The first sentence of a docstring's first paragraph (a full stop followed by a capital or the
    end; "Eq. 11", "et al. 2025" and "Dr. GRPO" do not end one)."""
    para = " ".join(doc.strip().split("\n\n")[0].split())
    match = re.match(r"(.+?(?<!\bDr)(?<!\bEq)(?<!\bal)(?<!\bvs)\.)(\s+(?=[A-Z\"'(`*])|$)", para)
    return match.group(1) if match else para


def comments_by_line(source: str) -> dict[int, str]:
    """Line number → the text of the ``#`` comment on that line."""
    out = {}
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            out[tok.start[0]] = tok.string.lstrip("#").strip()
    return out


# --------------------------------------------------------------------------- configuration
def config_fields() -> str:
    from armorlab.core.config import FIELDS

    rows = [[f"`{key}`", value(f.default), cell(type_name(f.type)), cell(f.doc)] for key, f in FIELDS.items()]
    return table(["key", "default", "type", "meaning"], rows)


def objective_presets() -> str:
    from armorlab.algos.objectives import objective_names, objective_spec

    rows = []
    for name in objective_names():
        spec = objective_spec(name)
        preset = ", ".join(f"`{k}: {cell(value(v).strip('`'))}`" for k, v in spec.defaults.items()) or "—"
        params = ", ".join(f"`{k}: {'required' if v is None else cell(value(v).strip('`'))}`"
                           for k, v in spec.params.items()) or "—"
        rows.append([f"`{name}`", cell(first_sentence(spec.fn.__doc__ or "")), f"`{spec.aggregation}`", f"`{spec.capacity}`",
                     "yes" if spec.sequence_level else "no", "yes" if spec.uses_reference else "no", preset, params])
    return table(["objective", "what it is", "default aggregation", "capacity family", "sequence-level",
                  "reads π_ref", "preset (defaults it brings)", "parameters (default)"], rows)


def trl_defaults() -> str:
    from armorlab.core.config import COMMON_DEFAULTS, DEFAULT_EPS, REAL_DEFAULTS, TINY_DEFAULTS

    tiny = {**COMMON_DEFAULTS, **TINY_DEFAULTS, **DEFAULT_EPS}
    real = {**COMMON_DEFAULTS, **REAL_DEFAULTS, **DEFAULT_EPS}
    keys = list(dict.fromkeys([*tiny, *real]))
    rows = [[f"`{k}`", value(tiny[k]) if k in tiny else "TRL's default",
             value(real[k]) if k in real else "TRL's default"] for k in keys]
    return table(["GRPOConfig field", "`model: tiny`", "a real model (path or hub id)"], rows)


def section_fields(fields: Mapping[str, Any], prefix: str) -> str:
    rows = [[f"`{prefix}.{key}`", value(f.default), cell(f.doc)] for key, f in fields.items()]
    return table(["key", "default", "meaning"], rows)


def task_fields() -> str:
    from armorlab.core.config import TASK_FIELDS

    parts = []
    for name, fields in TASK_FIELDS.items():
        parts.append(f"**`task: {name}`** (`task: {{name: {name}, ...}}`)\n\n{section_fields(fields, 'task')}")
    return "\n\n".join(parts)


def model_fields() -> str:
    from armorlab.core.config import MODEL_FIELDS_TINY

    return section_fields(MODEL_FIELDS_TINY, "model")


def logging_keys() -> str:
    from armorlab.core.config import LOGGING_KEYS, MANAGED_KEYS

    logged = ", ".join(f"`{k}`" for k in sorted(LOGGING_KEYS))
    managed = ", ".join(f"`{k}`" for k in sorted(MANAGED_KEYS))
    return (f"Kept in `config.yaml` but not in the run id (they change how a run is logged, not what it "
            f"is): {logged}.\n\nSet by armorlab from the run directory, an error in a config: {managed}.")


def trl_fields_reference() -> str:
    from armorlab.core.trl_fields import HONOURED, MAPPED, REJECTED, grpo_field_names

    known = grpo_field_names()
    head = (f"The shipped field list (`armorlab/core/grpo_fields.json`, regenerated by "
            f"`tools/gen_grpo_fields.py` from the installed TRL) has {len(known)} GRPOConfig fields: "
            f"{len(HONOURED & known)} honoured, {len(set(MAPPED) & known)} mapped, "
            f"{len(set(REJECTED) & known)} rejected.")
    honoured = ", ".join(f"`{k}`" for k in sorted(HONOURED))
    mapped = table(["field", "TRL's default", "in a run config: an error that says"],
                   [[f"`{k}`", value(d), cell(why)] for k, (d, why) in sorted(MAPPED.items())])
    rejected = table(["field", "accepted value (TRL's default: the feature off)", "any other value: an error that says"],
                     [[f"`{k}`", value(d), cell(why)] for k, (d, why) in sorted(REJECTED.items())])
    return (f"{head}\n\n**Honoured** (passed to `GRPOConfig`, applied by TRL/transformers): {honoured}.\n\n"
            f"**Mapped** (armorlab has its own key for it):\n\n{mapped}\n\n"
            f"**Rejected** (a feature `ArmorLabTrainer` does not run):\n\n{rejected}")


# --------------------------------------------------------------------------- layers
def contracts() -> list[dict[str, Any]]:
    """The import-linter contracts of pyproject.toml, in their order."""
    with open(ROOT / "pyproject.toml", "rb") as f:
        return tomllib.load(f)["tool"]["importlinter"]["contracts"]


def torch_free() -> tuple[str, ...]:
    """TORCH_FREE of tests/test_layout.py (the parts its fresh interpreter imports), read without running it."""
    for node in ast.parse(LAYOUT_TEST.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Assign) and [ast.unparse(t) for t in node.targets] == ["TORCH_FREE"]:
            return tuple(ast.literal_eval(node.value))
    raise ValueError(f"no TORCH_FREE in {LAYOUT_TEST}")


def layer_rows() -> list[list[str]]:
    """The layers contract's layers, top first, each a list of parts (``a | b``: independent of each other)."""
    (layered,) = [c for c in contracts() if c["type"] == "layers"]
    return [[p.strip() for p in re.split(r"[|:]", layer)] for layer in layered["layers"]]


def parts() -> list[str]:
    """Every part of the package: the layered ones top first, then its face and its private helpers."""
    (layered,) = [c for c in contracts() if c["type"] == "layers"]
    return [p for row in layer_rows() for p in row] + ["__init__", *layered.get("exhaustive_ignores", [])]


def layers() -> str:
    free = torch_free()

    def name(part: str) -> str:
        return f"`armorlab/{part}.py`" if (ROOT / "armorlab" / f"{part}.py").is_file() else f"`armorlab/{part}/`"

    rows = [[str(i), ", ".join(name(p) for p in row), "yes" if all(p in free for p in row) else ""]
            for i, row in enumerate(layer_rows(), 1)]
    rules = "\n".join(f"- {c['name']} (`{c['type']}`)" for c in contracts())
    return (table(["layer (top first)", "parts", "torch-free (tested)"], rows)
            + f"\n\nThe contracts (`pyproject.toml`, `[tool.importlinter]`):\n\n{rules}")


def _summary(path: Path) -> str:
    doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
    return first_sentence(doc)


def modules() -> str:
    package = ROOT / "armorlab"
    rows = []
    for part in parts():
        folder = package / part
        paths = sorted(p for p in folder.glob("*.py") if p.name != "__init__.py") if folder.is_dir() \
            else [package / f"{part}.py"]
        for path in paths:
            if path.is_file():
                lines = len(path.read_text(encoding="utf-8").splitlines())
                rows.append([f"`{path.relative_to(ROOT).as_posix()}`", str(lines), cell(_summary(path))])
    return table(["module", "lines", "what it is (its docstring)"], rows)


def exit_codes() -> str:
    path = ROOT / "armorlab" / "core" / "exits.py"
    source = path.read_text(encoding="utf-8")
    comments = comments_by_line(source)
    rows = []
    for node in ast.parse(source).body:
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name) and \
                node.targets[0].id.startswith("EXIT_"):
            rows.append([f"`{ast.literal_eval(node.value)}`", f"`{node.targets[0].id}`",
                         cell(comments.get(node.lineno, ""))])
    return table(["exit code", "name (`armorlab.core.exits`)", "meaning"], rows)


def moved() -> str:
    from armorlab._moved import MOVED

    return table(["old path (warns, removed in 0.3)", "new path"],
                 [[f"`{old}`", f"`{new}`"] for old, new in MOVED.items()])


GENERATORS: dict[str, Callable[[], str]] = {
    "config-fields": config_fields,
    "objective-presets": objective_presets,
    "trl-defaults": trl_defaults,
    "task-fields": task_fields,
    "model-fields": model_fields,
    "logging-keys": logging_keys,
    "trl-fields": trl_fields_reference,
    "layers": layers,
    "modules": modules,
    "exit-codes": exit_codes,
    "moved": moved,
}


def expand(markdown: str, where: str = "page") -> str:
    """Every marker of ``markdown`` replaced by its generated table."""

    def generate(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in GENERATORS:
            raise ValueError(f"{where}: unknown generated table {name!r} (known: {', '.join(GENERATORS)})")
        return GENERATORS[name]()

    return MARKER.sub(generate, markdown)


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    try:
        return expand(markdown, page.file.src_uri)
    except ValueError as exc:
        from mkdocs.exceptions import PluginError

        raise PluginError(str(exc)) from None

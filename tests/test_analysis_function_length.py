"""No function in armorlab/analysis/ or armorlab/stats/ is longer than 80 lines (issue 34): a
report built in stages reads one stage at a time."""

import ast
import shutil
from pathlib import Path

import armorlab

MAX_LINES = 80
WINGS = ("analysis", "stats")


def too_long(package: Path) -> list[str]:
    """``path:function (lines)`` for each function of the wings longer than MAX_LINES, decorators
    not counted, nested functions counted in their parent and on their own."""
    found = []
    for wing in WINGS:
        for path in sorted((package / wing).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    lines = node.end_lineno - node.lineno + 1
                    if lines > MAX_LINES:
                        found.append(f"{path.relative_to(package)}:{node.name} ({lines})")
    return found


def test_no_function_in_analysis_or_stats_is_over_80_lines():
    assert too_long(Path(armorlab.__file__).parent) == []


def test_a_planted_long_function_is_found(tmp_path):
    copy = tmp_path / "armorlab"
    shutil.copytree(Path(armorlab.__file__).parent, copy, ignore=shutil.ignore_patterns("__pycache__"))
    body = "".join(f"    x{i} = {i}\n" for i in range(MAX_LINES - 1))  # def line + 79 = 80: allowed
    (copy / "analysis" / "planted.py").write_text(f"def fits():\n{body}\n\ndef grows():\n{body}    return x0\n")
    assert too_long(copy) == [f"analysis/planted.py:grows ({MAX_LINES + 1})"]

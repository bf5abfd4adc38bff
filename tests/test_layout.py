"""The house rules (issues 24, 34): which layer may import which and no import circles (import-linter
contracts in pyproject.toml, seen to fail on planted violations), the torch-free layers free of torch,
and every old module path still importable (with a warning) as the same module."""

from __future__ import annotations

import ast
import importlib
import os
import shutil
import subprocess
import sys
import warnings
from graphlib import CycleError, TopologicalSorter
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "armorlab"

# The rules themselves are import-linter contracts in pyproject.toml ([tool.importlinter]).
ROOT = PACKAGE.parent
TORCH_FREE = ("core", "vllm", "tasks", "stats", "analysis", "sweeps", "tune", "commands", "cli")


def part_of(module: str) -> str:
    """``armorlab.core.config`` → ``core``; ``armorlab`` → ``__init__``."""
    parts = module.split(".")
    return "__init__" if len(parts) == 1 else parts[1]


def module_name(path: Path, package: Path = PACKAGE) -> str:
    rel = path.relative_to(package.parent).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


def imports_of(path: Path, root: Path = PACKAGE) -> list[tuple[str, int, bool]]:
    """(imported armorlab module, line, inside a function) for every import in ``path``, type-checking
    blocks included (they are promises about the layering too), except the package face's: its
    type-checking block only names what it exports lazily."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    me = module_name(path, root)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    found: list[tuple[str, int, bool]] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if me == "armorlab" and isinstance(child, ast.If) and ast.unparse(child.test) == "TYPE_CHECKING":
                continue
            inner = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            if isinstance(child, ast.Import):
                found.extend((a.name, child.lineno, inner) for a in child.names if a.name.startswith("armorlab"))
            elif isinstance(child, ast.ImportFrom):
                if child.level:
                    base = package.split(".")[: len(package.split(".")) - child.level + 1]
                    target = ".".join([*base, *([child.module] if child.module else [])])
                else:
                    target = child.module or ""
                if target.startswith("armorlab"):
                    # `from armorlab.x import y`: y may be a module (armorlab.x.y) or a name in armorlab.x
                    for alias in child.names:
                        sub = f"{target}.{alias.name}"
                        is_module = (root.parent / sub.replace(".", "/")).with_suffix(".py").is_file() or \
                            (root.parent / sub.replace(".", "/") / "__init__.py").is_file()
                        found.append((sub if is_module else target, child.lineno, inner))
            visit(child, inner)

    visit(tree, False)
    return found


def import_circle(package: Path) -> list[str]:
    """One circle of top-level or in-function imports between modules of ``package``, or []."""
    graph = {module_name(p, package): {t for t, _, _ in imports_of(p, package)} for p in package.rglob("*.py")}
    try:
        tuple(TopologicalSorter({m: ts - {m} for m, ts in graph.items()}).static_order())  # the walk finds it
    except CycleError as exc:
        return list(exc.args[1])
    return []


def lint_imports(root: Path) -> subprocess.CompletedProcess:
    """import-linter's verdict on the contracts in ``root``/pyproject.toml for ``root``/armorlab."""
    exe = Path(sys.executable).with_name("lint-imports")
    if not exe.is_file():
        pytest.fail(f"{exe} is missing: pip install -e '.[dev]' (import-linter checks the house rules)")
    env = {**os.environ, "PYTHONPATH": str(root)}
    return subprocess.run([str(exe), "--no-cache", "--no-logo"], cwd=root, env=env, capture_output=True, text=True)


def test_the_house_rules_hold():
    out = lint_imports(ROOT)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "0 broken" in out.stdout and import_circle(PACKAGE) == []


PLANTED = {  # file → its text, the contract it breaks
    "circle": ({"analysis/planted_a.py": "from armorlab.analysis import planted_b\n",
                "analysis/planted_b.py": "from armorlab.analysis import planted_a\n"},
               "No import circles between modules"),
    "upward": ({"stats/planted.py": "from armorlab.analysis import load\n"}, "Layers: nothing imports upward"),
    "package face": ({"analysis/planted.py": "from armorlab import __version__\n"},
                     "No part imports the package face"),
    "trainer in sweeps": ({"sweeps/planted.py": "def f():\n    from armorlab.train import trainer\n"},
                          "Layers: nothing imports upward"),
}


@pytest.mark.parametrize("plant", PLANTED)
def test_a_planted_violation_breaks_the_rules(plant, tmp_path):
    shutil.copytree(PACKAGE, tmp_path / "armorlab", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    assert lint_imports(tmp_path).returncode == 0  # the copy itself keeps the rules
    files, contract = PLANTED[plant]
    for name, text in files.items():
        (tmp_path / "armorlab" / name).write_text(text, encoding="utf-8")
    out = lint_imports(tmp_path)
    broken = [line for line in out.stdout.splitlines() if line.endswith(" BROKEN")]
    assert out.returncode != 0 and any(line.startswith(contract) for line in broken), out.stdout + out.stderr
    assert bool(import_circle(tmp_path / "armorlab")) == (plant == "circle")


def test_torch_free_layers_import_armorlab_at_the_top():
    # the layers that must never load torch need no in-function imports to keep torch out; the few
    # left load a heavy library (optuna, submitit, pandas) for one command only and say so with
    # `# lazy` on the import or the line above it. The command layer imports each command's work
    # when the command runs (--help stays fast).
    late = []
    for path in sorted(PACKAGE.rglob("*.py")):
        module = module_name(path)
        if part_of(module) not in set(TORCH_FREE) - {"commands", "cli"}:
            continue
        lines = path.read_text(encoding="utf-8").splitlines()
        for target, line, inner in imports_of(path):
            marked = "# lazy" in lines[line - 1] or "# lazy" in lines[line - 2]
            if inner and not marked:
                late.append(f"{module}:{line} imports {target} inside a function without a `# lazy` reason")
    assert not late, "\n".join(late)


def test_torch_free_layers_do_not_load_torch():
    code = ("import sys\nimport armorlab, armorlab.core, armorlab.algos.objectives, armorlab.algos.kl, "
            "armorlab.algos.capacity, armorlab.vllm.servers, armorlab.sweeps.submit, armorlab.tune.study, "
            "armorlab.analysis.report, armorlab.cli\n"
            "from armorlab import resolve, register_objective\n"
            "import armorlab.core.config as c\nc.resolve({'objective': 'armor'})\n"
            "heavy = sorted(m for m in ('torch', 'transformers', 'trl', 'accelerate', 'vllm') if m in sys.modules)\n"
            "print(heavy)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def test_exit_codes_are_defined_once():
    defined = [f"{p.relative_to(PACKAGE)}:{node.lineno}" for p in PACKAGE.rglob("*.py")
               for node in ast.walk(ast.parse(p.read_text(encoding="utf-8")))
               if isinstance(node, ast.Assign) and any(
                   isinstance(t, (ast.Name, ast.Tuple)) and any(
                       isinstance(n, ast.Name) and n.id.startswith("EXIT_") for n in ast.walk(t))
                   for t in node.targets)]
    assert defined and all(d.startswith("core/exits.py") for d in defined), defined
    assert exit_literals(PACKAGE) == []


def exit_literals(package: Path) -> list[str]:
    """Where a module returns or exits with a literal code of armorlab's own (73-75) instead of its name."""
    from armorlab.core import exits

    own = {v for k, v in vars(exits).items() if k.startswith("EXIT_") and v > 2}
    found = []
    for p in package.rglob("*.py"):
        for node in ast.walk(ast.parse(p.read_text(encoding="utf-8"))):
            value = node.value if isinstance(node, ast.Return) else \
                node.args[0] if isinstance(node, ast.Call) and ast.unparse(node.func) in ("sys.exit", "os._exit",
                                                                                       "SystemExit") and node.args \
                else None
            if isinstance(value, ast.Constant) and value.value in own:
                found.append(f"{p.relative_to(package)}:{node.lineno}")
    return found


def test_a_literal_exit_code_is_found(tmp_path):
    (tmp_path / "job.py").write_text("import sys\ndef f():\n    return 75\nsys.exit(73)\n", encoding="utf-8")
    assert exit_literals(tmp_path) == ["job.py:3", "job.py:4"]


def test_every_old_path_is_the_new_module_with_a_warning():
    from armorlab._moved import MOVED

    for old, new in MOVED.items():
        sys.modules.pop(old, None)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            module = importlib.import_module(old)
        assert module is importlib.import_module(new), old
        assert module.__spec__.name == new and module.__name__ == new
        messages = [str(w.message) for w in caught if issubclass(w.category, DeprecationWarning)]
        assert any(old in m and new in m for m in messages), (old, messages)
        assert caught[0].filename == __file__  # the warning points at the import, not at importlib


def test_old_paths_keep_names_users_import():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        from armorlab.config import resolve
        from armorlab.objectives import mixed_ratio, policy_loss
        from armorlab.trainer import ArmorLabTrainer
    from armorlab.algos.loss import policy_loss as new_loss
    from armorlab.core.config import resolve as new_resolve
    from armorlab.train.trainer import ArmorLabTrainer as new_trainer

    assert (resolve, policy_loss, ArmorLabTrainer) == (new_resolve, new_loss, new_trainer)
    assert callable(mixed_ratio)


def test_a_pickle_naming_an_old_path_loads():
    import pickle

    # what a job queued by armorlab 0.1 holds: a reference to armorlab.sweeps.vllm_servers.ServerSet
    from armorlab.vllm.servers import ServerSet

    data = pickle.dumps(ServerSet, protocol=0).replace(b"armorlab.vllm.servers", b"armorlab.sweeps.vllm_servers")
    assert b"armorlab.sweeps.vllm_servers" in data
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        assert pickle.loads(data) is ServerSet


def test_public_api_is_lazy():
    code = ("import sys, armorlab\nfrom armorlab import ArmorLabConfig, ArmorLabTrainer, policy_loss, resolve\n"
            "print(armorlab.ArmorLabTrainer.__module__, 'torch' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["armorlab.train.trainer", "True"]
    code = "import sys\nfrom armorlab import resolve, RunDir, ArmorLabError\nprint('torch' in sys.modules)\n"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_old_paths_go_away_at_0_3():
    # the promise in armorlab._moved: one release of grace, then the finder and its table are deleted
    import armorlab
    from armorlab._moved import MOVED

    major, minor = (int(x) for x in armorlab.__version__.split(".")[:2])
    assert (major, minor) < (0, 3) or not MOVED, f"armorlab {armorlab.__version__} still maps {len(MOVED)} old paths"

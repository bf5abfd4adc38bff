import subprocess
import sys


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "armorlab.cli", *args], capture_output=True, text=True)


def test_version_and_help():
    from armorlab import __version__

    out = run_cli("--version")
    assert out.returncode == 0 and out.stdout.strip() == f"armorlab {__version__}"
    help_ = run_cli("--help")
    assert help_.returncode == 0 and "train" in help_.stdout


def test_help_does_not_import_torch_or_trl():
    code = ("import sys\nfrom armorlab.cli import app\n"
            "bad=[m for m in ('torch','trl','transformers','optuna','pandas','matplotlib') if m in sys.modules]\n"
            "print(','.join(bad))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_user_error_exits_2_without_traceback(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("objective: ppo\n")
    out = run_cli("train", str(bad), "--out", str(tmp_path / "runs"))
    assert out.returncode == 2
    assert "Traceback" not in out.stderr
    assert "'objective'" in out.stderr and "'ppo'" in out.stderr and "bad.yaml" in out.stderr


def test_plain_parameters_are_coerced_without_pydantic(tmp_path):
    """armorlab.commands.coercion: plain values skip typer's pydantic adapters, with the same
    errors; a constrained parameter (min=) still goes through typer's own checks."""
    spec = tmp_path / "s.yaml"
    spec.write_text("name: s\nbase: {max_steps: 2}\ngrid: {seed: [0, 1]}\n")
    code = ("import sys, io, contextlib\nimport armorlab.cli\n"
            f"sys.argv = ['armorlab', 'sweep', {str(spec)!r}, '--root', {str(tmp_path / 'runs')!r}, "
            "'--workers', '3', '--dry-run']\n"
            "with contextlib.redirect_stdout(io.StringIO()) as out:\n"
            "    try:\n        armorlab.cli.main()\n    except SystemExit as exc:\n        rc = exc.code\n"
            "print(rc, 'pydantic' in sys.modules, '2 to run' in out.getvalue())\n")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert res.stdout.split() == ["0", "False", "True"], res.stdout + res.stderr
    bad = run_cli("sweep", str(spec), "--workers", "three", "--dry-run")
    assert bad.returncode == 2 and "Invalid value for '--workers'" in bad.stderr
    assert "valid integer" in bad.stderr and "Traceback" not in bad.stderr
    bad = run_cli("status", str(tmp_path), "--interval", "soon")
    assert bad.returncode == 2 and "valid number" in bad.stderr
    low = run_cli("check-task", str(spec), "--rows", "0")
    assert low.returncode == 2 and "--rows" in low.stderr and "Traceback" not in low.stderr

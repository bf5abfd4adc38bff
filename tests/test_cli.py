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

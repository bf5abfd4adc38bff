"""benchmarks/gpu/acceptance.py in its CPU mode (tiny shapes): every part runs and says PASS (vLLM's
part SKIPs where vLLM is not installed), and the summary is one ``name=value`` line per fact."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu" / "acceptance.py"


def _run(out: Path, *args: str, timeout: float) -> tuple[subprocess.CompletedProcess, dict[str, str]]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SCRIPT.parents[2]), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, str(SCRIPT), "--cpu", "--out", str(out), *args], capture_output=True,
                          text=True, timeout=timeout, env=env)
    summary = dict(line.split("=", 1) for line in (out / "summary.txt").read_text().splitlines())
    return proc, summary


def test_cpu_mode_runs_every_part(tmp_path):
    proc, s = _run(tmp_path, timeout=1800)
    assert proc.returncode == 0, (s, (tmp_path / "log_tails.txt").read_text()[-3000:])
    assert s["result"] == "PASS" and s["mode"] == "cpu" and s["trl"] == "1.16.0"
    assert int(s["model_params"]) > 0 and s["model_vocab"] == "600"  # the byte-level BPE trained in code
    # (a) π_ref = the policy after both resets: weights and eval-path log-probs exactly, fp32 heads on both
    assert s["a_status"] == "PASS" and s["a_resets"] == "2"
    for step in (1, 2):
        assert s[f"a_reset{step}_weight_max_abs_diff"] == "0" and s[f"a_reset{step}_eval_logp_max_abs_diff"] == "0"
        assert s[f"a_reset{step}_lm_head_dtypes"] == "torch.float32/torch.float32"
    # (b) both engines, or a SKIP that says why
    if importlib.util.find_spec("vllm") is None:
        assert s["b_status"] == "SKIP" and "not installed" in s["b_why"]
    else:
        assert s["b_status"] == "PASS"
    # (c) resets under accelerate (unsharded on CPU, said so)
    assert s["c_status"] == "PASS" and s["c_reset1_equal"] == s["c_reset2_equal"] == "True"
    assert s["c_fsdp"] == "False" and "only on GPUs" in s["c_note"]
    # (d) the three trainers' throughput and ratios against stock TRL dapo at β = 0
    assert s["d_status"] == "PASS"
    for name in ("armorlab_dapo", "armorlab_armor"):
        assert float(s[f"d_{name}_ratio_vs_stock_dapo"]) > 0 and float(s[f"d_{name}_tokens_per_s"]) > 0
    assert float(s["d_armorlab_armor_reference_draws_s"]) > 0 == float(s["d_stock_dapo_reference_draws_s"])
    assert (tmp_path / "log_tails.txt").read_text().count("==> ") == 4


def test_a_spent_budget_skips_parts_instead_of_overrunning(tmp_path):
    proc, s = _run(tmp_path, "--parts", "a", "--budget", "20", timeout=600)
    assert proc.returncode == 0
    assert s["a_status"].startswith("SKIP (budget spent") and "b_status" not in s and s["result"] == "PASS"

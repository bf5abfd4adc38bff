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
    proc, s = _run(tmp_path, timeout=600)  # ≈ 46 s here (2 shared cores): a smoke run, not a benchmark
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
    # the gather count is wired to the anchor draws and π_ref's forward (0 gathers unsharded; ≤ layers + 1 on GPU)
    assert int(s["c_draw_calls"]) >= 1 and int(s["c_forward_calls"]) >= 1 and s["c_gathers_per_call_limit"] == "3"
    # (d) the three trainers' throughput and ratios against stock TRL dapo at β = 0
    assert s["d_status"] == "PASS"
    for name in ("armorlab_dapo", "armorlab_armor"):
        assert float(s[f"d_{name}_ratio_vs_stock_dapo"]) > 0 and float(s[f"d_{name}_tokens_per_s"]) > 0
    assert float(s["d_armorlab_armor_reference_draws_s"]) > 0 == float(s["d_stock_dapo_reference_draws_s"])
    # the plan's peak for each armorlab config is computed (compared with the GPU's peak there)
    assert float(s["d_armorlab_armor_plan_peak_gib"]) > 0 and s["d_armorlab_armor_peak_gib"] == "None"
    assert (tmp_path / "log_tails.txt").read_text().count("==> ") == 4
    # the node's versions read before any import; nothing large under OUT (model, runs, site, logs: WORK)
    assert s["node_torch"] != "absent" and s["wheels"] == "none" and s["wheel_requirements_broken"] == "none"
    entries = list(tmp_path.iterdir())
    assert all(p.is_file() and p.stat().st_size < 1 << 20 for p in entries), entries
    assert not s["work"].startswith(str(tmp_path))


def test_a_spent_budget_skips_parts_instead_of_overrunning(tmp_path):
    proc, s = _run(tmp_path, "--parts", "a", "--budget", "20", timeout=600)
    assert proc.returncode == 0
    assert s["a_status"].startswith("SKIP (budget spent") and "b_status" not in s and s["result"] == "PASS"


def _wheel(folder: Path, name: str, requires: list[str]) -> None:
    import zipfile

    meta = "Metadata-Version: 2.1\nName: x\nVersion: 1\n" + "".join(f"Requires-Dist: {r}\n" for r in requires)
    with zipfile.ZipFile(folder / f"{name}-1.0-py3-none-any.whl", "w") as z:
        z.writestr(f"{name}-1.0.dist-info/METADATA", meta)
        z.writestr(f"{name}/payload.bin", os.urandom(3 << 19))  # 1.5 MiB, stored as is


def test_preflight_names_the_wheels_their_size_and_what_the_node_breaks(tmp_path, monkeypatch):
    """Before any import: a carried wheel that wants a newer pyarrow (or torch) than the node has is
    named with both versions; markers for extras are not requirements; over the size limit is said."""
    import importlib.util
    from importlib import metadata

    spec = importlib.util.spec_from_file_location("acceptance", SCRIPT)
    acc = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(acc)
    _wheel(tmp_path, "datasets", ["pyarrow>=999", "torch>=0.1", 'numpy>=999; extra == "dev"'])
    lines: dict = {}
    acc.preflight(tmp_path, lines)
    assert lines["wheels"] == "datasets-1.0-py3-none-any.whl" and "wheels_over_limit" not in lines
    assert lines["wheel_requirements_broken"] == f"datasets wants pyarrow>=999 (node: {metadata.version('pyarrow')})"
    assert lines["node_torch"] == metadata.version("torch")
    assert 1.5 <= lines["wheels_mib"] < 1.6
    monkeypatch.setattr(acc, "WHEELS_MIB", 1)
    acc.preflight(tmp_path, lines)
    assert lines["wheels_over_limit"] == f"{lines['wheels_mib']} MiB > 1 MiB"

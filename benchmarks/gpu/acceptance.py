"""armorlab's GPU acceptance run: one command, ≤ 8 minutes on one CUDA GPU of ≥ 40 GB (an H200, an
H100), no network. See benchmarks/gpu/README.md.

    python benchmarks/gpu/acceptance.py --out OUT [--wheels DIR] [--budget 450]
    python benchmarks/gpu/acceptance.py --cpu --out OUT          # tiny shapes, CI (tests/test_gpu_acceptance.py)

It installs what the machine lacks (TRL, datasets, ...) from the wheel folder ``--wheels`` (no
index), builds a random-init ≈ 0.5 B Qwen2 and a byte-level BPE tokenizer in code, then runs the
parts, riskiest first, each in its own process under what is left of ``--budget`` seconds:

(a) bf16 ArmorLabTrainer, anchors + gate + r_mix + β ≠ 0 + gradient checkpointing: π_ref equals
    the policy after each reset (weights and eval-path log-probs, exactly);
(b) both colocated vLLM engines, a push at each reset (engine vs HF log-probs stale before it,
    equal after); SKIP where vLLM is not installed;
(c) FSDP 2 on one GPU (accelerate, slurm/accelerate-fsdp2.yaml) with a reset every step;
(d) tokens/s of armorlab dapo and armor against stock TRL dapo at β = 0.

It writes ``OUT/summary.txt``: one ``name=value`` line per fact (machine, versions, each part's
status and figures), ``OUT/log_tails.txt`` (the last lines of each part's log) and the parts' JSON.
Exit status 0 when no part failed (SKIP is not a failure).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
# module → what provides it (the wheel folder must hold these where the machine lacks them)
NEEDED = {"trl": "trl==1.16.0", "datasets": "datasets", "dill": "dill", "multiprocess": "multiprocess",
          "xxhash": "xxhash", "array_api_compat": "array-api-compat", "yaml": "pyyaml", "rich": "rich",
          "filelock": "filelock", "scipy": "scipy"}
PARTS = [  # (name, script, seconds it may take at most on GPU, on CPU)
    ("a", "part_a.py", 120, 240),
    ("b", "part_b.py", 200, 300),
    ("c", "part_c.py", 90, 240),
    ("d", "part_d.py", 150, 300),
]


def missing_modules() -> list[str]:
    return [m for m in NEEDED if importlib.util.find_spec(m) is None]


WHEELS_MIB = 64  # what a device call may carry beside the source tree
NODE_PACKAGES = ("torch", "transformers", "accelerate", "tokenizers", "safetensors", "pyarrow", "numpy", "packaging")


def preflight(wheels: Path | None, lines: dict) -> None:
    """Before anything is imported: the versions this node has (package metadata only), the carried
    wheels (names, total MiB against the limit) and each wheel's requirements that the node's
    versions break (e.g. datasets wanting a newer pyarrow), so a failure later reads as its cause."""
    from importlib import metadata

    from packaging.requirements import Requirement

    have = {}
    for name in NODE_PACKAGES:
        try:
            have[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            have[name] = None
        lines[f"node_{name}"] = have[name] or "absent"
    found = sorted(wheels.glob("*.whl")) if wheels is not None else []
    lines["wheels"] = ",".join(w.name for w in found) or "none"
    lines["wheels_mib"] = round(sum(w.stat().st_size for w in found) / 2**20, 2)
    if lines["wheels_mib"] > WHEELS_MIB:
        lines["wheels_over_limit"] = f"{lines['wheels_mib']} MiB > {WHEELS_MIB} MiB"
    broken = []
    for wheel in found:
        with zipfile.ZipFile(wheel) as z:
            meta = next((n for n in z.namelist() if n.endswith(".dist-info/METADATA")), None)
            text = z.read(meta).decode() if meta else ""
        for line in text.splitlines():
            if not line.startswith("Requires-Dist:"):
                continue
            req = Requirement(line.split(":", 1)[1].strip())
            if req.marker is not None and not req.marker.evaluate({"extra": ""}):
                continue
            version = have.get(req.name.lower())
            if version is not None and req.specifier and not req.specifier.contains(version, prereleases=True):
                broken.append(f"{wheel.name.split('-')[0]} wants {req} (node: {version})")
    lines["wheel_requirements_broken"] = "; ".join(broken) or "none"


def install(wheels: Path | None, site: Path, lines: dict) -> None:
    """pip-install every wheel of ``wheels`` into ``site`` (no index, no dependency resolution) when
    a needed module is missing; the parts then find them first on PYTHONPATH."""
    missing = missing_modules()
    lines["missing_before_install"] = ",".join(missing) or "none"
    if not missing:
        return
    if wheels is None or not any(wheels.glob("*.whl")):
        lines["install"] = f"no wheel folder given for {','.join(missing)}"
        return
    cmd = [sys.executable, "-m", "pip", "install", "--no-index", "--no-deps", "--quiet", "--target", str(site),
           *map(str, sorted(wheels.glob("*.whl")))]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    lines["install"] = "ok" if proc.returncode == 0 else f"failed: {proc.stderr.strip().splitlines()[-1:]}"


def machine(lines: dict, cpu: bool) -> None:
    import torch

    lines["python"] = platform.python_version()
    lines["torch"] = torch.__version__
    for mod in ("transformers", "accelerate", "trl", "datasets", "vllm"):
        try:
            lines[mod] = __import__(mod).__version__
        except Exception as exc:  # noqa: BLE001 - reported, not raised
            lines[mod] = f"absent ({type(exc).__name__})"
    if torch.cuda.is_available() and not cpu:
        props = torch.cuda.get_device_properties(0)
        lines["gpu"] = props.name
        lines["gpu_memory_gib"] = round(props.total_memory / 2**30, 1)
    else:
        lines["gpu"] = "none (CPU mode)" if cpu else "none"
    lines["cpus"] = os.cpu_count()


def flatten(part: str, result: dict, lines: dict) -> None:
    for key, value in result.items():
        if isinstance(value, float):
            value = f"{value:.6g}"
        lines[f"{part}_{key}"] = value


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="where the small result files go (summary.txt, "
                        "log_tails.txt, one JSON per part)")
    parser.add_argument("--work", type=Path, help="model, runs, installed wheels, full logs (default: a new "
                        "folder under the temp dir, never under --out)")
    parser.add_argument("--wheels", type=Path, help="wheel folder for what the machine lacks (pip --no-index)")
    parser.add_argument("--budget", type=float, help="seconds for everything (default 450 on GPU, 1200 with --cpu)")
    parser.add_argument("--cpu", action="store_true", help="tiny shapes on the CPU (CI)")
    parser.add_argument("--parts", default="abcd", help="which parts to run, e.g. ad")
    opts = parser.parse_args()
    started = time.monotonic()
    budget = opts.budget or (1200.0 if opts.cpu else 450.0)
    out = opts.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    work = (opts.work or Path(tempfile.mkdtemp(prefix="armorlab-accept-"))).resolve()
    logs = work / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    lines: dict = {"mode": "cpu" if opts.cpu else "gpu", "budget_s": budget, "work": str(work)}
    preflight(opts.wheels, lines)
    site = work / "site"
    install(opts.wheels, site, lines)
    env = {**os.environ, "ARMORLAB_ACCEPT_OUT": str(out), "ARMORLAB_ACCEPT_WORK": str(work),
           "ARMORLAB_ACCEPT_CPU": "1" if opts.cpu else "0",
           "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "HF_HUB_DISABLE_TELEMETRY": "1",
           "TOKENIZERS_PARALLELISM": "false", "PYTHONUNBUFFERED": "1", "TRANSFORMERS_NO_ADVISORY_WARNINGS": "1",
           "PYTHONPATH": os.pathsep.join(p for p in (str(site), str(ROOT), str(HERE), os.environ.get("PYTHONPATH"))
                                         if p)}
    if opts.cpu:
        env.setdefault("OMP_NUM_THREADS", "2")
    sys.path[:0] = [str(site), str(ROOT), str(HERE)]
    machine(lines, opts.cpu)
    build = subprocess.run([sys.executable, "-c", "import json, common; print(json.dumps(common.build_model()))"],
                           capture_output=True, text=True, env=env, cwd=str(HERE))
    if build.returncode != 0:
        lines["model"] = "FAIL: " + (build.stderr.strip().splitlines() or ["?"])[-1]
        return finish(out, lines, started, failed=True)
    flatten("model", json.loads(build.stdout.strip().splitlines()[-1]), lines)
    failed = False
    tails = []
    for name, script, gpu_cap, cpu_cap in PARTS:
        if name not in opts.parts:
            continue
        left = budget - (time.monotonic() - started)
        if left < 30:
            lines[f"{name}_status"] = f"SKIP (budget spent: {left:.0f} s left)"
            continue
        cmd = [sys.executable, str(HERE / script)]
        if name == "c" and not opts.cpu:  # accelerate's FSDP 2 on one process (FSDP needs a GPU)
            cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file",
                   str(ROOT / "slurm" / "accelerate-fsdp2.yaml"), "--num_processes", "1", str(HERE / script)]
        timeout = min(cpu_cap if opts.cpu else gpu_cap, left - 10)
        t = time.monotonic()
        log = logs / f"{name}.log"
        try:
            with log.open("w") as fh:
                proc = subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT, env=env, cwd=str(HERE), timeout=timeout)
            code = proc.returncode
        except subprocess.TimeoutExpired:
            code = "timeout"
        lines[f"{name}_seconds"] = round(time.monotonic() - t, 1)
        result_file = out / f"{name}.json"
        if code == 0 and result_file.is_file():
            flatten(name, json.loads(result_file.read_text()), lines)
        else:
            lines[f"{name}_status"] = f"FAIL (exit {code})"
        failed |= str(lines.get(f"{name}_status", "")).startswith("FAIL")
        text = log.read_text(errors="replace").splitlines()
        tails.append(f"==> {name} ({script}, exit {code})\n" + "\n".join(text[-30:]))
    (out / "log_tails.txt").write_text("\n\n".join(tails) + "\n")
    return finish(out, lines, started, failed)


def finish(out: Path, lines: dict, started: float, failed: bool) -> int:
    lines["total_s"] = round(time.monotonic() - started, 1)
    lines["result"] = "FAIL" if failed else "PASS"
    text = "".join(f"{k}={str(v).replace(chr(10), ' ')}\n" for k, v in lines.items())
    (out / "summary.txt").write_text(text)
    print(text, end="")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

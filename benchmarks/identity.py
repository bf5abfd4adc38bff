"""Cost of fingerprinting the model and data in a sweep's run ids (armorlab/core/identity.py).

Expands a 1,000-run spec (100 grid points × 10 seeds) twice, side by side: on the tiny model and
arithmetic (no fingerprint: the peer), and on a "15 GB checkpoint" (a sparse weights file next to
its config and tokenizer) with a math JSONL file. Then times `armorlab sweep --dry-run` of the
real-model spec in a fresh process (target ≤ 1 s, as for the tiny model) and checks that
expanding imported neither torch nor transformers. Last line: ``ratio=<real/tiny expand time>``.

    .venv/bin/python benchmarks/identity.py
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

GRID = {"learning_rate": [round(1e-6 * (i + 1), 8) for i in range(10)],
        "epsilon_high": [round(0.21 + 0.01 * i, 2) for i in range(10)]}


def make_checkpoint(path: Path, weights_bytes: int) -> Path:
    path.mkdir()
    (path / "config.json").write_text(json.dumps({"model_type": "qwen2", "hidden_size": 3584}))
    (path / "tokenizer.json").write_text(json.dumps({"model": {"vocab": {f"t{i}": i for i in range(150_000)}}}))
    (path / "tokenizer_config.json").write_text(json.dumps({"chat_template": "{{ messages }}"}))
    for i in range(4):  # four shards, sparse: a stat costs the same as for real weights
        with open(path / f"model-0000{i + 1}-of-00004.safetensors", "wb") as fh:
            fh.truncate(weights_bytes // 4)
    return path


def spec(path: Path, base: dict) -> Path:
    path.write_text(yaml.safe_dump({"name": path.stem, "base": base, "grid": GRID, "seeds": list(range(10))}))
    return path


def time_expand(spec_path: Path, repeats: int = 5) -> float:
    from armorlab.sweeps.spec import expand, load_spec

    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        plans = expand(load_spec(spec_path))
        times.append(time.perf_counter() - t0)
        assert len(plans) == 1000, len(plans)
    return statistics.median(times)


def main() -> None:
    work = Path(tempfile.mkdtemp(prefix="armorlab-identity-"))
    try:
        run(work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def run(work: Path) -> None:
    model = make_checkpoint(work / "model", 15 * 1024**3)
    data = work / "math.jsonl"
    data.write_text("".join(json.dumps({"problem": f"What is {i}+{i}?", "answer": str(2 * i)}) + "\n"
                            for i in range(20_000)))
    tiny = spec(work / "tiny.yaml", {"objective": "dapo", "max_steps": 1})
    real = spec(work / "real.yaml", {"objective": "dapo", "max_steps": 1, "model": str(model),
                                     "task": {"name": "math", "path": str(data)}})
    # alternate, so a busy machine slows both alike
    tiny_s, real_s = [], []
    for _ in range(3):
        tiny_s.append(time_expand(tiny))
        real_s.append(time_expand(real))
    heavy = sorted(m for m in ("torch", "transformers", "trl") if m in sys.modules)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    fresh: dict[str, list[float]] = {"tiny": [], "real": []}
    for _ in range(3):
        for name, path in (("tiny", tiny), ("real", real)):
            t0 = time.perf_counter()
            out = subprocess.run([sys.executable, "-m", "armorlab.cli", "sweep", str(path), "--root",
                                  str(work / "runs"), "--dry-run"], capture_output=True, text=True, env=env)
            fresh[name].append(time.perf_counter() - t0)
            if out.returncode != 0:
                sys.exit(out.stderr)
    print("runs=1000 weights_gb=15 data_rows=20000")
    print(f"heavy_modules_imported={','.join(heavy) or 'none'}")
    print(f"expand_tiny_s={statistics.median(tiny_s):.3f}")
    print(f"expand_real_s={statistics.median(real_s):.3f}")
    print(f"expand_ratio={statistics.median(real_s) / statistics.median(tiny_s):.2f}")
    print(f"dry_run_tiny_s={statistics.median(fresh['tiny']):.3f}")
    print(f"dry_run_real_s={statistics.median(fresh['real']):.3f}")
    print(f"ratio={statistics.median(fresh['real']) / statistics.median(fresh['tiny']):.2f}")

if __name__ == "__main__":
    main()

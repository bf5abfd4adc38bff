#!/usr/bin/env python
"""The report's first screen in headless Chromium: a synthetic sweep shaped like the demo's,
its report, screenshots at a window size and measurements taken from the page's DOM.

    PYTHONPATH=$PWD .venv/bin/python tools/report_screen.py OUT [--width 1400 --height 900]
        [--seeds 3] [--groups 4]

writes OUT/runs/demo/<run-id>/ (the four demo arms × seeds, written directly as run dirs: no
training), OUT/report-demo/ (the report `armorlab demo` writes: its recipe, headline and
names) and OUT/report-cli/ (what `armorlab report OUT/runs/demo` writes), a screenshot of each
(``first-screen.png`` at the window size, ``page.png`` of the page's whole height) and prints the
measurements as JSON (tests/test_report_screen.py checks them).

Measurements (``measure``): the window's inner size (Chromium's headless window keeps part of
its height for a frame, so the fold is the height asked for, not the inner height; the width
sets the layout and is the inner width), the page's scroll width against its client
width (a page wider than the window scrolls sideways), the boxes of the verdict table and of
the first figure (``id="verdict-table"``, ``id="first-figure"``, whether the image loaded), every
element that reaches past the right edge of the page outside a scrolling box, and for every
table whether it fits its box or scrolls inside it with a first column that stays in place.
They are taken by a script added to a copy of index.html (the report itself has none), which
writes them as JSON into the page; Chromium's ``--dump-dom`` prints the page after it loaded.
Offline: Chromium is started with every background download and update off.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
from datetime import datetime, timedelta, timezone
from pathlib import Path

import numpy as np
import pandas as pd

from armorlab.core.config import resolve
from armorlab.core.fsutil import atomic_write_json
from armorlab.core.runs import RunDir

STEPS = 120
EVAL_EVERY = 5
VAL_N, TEST_N = 400, 100
# (name, demo spec point, mean held-out accuracy curve parameters: peak level, step of peak, final level)
ARMS = [
    ("dapo", {"objective": "dapo"}, (0.81, 30, 0.64)),
    ("armor (π_ref = peak)", {"objective": "armor", "ref_reset_steps": 0}, (0.82, 45, 0.78)),
    ("armor (π_ref = warm start)", {"objective": "armor", "ref_reset_steps": 0, "ref_from": "model"},
     (0.82, 40, 0.74)),
    ("dapo + KL", {"objective": "dapo", "beta": 1.0, "ref_from": "model"}, (0.80, 35, 0.70)),
    ("up", {"objective": "up"}, (0.82, 25, 0.56)),   # beyond the demo's four: a 5-group page
]
EXTRA_ALPHAS = (0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.99)   # --groups above 5: ARMOR at other α
CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--disable-default-apps", "--disable-extensions", "--mute-audio", "--hide-scrollbars",
                  "--force-device-scale-factor=1", "--run-all-compositor-stages-before-draw")


def demo_base() -> dict:
    """The packaged demo spec's base (armorlab/demo.yaml): the configs the demo resolves."""
    from armorlab.commands.demo import DEMO_SPEC
    from armorlab.core.config import load_yaml_mapping

    return dict(load_yaml_mapping(DEMO_SPEC)["base"])


def _val_curve(t: np.ndarray, peak: float, at: int, final: float, start: float = 0.75) -> np.ndarray:
    """Rise from ``start`` to ``peak`` at step ``at``, then a linear fall to ``final`` at STEPS."""
    rise = start + (peak - start) * np.minimum(t / at, 1.0)
    fall = np.clip((t - at) / (STEPS - at), 0.0, 1.0) * (peak - final)
    return rise - fall


def write_sweep(root: Path, *, seeds: int = 3, groups: int = 4, seed: int = 0) -> list[Path]:
    """The demo's arms (then ARMOR at other α for ``groups`` > 5) × ``seeds``, as completed run
    dirs under ``root``: val/test accuracy (sampled and greedy) every EVAL_EVERY steps with binomial noise of
    VAL_N/TEST_N completions, train reward and entropy every step, the KL estimators (one
    seed of one arm with a spike of the reverse estimator, which makes its CI wide), the exact
    KL probe, anchor metrics where anchors or the gate are on, and a status with run times."""
    rng = np.random.default_rng(seed)
    base = demo_base()
    arms = list(ARMS)
    for alpha in EXTRA_ALPHAS[:max(0, groups - len(ARMS))]:
        arms.append((f"armor α={alpha}", {"objective": "armor", "alpha": alpha, "ref_reset_steps": 40},
                     (0.81, 40, 0.62 + 0.2 * alpha)))
    arms = arms[:groups]
    t = np.arange(STEPS + 1, dtype=np.float64)
    started = datetime(2026, 1, 1, tzinfo=timezone.utc)
    dirs = []
    for a, (_, point, shape) in enumerate(arms):
        anchors = point.get("objective") == "armor" or point.get("anchor_gate")
        for s in range(seeds):
            cfg = resolve({**base, **point, "seed": s})
            rd = RunDir.create(root, cfg)
            peak, at, final = shape
            level = _val_curve(t, peak + rng.normal(0, 0.01), at, final + rng.normal(0, 0.03))
            reward = 0.6 + 0.35 * (1 - np.exp(-t / 40)) + rng.normal(0, 0.02, t.size)
            rev = 0.02 * t * (1 + 0.5 * a) + np.abs(rng.normal(0, 0.3, t.size))
            if a == 1 and s == 0:  # one seed's estimator spikes: its group's CI is wide there
                rev[60:66] += 40.0
            lines = []
            for i in range(t.size):
                step = int(t[i])
                row: dict[str, float] = {}
                if step:
                    row.update({"train/reward": float(np.clip(reward[i], 0, 1)),
                                "train/entropy": float(0.9 * np.exp(-t[i] / 80) + 0.05),
                                "kl/reverse_k3": float(rev[i])})
                    if anchors:
                        row.update({"kl/forward_k3": float(0.03 * t[i] + abs(rng.normal(0, 0.3))),
                                    "anchor/rate": float(0.8 + rng.normal(0, 0.02)),
                                    "anchor/gate_drop": float(0.2 + rng.normal(0, 0.02))})
                if step % EVAL_EVERY == 0:
                    row.update({"val/acc": rng.binomial(VAL_N, level[i]) / VAL_N, "val/n": float(VAL_N),
                                "test/acc": rng.binomial(TEST_N, level[i] - 0.02) / TEST_N,
                                "test/n": float(TEST_N),
                                "val/acc_greedy": rng.binomial(VAL_N, level[i] + 0.03) / VAL_N,
                                "val/n_greedy": float(VAL_N),
                                "test/acc_greedy": rng.binomial(TEST_N, level[i]) / TEST_N,
                                "kl/exact_reverse": float(0.018 * t[i] * (1 + 0.5 * a)),
                                "kl/exact_forward": float(0.025 * t[i] * (1 + 0.3 * a))})
                # one rollout per step: the demo's recipe counts in rollouts
                lines.append(json.dumps({"step": step, "rollout": step, **row}, separators=(",", ":")))
            rd.metrics_path.write_text("\n".join(lines) + "\n")
            begin = started + timedelta(hours=a + s / 10)
            atomic_write_json(rd.status_path, {
                "state": "completed", "reason": None, "attempt": 1, "job_id": None,
                "started": begin.isoformat(timespec="seconds"),
                "ended": (begin + timedelta(minutes=9 + a)).isoformat(timespec="seconds")}, durable=False)
            if s == 0:
                _write_tokens(rd, rng)
            dirs.append(rd.path)
    return dirs


def _write_tokens(rd: RunDir, rng: np.random.Generator, n: int = 400) -> None:
    old = np.log(rng.uniform(0.05, 1.0, n))
    rd.tokens_dir.mkdir(exist_ok=True)
    pd.DataFrame({"logp": old + rng.normal(0, 0.05, n), "old_logp": old, "ref_logp": old + rng.normal(0, 0.2, n),
                  "advantage": rng.normal(size=n), "is_anchor": np.arange(n) % 8 == 0,
                  "step": np.zeros(n, dtype=int)}).to_parquet(rd.tokens_dir / "s0.parquet")


def demo_report(run_dirs: list[Path], out: Path):
    """What `armorlab demo` writes after training (its recipe, headline section and names)."""
    from armorlab.analysis.report import build_report
    from armorlab.commands.demo import demo_recipe, group_names, headline_section

    return build_report(demo_recipe(run_dirs), out, cache=False, lead=headline_section({}), names=group_names)


def cli_report(inputs: list[Path], out: Path):
    """What `armorlab report INPUTS --out OUT` writes (default recipe, automatic groups)."""
    from armorlab.analysis.recipe import recipe_for_paths
    from armorlab.analysis.report import build_report

    return build_report(recipe_for_paths([str(p) for p in inputs]), out, cache=False)


# --------------------------------------------------------------------------- Chromium
def chromium() -> str | None:
    """The Chromium binary (``ARMORLAB_CHROMIUM``, else chromium / chromium-browser on PATH)."""
    for name in (os.environ.get("ARMORLAB_CHROMIUM"), "chromium", "chromium-browser", "google-chrome"):
        if name and (found := shutil.which(name)):
            return found
    return None


def _run(args: list[str], timeout: float) -> str:
    binary = chromium()
    if binary is None:
        raise RuntimeError("no chromium on PATH (apt-get install chromium)")
    with tempfile.TemporaryDirectory(prefix="armorlab-chromium-") as profile:
        proc = subprocess.run([binary, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *args],
                              capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    if proc.returncode != 0:
        raise RuntimeError(f"chromium exited {proc.returncode}: {proc.stderr[-2000:]}")
    return proc.stdout


def screenshot(index: Path, png: Path, width: int = 1400, height: int = 900, *, timeout: float = 120) -> Path:
    """The window of ``width``×``height`` CSS pixels at the page's top, as a PNG."""
    png = png.resolve()
    _run([f"--window-size={width},{height}", f"--screenshot={png}", "--virtual-time-budget=5000",
          index.resolve().as_uri()], timeout)
    if not png.is_file():
        raise RuntimeError(f"chromium wrote no screenshot to {png}")
    return png


PROBE = r"""
<script>
window.addEventListener("load", () => {
  const box = (el) => { if (!el) return null; const r = el.getBoundingClientRect();
    return {top: r.top + scrollY, bottom: r.bottom + scrollY, left: r.left, right: r.right,
            width: r.width, height: r.height}; };
  const doc = document.documentElement;
  const scrolls = (el) => { for (let p = el.parentElement; p; p = p.parentElement) {
      const o = getComputedStyle(p).overflowX; if (o === "auto" || o === "scroll" || o === "hidden") return true; }
    return false; };
  const past = [];
  for (const el of document.body.querySelectorAll("*")) {
    const r = el.getBoundingClientRect();
    if (r.width && r.right > doc.clientWidth + 0.5 && !scrolls(el))
      past.push(el.tagName.toLowerCase() + (el.id ? "#" + el.id : "") + " right=" + Math.round(r.right));
  }
  const tables = [...document.querySelectorAll("table")].map((t) => {
    const holder = t.parentElement;
    const cell = t.querySelector("tr > :first-child");
    return {id: t.id || null, caption: (t.closest("section") || {}).id || null,
            fits: holder.scrollWidth <= holder.clientWidth + 1 && box(t).right <= doc.clientWidth + 0.5,
            scrolls: ["auto", "scroll"].includes(getComputedStyle(holder).overflowX),
            sticky_first_column: !!cell && getComputedStyle(cell).position === "sticky",
            width: t.scrollWidth, box: box(holder)};
  });
  const img = document.getElementById("first-figure");
  const out = {inner: [innerWidth, innerHeight], client_width: doc.clientWidth, scroll_width: doc.scrollWidth,
    scroll_height: doc.scrollHeight,
    verdict_table: box(document.getElementById("verdict-table")),
    answer: box(document.getElementById("answer")),
    answer_text: (document.getElementById("answer") || {}).textContent || null,
    first_figure: box(img), first_figure_loaded: !!img && img.complete && img.naturalWidth > 0,
    first_figure_src: img ? img.getAttribute("data-file") : null,
    first_figure_embedded: !!img && img.getAttribute("src").startsWith("data:image/png;base64,"),
    fold: __FOLD__,
    headings_above_fold: [...document.querySelectorAll("h1, h2")].filter((h) => box(h).top < __FOLD__)
      .map((h) => h.textContent),
    past_right_edge: past.slice(0, 20), tables};
  const pre = document.createElement("pre"); pre.id = "armorlab-probe";
  pre.textContent = JSON.stringify(out); document.body.appendChild(pre);
});
</script>
"""


def measure(index: Path, width: int = 1400, height: int = 900, *, timeout: float = 120) -> dict:
    """The measurements of the module docstring, for ``index`` in a window of width×height."""
    probe = index.with_name(".probe-" + index.name)   # beside it: the figures' relative paths hold
    text = index.read_text(encoding="utf-8")
    script = PROBE.replace("__FOLD__", str(int(height)))
    probe.write_text(text.replace("</body>", script + "</body>", 1), encoding="utf-8")
    try:
        dom = _run([f"--window-size={width},{height}", "--virtual-time-budget=5000", "--dump-dom",
                    probe.resolve().as_uri()], timeout)
    finally:
        probe.unlink(missing_ok=True)
    found = re.search(r'<pre id="armorlab-probe">(.*?)</pre>', dom, re.S)
    if not found:
        raise RuntimeError("the page's probe wrote nothing (did the page load?)")
    import html

    return json.loads(html.unescape(found.group(1)))


def page_height(m: dict) -> int:
    return int(math.ceil(max(m["scroll_height"], m["inner"][1])))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out", type=Path)
    p.add_argument("--width", type=int, default=1400)
    p.add_argument("--height", type=int, default=900)
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--groups", type=int, default=4)
    args = p.parse_args(argv)
    out = args.out
    sweep = out / "runs" / "demo"
    if sweep.exists():
        shutil.rmtree(sweep)
    dirs = write_sweep(sweep, seeds=args.seeds, groups=args.groups)
    results = {}
    for kind, build in (("demo", lambda o: demo_report(dirs, o)), ("cli", lambda o: cli_report([sweep], o))):
        report = build(out / f"report-{kind}")
        screenshot(report.index, out / f"{kind}-first-screen.png", args.width, args.height)
        m = measure(report.index, args.width, args.height)
        screenshot(report.index, out / f"{kind}-page.png", args.width, page_height(m))
        results[kind] = m
    json.dump(results, sys.stdout, indent=1)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())

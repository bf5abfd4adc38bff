"""`armorlab report` end to end on synthetic run dirs whose table values are worked out by hand."""

import base64
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from armorlab.analysis import report as R
from armorlab.analysis.recipe import Compare, Recipe, Select, load_recipe
from armorlab.core.config import resolve
from armorlab.core.runs import RunDir

EVAL = [0, 10, 20, 30, 40, 50]


def dapo_val(k):   # peaks at step 20 (0.5, 0.6, 0.7), then collapses to 0.2
    return [0.1, 0.3, 0.5 + 0.1 * k, 0.2, 0.2, 0.2]


def armor_val(k):  # keeps rising to 0.6, 0.7, 0.8
    return [0.1, 0.2, 0.3, 0.4, 0.5, 0.6 + 0.1 * k]


def write_run(root, objective, seed, val, test_offset, *, state="completed", reason=None, upto=50):
    rd = RunDir.create(root, resolve({"objective": objective, "seed": seed, "max_steps": 50}))
    vals = dict(zip(EVAL, val, strict=True))
    for s in range(upto + 1):
        m = {"train/reward": s / 50 if objective == "dapo" else s / 100, "train/entropy": 1.0 - s / 100}
        if objective == "armor":   # anchor diagnostics: dropped queries are harder than kept ones
            m.update({"anchor/gate_drop_success": 0.1 + 0.1 * seed, "anchor/gate_keep_success": 0.6})
            if s == 0:
                m["ref/val_acc"] = val[0]
        if s in vals:
            m.update({"val/acc": vals[s], "test/acc": vals[s] - test_offset, "val/n": 1000, "test/n": 1000,
                      "kl/reverse_k3": s / 500, "kl/forward_k3": s / 1000})
        rd.append_metrics(s, m)
    rd.write_status(state, reason=reason)
    return rd


def write_tokens(rd, seed=0, n=300):
    rng = np.random.default_rng(seed)
    old = np.log(rng.uniform(0.05, 1.0, n))
    rd.tokens_dir.mkdir(exist_ok=True)
    pd.DataFrame({"logp": old + rng.normal(0, 0.05, n), "old_logp": old, "ref_logp": old + rng.normal(0, 0.2, n),
                  "advantage": rng.normal(size=n), "is_anchor": np.arange(n) % 8 == 0,
                  "step": np.zeros(n, dtype=int)}).to_parquet(rd.tokens_dir / "s0.parquet")


@pytest.fixture(scope="module")
def clean_sweep(tmp_path_factory):
    root = tmp_path_factory.mktemp("clean") / "sw"
    for k in range(3):
        rd = write_run(root, "dapo", k, dapo_val(k), 0.05)
        if k == 0:
            write_tokens(rd)
        write_run(root, "armor", k, armor_val(k), 0.1)
    return root


@pytest.fixture(scope="module")
def clean_report(clean_sweep, tmp_path_factory):
    recipe = Recipe(runs=[str(clean_sweep)], title="known curves", matched_steps=[20, 50],
                    select=Select("val/acc", "max", "test/acc"), compare=Compare(baseline={"objective": "dapo"}))
    out = tmp_path_factory.mktemp("out") / "report"
    return R.build_report(recipe, out)


def group_row(result, objective):
    df = pd.read_csv(result.out_dir / "tables" / "groups.csv")
    return df[df["objective"] == objective].iloc[0]


def test_known_curves_give_known_table_values(clean_report):
    assert clean_report.n_runs == 6 and clean_report.n_groups == 2
    dapo, armor = group_row(clean_report, "dapo"), group_row(clean_report, "armor")
    assert dapo["n"] == 3 and armor["n"] == 3
    expect = {
        # dapo: levels of 3 evals (0.9+0.1k)/3, (1.0+0.1k)/3, (0.9+0.1k)/3, 0.2 → peak (1.0+0.1k)/3 (mean
        # 1.1/3) around step 20, final 0.2; level 0.2 of evals 30..50 is (0.1+0.033k)/SE ≥ 8.9 SE below
        # level 0 (binomial, 3000 completions each), its first eval (30) is the onset
        ("dapo", "peak"): 1.1 / 3, ("dapo", "peak_step"): 20, ("dapo", "final"): 0.2,
        ("dapo", "drop"): 1.1 / 3 - 0.2, ("dapo", "collapse_step"): 30,
        # AUC seed k: [(0.1+0.3)/2 + (0.8+0.1k)/2 + (0.7+0.1k)/2 + 0.2 + 0.2]·10/50 = 0.27 + 0.02k
        ("dapo", "auc"): 0.29,
        ("dapo", "selected_val"): 0.6, ("dapo", "selected_test"): 0.55,     # test = val − 0.05 at step 20
        ("dapo", "val@20"): 0.6, ("dapo", "test@20"): 0.55, ("dapo", "val@50"): 0.2, ("dapo", "test@50"): 0.15,
        # armor: rises to 0.6/0.7/0.8 at step 50: last level (1.5+0.1k)/3 around step 40; AUC 0.35 + 0.01k
        ("armor", "peak"): 1.6 / 3, ("armor", "peak_step"): 40, ("armor", "drop"): 0.0, ("armor", "auc"): 0.36,
        ("armor", "selected_test"): 0.6, ("armor", "val@20"): 0.3, ("armor", "test@50"): 0.6,
    }
    for (obj, score), value in expect.items():
        row = dapo if obj == "dapo" else armor
        assert row[f"{score}_mean"] == pytest.approx(value, abs=1e-9), (obj, score)
    assert dapo["collapsed"] == 3 and armor["collapsed"] == 0
    peaks = np.array([1.0, 1.1, 1.2]) / 3
    assert dapo["drop_rel_mean"] == pytest.approx(np.mean((peaks - 0.2) / peaks))
    assert dapo["collapse_z_mean"] > 8 and dapo["drop_z_n"] == 3
    # the collapse at 30 spans steps 0..50, where the train reward s/50 rises: divergence at 30 too
    assert dapo["divergence_step_mean"] == 30 and armor["divergence_step_n"] == 0
    # entropy 1 − s/100 never falls below 10% of its start within 50 steps
    assert np.isnan(dapo["entropy_collapse_step_mean"]) and dapo["entropy_collapse_step_n"] == 0
    assert np.isnan(armor["collapse_step_mean"])
    # 3 seeds: Student-t CI, mean ± t(0.975, 2)·s/√3 = 1.1/3 ± 4.3027·(0.1/3)/√3
    half = 4.302653 * (0.1 / 3) / np.sqrt(3)
    assert dapo["peak_ci_low"] == pytest.approx(1.1 / 3 - half)
    assert dapo["peak_ci_high"] == pytest.approx(1.1 / 3 + half)
    assert dapo["peak_std"] == pytest.approx(0.1 / 3) and dapo["peak_ci_method"] == "t"


def test_probability_of_improvement_against_baseline(clean_report):
    poi = pd.read_csv(clean_report.out_dir / "tables" / "improvement.csv")
    assert set(poi["x"]) == {"objective=armor"} and set(poi["y"]) == {"objective=dapo"}
    by_score = poi.set_index("score")["p_improvement"]
    assert by_score["test@50"] == 1.0                       # every armor seed beats every dapo seed
    # selected test: armor 0.5/0.6/0.7 vs dapo 0.45/0.55/0.65 → 1 + 2 + 3 wins of 9
    assert by_score["selected_test"] == pytest.approx(6 / 9)
    assert by_score["auc"] == 1.0


def test_tables_in_every_format(clean_report):
    t = clean_report.out_dir / "tables"
    md = (t / "groups.md").read_text()
    assert md.splitlines()[0].startswith("| objective | n | peak level val/acc")
    assert "| dapo | 3 | 0.367 [" in md and "3/3 runs @ 30 [30, 30]" in md
    tex = (t / "groups.tex").read_text()
    assert all(rule in tex for rule in ("\\toprule", "\\midrule", "\\bottomrule"))
    assert "val/acc @ 20" in tex
    runs = pd.read_csv(t / "runs.csv")
    assert len(runs) == 6 and {"run_id", "group", "seed", "state", "selected_test", "val@50"} <= set(runs.columns)
    assert sorted(runs.loc[runs["group"] == "objective=dapo", "peak"].round(9)) == list(
        (np.array([1.0, 1.1, 1.2]) / 3).round(9))
    assert "tok_pos_mean" in runs.columns and runs["tok_pos_mean"].notna().sum() == 1
    assert (t / "tokens.md").is_file() and (t / "improvement.tex").is_file()
    headline = (t / "headline.md").read_text().splitlines()
    header = [c.strip() for c in headline[0].strip("|").split("|")]
    dapo = dict(zip(header, [c.strip() for c in headline[3].strip("|").split("|")], strict=True))
    assert dapo["objective"] == "dapo"
    # dapo's selected test scores 0.45, 0.55, 0.65: three seeds, nothing trimmed, IQM = mean
    assert dapo["test/acc @ val-best step: IQM"] == "0.550" and dapo["test/acc @ val-best step: n"] == "3"
    assert dapo["test/acc @ val-best step: std"] == "0.100"
    configs = pd.read_csv(t / "configs.csv")
    assert "objective" in configs.columns and "seed" not in configs.columns


def test_ci_methods_low_power_and_unresolvable_improvement(clean_report):
    t = clean_report.out_dir / "tables"
    groups_md = (t / "groups.md").read_text()
    assert "95% CI" in groups_md.splitlines()[0] and "Student-t · low-powered (n=3)" in groups_md
    assert any(w.startswith("low-powered: 2 group(s)") for w in clean_report.warnings)
    # 3 vs 3 seeds: even complete separation has exact Mann–Whitney p = 2/C(6, 3) = 0.1
    poi = pd.read_csv(t / "improvement.csv").set_index("score")
    assert not poi.loc["test@50", "resolvable"] and np.isnan(poi.loc["test@50", "ci_low"])
    assert poi.loc["test@50", "mw_p"] == pytest.approx(0.1)
    assert "1.000 (cannot be resolved with 3 vs 3 seeds)" in (t / "improvement.md").read_text()


def test_anchor_diagnostics_table(clean_report):
    anchors = pd.read_csv(clean_report.out_dir / "tables" / "anchors.csv").set_index("group")
    # per seed the mean over steps is 0.1 + 0.1k; over seeds 0.2 ± t(0.975, 2)·0.1/√3 = 0.2 ± 0.248414
    assert anchors.loc["objective=armor", "success on gate-dropped queries"] == "0.200 [-0.048, 0.448]"
    assert anchors.loc["objective=armor", "success on kept queries"] == "0.600 [0.600, 0.600]"
    assert anchors.loc["objective=armor", "ref/val_acc at resets (step: mean over seeds)"] == "0: 0.100"
    assert anchors.loc["objective=dapo", "success on kept queries"] == "—"
    assert "Anchor diagnostics" in clean_report.index.read_text()


def test_noise_band_is_the_eval_noise_of_the_seed_mean(clean_sweep):
    from armorlab.analysis import groups as G
    from armorlab.analysis.load import load

    rs = load([str(clean_sweep)], cache=False)
    groups = G.make_groups(rs.runs, ["objective"])
    steps, se = R._noise_bands(rs, groups, "val/acc")["objective=dapo"]
    # step 0: three seeds at 0.1 with val/n = 1000 → SE_r² = 0.09/1000, SE of their mean = sqrt(3·SE_r²)/3
    assert steps[0] == 0 and se[0] == pytest.approx(np.sqrt(3 * 0.09 / 1000) / 3)


class _Images(HTMLParser):
    """The file each <img> was embedded from (``data-file``) and its data URI."""

    def __init__(self):
        super().__init__()
        self.src, self.data = [], []

    def handle_starttag(self, tag, attrs):
        if tag == "img":
            self.src.append(dict(attrs)["data-file"])
            self.data.append(dict(attrs)["src"])


def test_html_references_only_existing_images(clean_report):
    parser = _Images()
    html = clean_report.index.read_text()
    parser.feed(html)
    assert {"plots/val.png", "plots/overoptimisation.png", "plots/kl.png", "plots/capacity.png",
            "plots/ablation.png"} <= set(parser.src)
    for src, data in zip(parser.src, parser.data, strict=True):
        png = (clean_report.out_dir / src).read_bytes()
        assert png[:8] == b"\x89PNG\r\n\x1a\n", src
        assert data == "data:image/png;base64," + base64.b64encode(png).decode("ascii"), src  # the same image
    assert "Configs that differ between groups" in html and "probability of improvement" in html
    assert "IQM" in html
    assert "@ val-best step" in html and "val/acc @ 50" in html


def test_report_over_failed_running_and_torn_runs_completes_and_warns(tmp_path):
    root = tmp_path / "sw"
    write_run(root, "dapo", 0, dapo_val(0), 0.05)
    write_run(root, "dapo", 1, dapo_val(1), 0.05, state="failed", reason="non-finite loss at step 21", upto=20)
    running = write_run(root, "armor", 0, armor_val(0), 0.1, state="running", upto=30)
    with open(running.metrics_path, "a") as fh:
        fh.write('{"step": 31, "train/rew')
    old_trainer = RunDir.create(root, resolve({"objective": "armor", "seed": 1, "max_steps": 50}))
    for s in EVAL:   # an older trainer: no test/, no kl/
        old_trainer.append_metrics(s, {"val/acc": armor_val(1)[EVAL.index(s)]})
    old_trainer.write_status("completed")
    result = R.build_report(Recipe(runs=[str(root)], title="messy"), tmp_path / "out")
    text = "\n".join(result.warnings)
    assert "is failed: non-finite loss at step 21" in text
    assert f"run {running.id} is running" in text
    assert "torn line" in text
    assert "metric test/acc missing in 1/4 runs" in text and "kl/forward_k3 missing" in text
    assert "did not reach matched step" in text
    html = result.index.read_text()
    assert "non-finite loss at step 21" in html and "torn line" in html
    runs = pd.read_csv(result.out_dir / "tables" / "runs.csv")
    assert set(runs["state"]) == {"completed", "failed", "running"}


def test_metrics_a_config_never_logs_are_not_reported_missing(tmp_path):
    root = tmp_path / "sw"
    for seed in (0, 1):
        dapo = RunDir.create(root, resolve({"objective": "dapo", "seed": seed, "max_steps": 50}))
        armor = RunDir.create(root, resolve({"objective": "armor", "seed": seed, "max_steps": 50}))
        for s in EVAL:
            dapo.append_metrics(s, {"val/acc": 0.5, "kl/reverse_k3": 0.1})
            # the first armor run lacks anchor/rate although it has anchors on: a real gap
            extra = {"anchor/rate": 0.9} if seed == 1 else {}
            armor.append_metrics(s, {"val/acc": 0.5, "kl/reverse_k3": 0.1, "kl/forward_k3": 0.2, **extra})
        for rd in (dapo, armor):
            rd.write_status("completed")
    result = R.build_report(Recipe(runs=[str(root)], curves=["val/acc", "anchor/rate", "kl/forward_k3"],
                                   title="applicable"), tmp_path / "out")
    text = "\n".join(result.warnings)
    assert "kl/forward_k3 missing" not in text  # anchor-free dapo runs cannot log forward KL
    assert "metric anchor/rate missing in 1/2 runs" in text  # only the armor runs are expected to
    assert R.logged_under("anchor/gate_drop", {"anchor": False, "anchor_gate": True})
    # forward KL is computed on the reference draws the anchor rollout makes: with anchors or the gate
    assert R.logged_under("kl/forward_k1", {"anchor": False, "anchor_gate": True})
    assert not R.logged_under("kl/forward_k1", {"anchor": False, "anchor_gate": False})
    assert R.logged_under("kl/forward_k1", {})  # an older config without the key: assume logged
    # the gradient-share probe: the KL term's parts only at β ≠ 0, the anchors' only with anchors
    assert not R.logged_under("obj/kl_grad_share", {"beta": 0.0, "grad_share_every": 10})
    assert R.logged_under("obj/kl_grad_cos", {"beta": 1e-3, "grad_share_every": 10})
    assert not R.logged_under("obj/kl_grad_share", {"beta": 1.0, "grad_share_every": 0})
    assert not R.logged_under("obj/beta_kl", {"beta": 0.0}) and R.logged_under("obj/beta_kl", {"beta": 0.5})
    assert not R.logged_under("obj/anchor_grad_share", {"anchor": False, "anchor_gate": True})
    assert R.logged_under("obj/anchor_grad_share", {"anchor": True, "grad_share_every": 10})
    assert R.logged_under("obj/kl_grad_share", {"beta": float("nan")})  # an imported run's unknown β


def test_single_seed_and_mixed_groups_warn(tmp_path):
    root = tmp_path / "sw"
    write_run(root, "dapo", 0, dapo_val(0), 0.05)
    write_run(root, "armor", 0, armor_val(0), 0.1)
    result = R.build_report(Recipe(runs=[str(root)], group_by=[]), tmp_path / "out")
    text = "\n".join(result.warnings)
    assert "group all runs mixes runs with different" in text and "objective" in text
    result = R.build_report(Recipe(runs=[str(root)], group_by=["objective"]), tmp_path / "out2")
    assert any("single seed" in w for w in result.warnings)


def test_study_dirs_get_an_optuna_section(clean_sweep, tmp_path, monkeypatch):
    """The report command composes it: a dir armorlab.tune.study recognises as a study gets its
    plots and best-trials table (analysis itself never imports tune)."""
    from armorlab.commands.report import compose_report
    from armorlab.tune import study as tune

    def fake_plots(study_dir, out_dir):
        import matplotlib.pyplot as plt

        Path(out_dir).mkdir(parents=True, exist_ok=True)
        fig = plt.figure()
        path = Path(out_dir) / "optuna_history.png"
        fig.savefig(path)
        plt.close(fig)
        return [path]

    monkeypatch.setattr(tune, "is_study_dir", lambda p: Path(p) == clean_sweep)
    monkeypatch.setattr(tune, "study_status", lambda d: {"best": []})
    monkeypatch.setattr(tune, "status_table_rows", lambda s: (["#", "val/acc"], [["0", "0.7"]]))
    monkeypatch.setattr(tune, "best_value_summary", lambda s: "3/3 finished")
    monkeypatch.setattr(tune, "write_study_plots", fake_plots)
    result = compose_report(Recipe(runs=[str(clean_sweep)]), tmp_path / "out")
    html = result.index.read_text()
    assert f"Optuna study {clean_sweep.name}" in html and "3/3 finished" in html
    parser = _Images()
    parser.feed(html)
    assert f"plots/study_{clean_sweep.name}/optuna_history.png" in parser.src
    assert all((result.out_dir / s).is_file() for s in parser.src)


def test_default_out_dirs(tmp_path):
    assert R.default_out_dir(Recipe(runs=[str(tmp_path)])) == tmp_path / "report"
    assert R.default_out_dir(Recipe(runs=["a", "b"])) == Path("reports/compare")
    assert R.default_out_dir(Recipe(runs=["a"], out="x/y")) == Path("x/y")


def cli(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "armorlab.cli", *args], capture_output=True, text=True, cwd=cwd)


def test_cli_report_dirs_and_errors(clean_sweep, tmp_path):
    out = cli("report", str(clean_sweep), "--out", str(tmp_path / "rep"), "--group-by", "objective")
    assert out.returncode == 0, out.stderr
    assert str(tmp_path / "rep" / "index.html") in out.stdout and "2 groups" in out.stdout
    bad = cli("report", str(clean_sweep), "--out", str(tmp_path / "rep2"), "--group-by", "nope")
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    assert "'group_by'" in bad.stderr and "'nope'" in bad.stderr
    recipe = tmp_path / "r.yaml"
    recipe.write_text(f"runs: [{clean_sweep}]\nselct: {{metric: val/acc}}\n")
    bad = cli("report", str(recipe))
    assert bad.returncode == 2 and "'selct'" in bad.stderr and "r.yaml" in bad.stderr
    missing = cli("report", str(tmp_path / "none.yaml"))
    assert missing.returncode == 2 and "recipe file not found" in missing.stderr


@pytest.mark.parametrize("path", sorted(Path(__file__).resolve().parents[1].glob("analysis/*.yaml")),
                         ids=lambda p: p.name)
def test_shipped_recipes_parse(path):
    recipe = load_recipe(path)
    assert recipe.runs and recipe.select.metric in ("val/acc", "val/acc_greedy")


def test_axis_labels_carry_the_units_the_trainer_logs_in():
    from armorlab.analysis.plots import metric_label

    # kl/* are per-sequence sums averaged over sequences (trainer README), not per-token values
    assert metric_label("kl/forward_k3") == "kl/forward_k3 (nats/sequence)"
    assert metric_label("kl/exact_reverse") == "kl/exact_reverse (nats/sequence)"
    assert metric_label("train/entropy") == "train/entropy (nats/token)"
    assert metric_label("val/pass@4") == "val/pass@4 (fraction solved)"


def test_analysis_never_imports_tune():
    """design.md layers: tune may use analysis, never the reverse (the report command composes them)."""
    import ast

    pkg = Path(R.__file__).parent
    offenders = []
    for path in sorted(pkg.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            if isinstance(node, ast.ImportFrom) and node.module == "armorlab":
                names = [f"armorlab.{a.name}" for a in node.names]
            offenders += [f"{path.name}: {n}" for n in names if n == "armorlab.tune" or n.startswith("armorlab.tune.")]
    assert offenders == []


def test_notes_keep_their_order_when_the_kl_figure_goes_first(tmp_path):
    """The KL figure is sent to the worker before the missing-metric and mixed-group notes are
    written; the page still lists those first, then the KL bands' notes, then the selection
    metric's."""
    root = tmp_path / "sw"
    for seed, alpha in ((0, 0.5), (1, 0.9)):
        rd = RunDir.create(root, resolve({"objective": "armor", "alpha": alpha, "seed": seed, "max_steps": 50}))
        for s in EVAL:
            # each seed logs KL and val/acc at its own steps: both bands are interpolated
            rd.append_metrics(s + seed, {"val/acc": 0.5, "kl/reverse_k3": 0.1,
                                         **({"anchor/rate": 0.9} if seed else {})})
        rd.write_status("completed")
    result = R.build_report(Recipe(runs=[str(root)], group_by=[], title="order",
                                   curves=["val/acc", "kl/reverse_k3", "anchor/rate"], kl=["kl/reverse_k3"]),
                            tmp_path / "out")
    at = {key: next(i for i, w in enumerate(result.warnings) if key in w)
          for key in ("metric anchor/rate missing in 1/2", "mixes runs with different",
                      "kl/reverse_k3 was logged at different steps", "val/acc was logged at different steps")}
    assert list(at.values()) == sorted(at.values()), result.warnings


def test_effective_batch_gap_between_paired_arms_is_warned(tmp_path):
    from armorlab.stats.effective_batch import effective_batch_gap

    # 1 − mean shortfall: 0.9 vs 0.7 differ by 0.2 > 0.05; 0.9 vs 0.87 do not; no values: no verdict
    assert effective_batch_gap([0.1, 0.1], [0.2, 0.4]) == pytest.approx((0.9, 0.7))
    assert effective_batch_gap([0.1], [0.13]) is None
    assert effective_batch_gap([], [0.5]) is None and effective_batch_gap([float("nan")], [0.5]) is None
    root = tmp_path / "sw"
    for objective, short in (("dapo", 0.4), ("armor", 0.05)):
        for seed in (0, 1):
            rd = write_run(root, objective, seed, dapo_val(seed) if objective == "dapo" else armor_val(seed), 0.05)
            for s in range(1, 51):  # appended lines for the same steps: the curve averages them per step
                rd.append_metrics(s, {"train/refill_shortfall": short})
    recipe = Recipe(runs=[str(root)], group_by=["objective"],
                    compare=Compare(pairs=[({"objective": "armor"}, {"objective": "dapo"})]))
    text = "\n".join(R.build_report(recipe, tmp_path / "out").warnings)
    assert "effective batch differs" in text and "95%" in text and "60%" in text
    same = tmp_path / "same"
    for objective in ("dapo", "armor"):
        for seed in (0, 1):
            rd = write_run(same, objective, seed, dapo_val(seed), 0.05)
            for s in range(1, 51):
                rd.append_metrics(s, {"train/refill_shortfall": 0.1})
    recipe = Recipe(runs=[str(same)], group_by=["objective"],
                    compare=Compare(pairs=[({"objective": "armor"}, {"objective": "dapo"})]))
    assert "effective batch differs" not in "\n".join(R.build_report(recipe, tmp_path / "out2").warnings)

"""Held-out sets that are held out (issue 35, item 2): training de-duplicated on normalised problem
text, named ``eval_sets`` with their own avg@n / pass@k, an overlap with training refused by both
check-task and training, and the kept checkpoint selected on a named set.

The data are built here: a DAPO-Math-shaped file (each prompt repeated ×100, in spellings that differ
by spacing, case and LaTeX spacing) and a MATH500-shaped file of other problems.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from armorlab.algos.pass_at_k import pass_at_k
from armorlab.core.config import resolve
from armorlab.errors import ArmorLabError
from armorlab.tasks import build_task
from armorlab.tasks.heldout import first_of_each, problem_key
from armorlab.tasks.mathfile import build_eval_sets

PROBLEMS = 24  # distinct problems of the DAPO-shaped file
REPEATS = 100
SPELLINGS = ("What is ${i}+1$?", "what is ${i} + 1$ ?", "WHAT IS ${i}\\,+\\,1$?", "What  is\t${i}\\;+1$?")


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def dapo_shaped(tmp_path: Path) -> Path:
    """PROBLEMS problems × REPEATS rows, the copies spelled differently (SPELLINGS), interleaved."""
    rows = [{"problem": SPELLINGS[r % len(SPELLINGS)].replace("{i}", str(i)), "answer": str(i + 1)}
            for r in range(REPEATS) for i in range(PROBLEMS)]
    return write_jsonl(tmp_path / "dapo.jsonl", rows)


def math500_shaped(tmp_path: Path, n: int = 10, shared: int = 0, name: str = "math500.jsonl") -> Path:
    """n problems none of which is in the DAPO-shaped file, except the first ``shared`` ones,
    which are training problems spelled another way."""
    rows = [{"problem": f"What is {i} times 3?", "answer": str(3 * i), "unique_id": f"test/{i}"} for i in range(n)]
    for i in range(shared):
        rows[i] = {"problem": f"what is ${i} +1$?", "answer": str(i + 1), "unique_id": f"copy/{i}"}
    return write_jsonl(tmp_path / name, rows)


def config(data: Path, sets: dict | None = None, **over) -> dict:
    raw = {"task": {"name": "math", "path": str(data), "val_size": 4, "test_size": 4}, **over}
    if sets is not None:
        raw["eval_sets"] = sets
    return resolve(raw)


# --------------------------------------------------------------------------- normalisation, de-duplication
def test_problem_key_ignores_spacing_case_and_latex_spacing_only():
    keys = {problem_key(s.replace("{i}", "7")) for s in SPELLINGS}
    assert keys == {"whatis$7+1$?"}
    assert problem_key("What is $7+2$?") != problem_key("What is $7+1$?")
    assert problem_key("\\left(x\\right)\\quad y") == problem_key("(x) y") == "(x)y"
    assert problem_key("\\leftarrow") != problem_key("arrow")  # a command that starts like \left stays
    chat = [{"role": "user", "content": "What is  $7+1$?"}]
    assert problem_key(chat) == problem_key("what is $7+1$?")
    assert first_of_each(["a b", "A  B", "c", "ab", "C"]) == ([0, 2], 3)


def test_dapo_shaped_training_rows_are_deduplicated_and_counted(tmp_path):
    task = build_task(config(dapo_shaped(tmp_path))["task"])
    assert task.settings["dedup_dropped"] == PROBLEMS * REPEATS - PROBLEMS  # 2,376 of 2,400 rows
    assert (len(task.val), len(task.test), len(task.train)) == (4, 4, PROBLEMS - 8)
    keys = [{problem_key(p) for p in split["prompt"]} for split in (task.train, task.val, task.test)]
    assert sum(map(len, keys)) == PROBLEMS and len(set().union(*keys)) == PROBLEMS  # disjoint, no repeats
    assert all(row["prompt"] == f"What is ${int(row['answer']) - 1}+1$?" for row in task.train)  # first spelling kept


def test_a_file_of_few_distinct_problems_says_so(tmp_path):
    data = write_jsonl(tmp_path / "few.jsonl", [{"problem": f"{i % 5} + 1", "answer": str(i % 5 + 1)}
                                                for i in range(1000)])
    with pytest.raises(ArmorLabError) as err:
        build_task({"name": "math", "path": str(data), "val_size": 2, "test_size": 3})
    assert err.value.key == "task.val_size" and "5 distinct problems (995 repeated problems dropped)" in str(err.value)


# --------------------------------------------------------------------------- overlap
def test_disjoint_sets_build_with_their_own_samples_and_k(tmp_path):
    cfg = config(dapo_shaped(tmp_path), {"math500": {"path": str(math500_shaped(tmp_path)), "role": "val"},
                                         "aime": {"path": str(math500_shaped(tmp_path, 6, name="aime.jsonl")),
                                                  "samples": 8, "k": 4}})
    sets = build_eval_sets(cfg, build_task(cfg["task"]))
    assert {n: (s.prefix, len(s.data), s.samples, s.k) for n, s in sets.items()} == {
        "math500": ("val/math500", 10, 1, 1), "aime": ("test/aime", 6, 8, 4)}
    assert sets["aime"].data[5] == {"prompt": "What is 5 times 3?", "answer": "15"}


def test_a_set_repeated_for_avg_at_n_keeps_each_problem_once(tmp_path, caplog):
    # a benchmark file repeating each problem n times (one sample per row) for avg@n: 6 problems × 32 rows
    rows = [{"problem": f"What is {i} times 3?", "answer": str(3 * i)} for _ in range(32) for i in range(6)]
    repeated = write_jsonl(tmp_path / "aime_x32.jsonl", rows)
    cfg = config(dapo_shaped(tmp_path), {"aime": {"path": str(repeated), "samples": 32}})
    held = build_eval_sets(cfg, build_task(cfg["task"]))["aime"]
    assert (len(held.data), held.dropped, held.samples) == (6, 6 * 31, 32)
    assert "eval_sets.aime: 186 of 192 rows repeat an earlier problem" in caplog.text


def test_overlap_is_refused_with_count_and_file_and_the_opt_out_works(tmp_path, caplog):
    held = math500_shaped(tmp_path, shared=3)
    cfg = config(dapo_shaped(tmp_path), {"math500": {"path": str(held)}}, task={
        "name": "math", "path": str(tmp_path / "dapo.jsonl"), "val_size": 1, "test_size": 1, "split_seed": 0})
    task = build_task(cfg["task"])
    in_train = sum(problem_key(f"what is ${i} +1$?") in {problem_key(p) for p in task.train["prompt"]}
                   for i in range(3))
    assert in_train >= 1  # 22 of 24 problems train: the copies of problems 0-2 mostly land there
    with pytest.raises(ArmorLabError) as err:
        build_eval_sets(cfg, task)
    assert err.value.key == "eval_sets.math500.path" and err.value.file == str(held)
    assert f"{in_train} of its 10 problems are also training problems" in str(err.value)
    assert "allow_eval_overlap: true" in str(err.value)
    opted = resolve({**{k: v for k, v in cfg.items() if k != "eval_sets"}, "eval_sets": {"math500": str(held)},
                     "allow_eval_overlap": True})
    assert len(build_eval_sets(opted, task)["math500"].data) == 10
    assert f"shares {in_train} of 10 problems with training" in caplog.text


def test_check_task_shows_the_dropped_count_and_refuses_an_overlap(tmp_path, capsys, monkeypatch):
    from armorlab.cli import main

    monkeypatch.setenv("ARMORLAB_CACHE", str(tmp_path / "cache"))  # empty: check-task shows no sample
    data, clean = dapo_shaped(tmp_path), math500_shaped(tmp_path)
    base = ["--set", "task.name=math", "--set", f"task.path={data}", "--set", "task.val_size=1",
            "--set", "task.test_size=1", "--rows", "1"]
    with pytest.raises(SystemExit) as done:
        main(["check-task", *base, "--set", f"eval_sets.math500.path={clean}", "--set",
              "eval_sets.math500.samples=4", "--split", "math500"])
    out = capsys.readouterr()
    assert done.value.code in (0, None), out.err
    assert f"train: {PROBLEMS - 2} rows ({PROBLEMS * REPEATS - PROBLEMS} rows repeating an earlier problem " \
           "dropped)" in out.out
    assert f"test/math500: 10 problems, avg@4, pass@4 ({clean})" in out.out
    assert "What is 0 times 3?" in out.out  # the held-out set's own rows
    overlapping = math500_shaped(tmp_path, shared=10, name="copies.jsonl")  # every problem a training one
    with pytest.raises(SystemExit) as done:
        main(["check-task", *base, "--set", f"eval_sets.copies.path={overlapping}"])
    out = capsys.readouterr()
    assert done.value.code == 2
    assert "key 'eval_sets.copies.path'" in out.err and str(overlapping) in out.err
    task = build_task({"name": "math", "path": str(data), "val_size": 1, "test_size": 1})
    held_out = {int(a) - 1 for a in [*task.val["answer"], *task.test["answer"]]}  # problem i answers i + 1
    assert f"{10 - len(held_out & set(range(10)))} of its 10 problems are also training problems" in out.err


# --------------------------------------------------------------------------- avg@n, pass@k by hand
def test_pass_at_k_by_hand():
    # 1 − C(n−c, k)/C(n, k): n = 4, k = 2 → C(4,2) = 6 pairs
    assert pass_at_k(4, 0, 2) == 0.0
    assert pass_at_k(4, 1, 2) == pytest.approx(1 - 3 / 6)  # C(3,2) = 3 pairs miss the one correct
    assert pass_at_k(4, 2, 2) == pytest.approx(1 - 1 / 6)  # only the pair of the two wrong ones misses
    assert pass_at_k(4, 3, 2) == 1.0 and pass_at_k(4, 1, 4) == 1.0 and pass_at_k(4, 0, 4) == 0.0
    assert pass_at_k(32, 1, 1) == pytest.approx(1 / 32)  # pass@1 = the share correct
    assert pass_at_k(1024, 512, 512) == pytest.approx(1.0)  # large n stays finite
    with pytest.raises(ValueError):
        pass_at_k(4, 1, 5)


def test_score_split_avg_and_pass_at_k_by_hand():
    from armorlab.train.anchors import Completion
    from armorlab.train.evaluation import score_split

    rewards = [[1.0, 0.0, 0.0, 0.0], [1.0, 1.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]]
    samples = [[Completion(ids=(5,) * (j + 1), text="") for j in range(4)] for _ in rewards]
    parts = score_split(samples, rewards, 1.0, k=2)
    assert parts["acc"] == (3.0, 12.0)  # avg@4 = 3 correct of 12 samples = 0.25
    assert parts["pass@k"][0] == pytest.approx(0.5 + 5 / 6 + 0.0) and parts["pass@k"][1] == 3.0  # pass@2 = 4/9
    assert parts["length"] == (3 * (1 + 2 + 3 + 4), 12.0)
    assert score_split(samples, rewards, 1.0)["pass@k"] == (2.0, 3.0)  # k = n: any correct


# --------------------------------------------------------------------------- hostile input
@pytest.mark.parametrize(("sets", "key", "words"), [
    ({"ai\x07me": "x.jsonl"}, "eval_sets", "part of its metric names"),
    ({"a/b": "x.jsonl"}, "eval_sets", "part of its metric names"),
    ({"": "x.jsonl"}, "eval_sets", "part of its metric names"),
    ({7: "x.jsonl"}, "eval_sets", "keys must be strings"),
    ({"aime": {"path": "x.jsonl", "samples": 0}}, "eval_sets.aime.samples", "must be ≥ 1"),
    ({"aime": {"path": "x.jsonl", "k": 0}}, "eval_sets.aime.k", "must be ≥ 1"),
    ({"aime": {"path": "x.jsonl", "samples": 10**12}}, "eval_sets.aime.samples", "must be ≤ 1024"),
    ({"aime": {"path": "x.jsonl", "samples": 4, "k": 32}}, "eval_sets.aime.k", "k ≤ samples = 4"),
    ({"aime": {"path": "x.jsonl", "samples": "32"}}, "eval_sets.aime.samples", "must be an integer"),
    ({"aime": {"path": "x.jsonl", "samples": True}}, "eval_sets.aime.samples", "must be an integer"),
    ({"aime": {"path": "x.jsonl", "role": "train"}}, "eval_sets.aime.role", "must be one of val, test"),
    ({"aime": {"path": 3}}, "eval_sets.aime.path", "non-empty string"),
    ({"aime": {"samples": 4}}, "eval_sets.aime.path", "needs its data"),
    ({"aime": {"path": "x.jsonl", "temprature": 1}}, "eval_sets.aime.temprature", "unknown key"),
    ({"aime": ["x.jsonl"]}, "eval_sets.aime", "a path or a mapping"),
    (["aime"], "eval_sets", "must be a mapping"),
])
def test_hostile_eval_sets_name_key_and_value(tmp_path, sets, key, words):
    data = dapo_shaped(tmp_path)
    (tmp_path / "x.jsonl").write_text('{"problem": "p", "answer": "1"}\n')
    raw = {"task": {"name": "math", "path": str(data), "val_size": 4, "test_size": 4}, "eval_sets": sets}
    with pytest.raises(ArmorLabError) as err:
        resolve(raw, file="run.yaml")
    assert err.value.key == key and words in str(err.value) and err.value.file == "run.yaml"
    bad_value = next(iter(sets)) if key == "eval_sets" and isinstance(sets, dict) else None
    if bad_value is not None:
        assert repr(bad_value) in str(err.value) or str(bad_value) in str(err.value)


def test_a_set_from_a_cached_hub_id_reads_its_split_offline(tmp_path, monkeypatch):
    from huggingface_hub import constants

    # the hub cache's layout: <cache>/datasets--<org>--<name>/{refs/main, snapshots/<commit>/...}
    repo, commit = tmp_path / "hub" / "datasets--me--MATH-500", "0123456789abcdef0123456789abcdef01234567"
    (repo / "snapshots" / commit / "data").mkdir(parents=True)
    math500_shaped(repo / "snapshots" / commit / "data", 7, name="test.jsonl")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "datasets-cache"))
    cfg = config(dapo_shaped(tmp_path), {"math500": {"path": "me/MATH-500", "split": "test", "samples": 2}})
    assert cfg["eval_sets"]["math500"]["fingerprint"] == f"rev:{commit}"
    sets = build_eval_sets(cfg, build_task(cfg["task"]))
    assert sets["math500"].data["answer"] == [str(3 * i) for i in range(7)]
    bad = config(dapo_shaped(tmp_path), {"math500": {"path": "me/MATH-500", "split": "validation"}})
    with pytest.raises(ArmorLabError) as err:
        build_eval_sets(bad, build_task(bad["task"]))
    assert err.value.key == "eval_sets.math500.split" and "no split 'validation' (splits: test)" in str(err.value)


def test_missing_files_and_hub_ids_and_bad_selections_are_named(tmp_path, monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))  # an empty cache: nothing is cached
    data = dapo_shaped(tmp_path)
    task = {"name": "math", "path": str(data), "val_size": 4, "test_size": 4}
    for path, words in (("someone/aime-2024-not-cached", "not in the local Hugging Face cache"),
                        (str(tmp_path / "nowhere.jsonl"), "file not found")):
        with pytest.raises(ArmorLabError) as err:
            resolve({"task": task, "eval_sets": {"aime24": {"path": path}}})
        assert err.value.key == "eval_sets.aime24.path" and err.value.value == path and words in str(err.value)
    held = str(math500_shaped(tmp_path))
    for sets, select, words in (({"m": held}, {"metric": "val/m/acc"}, "no held-out set with role: val"),
                                ({"m": {"path": held, "role": "val"}}, {"metric": "val/other/acc"}, "(those: m)"),
                                ({"m": held}, {"metric": "test/m/acc"}, "never selected on"),
                                ({"m": held}, {"metric": "val/acc", "mode": "best"}, "max or min")):
        with pytest.raises(ArmorLabError) as err:
            resolve({"task": task, "eval_sets": sets, "keep_select": select})
        assert err.value.key.startswith("keep_select") and words in str(err.value)
    with pytest.raises(ArmorLabError) as err:
        resolve({"task": "arithmetic", "eval_sets": {"m": held}})
    assert err.value.key == "eval_sets" and "task: {name: math}" in str(err.value)


def test_absent_sets_leave_the_resolved_config_and_run_id_unchanged(tmp_path):
    from armorlab.core.runs import run_id

    data = dapo_shaped(tmp_path)
    plain = config(data)
    assert not {"eval_sets", "allow_eval_overlap", "keep_select"} & set(plain)
    assert run_id(config(data, {}, allow_eval_overlap=False, keep_select={"metric": "val/acc"})) == run_id(plain)
    with_set = config(data, {"m": str(math500_shaped(tmp_path))})
    assert run_id(with_set) != run_id(plain) and with_set["eval_sets"]["m"]["fingerprint"]
    assert resolve(with_set) == with_set  # resolving a resolved config is the identity


# --------------------------------------------------------------------------- end to end
@pytest.mark.slow
def test_tiny_run_logs_each_set_and_keeps_the_checkpoint_chosen_on_one(tmp_path, monkeypatch):
    from armorlab.core.runs import RunDir
    from armorlab.train.launch import train_run_dir
    from tests.trainer_support import SMALL

    monkeypatch.setenv("ARMORLAB_CACHE", str(tmp_path / "cache"))
    data, held = dapo_shaped(tmp_path), math500_shaped(tmp_path, 6)
    aime = math500_shaped(tmp_path, 3, name="aime.jsonl")
    cfg = resolve({**SMALL, "model": {"name": "tiny", "warm_start_steps": 0, "hidden_size": 64, "num_layers": 1,
                                      "num_heads": 2},
                   "task": {"name": "math", "path": str(data), "val_size": 2, "test_size": 2},
                   "max_steps": 2, "val_every": 2, "save_steps": 2, "max_completion_length": 6,
                   "val_samples": 2, "kl_probe_prompts": 0,
                   "eval_sets": {"math500": {"path": str(held), "role": "val", "samples": 3, "k": 2},
                                 "aime24": {"path": str(aime), "samples": 4}},
                   "keep_select": {"metric": "val/math500/acc", "mode": "max"}})
    rd = RunDir.create(tmp_path / "runs", cfg)
    outcome = train_run_dir(rd.path)
    assert outcome.state == "completed", rd.read_status()
    rows = rd.read_metrics()
    assert [r["step"] for r in rows] == [0, 1, 2]
    first = rows[0]
    assert first["data/dedup_dropped"] == PROBLEMS * REPEATS - PROBLEMS
    for step in (0, 2):
        row = rows[step]
        assert row["val/math500/n"] == 6 * 3 and row["test/aime24/n"] == 3 * 4 and row["val/n"] == 2 * 2
        for prefix in ("val/math500", "test/aime24"):
            assert 0.0 <= row[f"{prefix}/acc"] <= 1.0 and 0.0 <= row[f"{prefix}/pass@k"] <= 1.0
            assert row[f"{prefix}/length"] > 0
        assert row["val/math500/acc"] * 18 == pytest.approx(round(row["val/math500/acc"] * 18))  # c / 18
    assert "val/math500/acc" not in rows[1] and "data/dedup_dropped" not in rows[1]
    selected = json.loads(rd.selected_path.read_text())
    assert selected["metric"] == "val/math500/acc" and selected["step"] == 2  # the one checkpoint


@pytest.mark.slow
def test_training_refuses_an_overlapping_set_before_a_step(tmp_path, monkeypatch):
    from armorlab.core.runs import RunDir
    from armorlab.train.launch import train_run_dir

    monkeypatch.setenv("ARMORLAB_CACHE", str(tmp_path / "cache"))
    data = dapo_shaped(tmp_path)
    copies = math500_shaped(tmp_path, shared=10, name="copies.jsonl")  # problems 0-9, spelled otherwise
    cfg = resolve({"model": {"name": "tiny", "warm_start_steps": 0, "hidden_size": 64, "num_layers": 1, "num_heads": 2},
                   "task": {"name": "math", "path": str(data), "val_size": 1, "test_size": 1},
                   "max_steps": 1, "val_every": 0, "max_completion_length": 6, "eval_sets": {"copies": str(copies)}})
    task = build_task(cfg["task"])
    shared = 10 - len({int(a) - 1 for a in [*task.val["answer"], *task.test["answer"]]} & set(range(10)))
    rd = RunDir.create(tmp_path / "runs", cfg)
    with pytest.raises(ArmorLabError) as err:  # the CLI prints it and exits 2 (test_cli_user_error_in_a_run_dir_exits_2)
        train_run_dir(rd.path)
    status = rd.read_status()
    assert err.value.key == "eval_sets.copies.path" and status["state"] == "failed"
    assert f"{shared} of its 10 problems are also training problems" in status["reason"]
    assert "eval_sets.copies.path" in status["reason"] and not rd.read_metrics()


@pytest.mark.slow
def test_the_validator_scores_each_set_with_its_own_n_and_k_by_hand(tmp_path, monkeypatch):
    """Rewards fixed per problem (problem i: the first i mod 4 of its samples correct), whatever
    the tiny model writes: the logged avg@n and pass@k are then known by hand."""
    from armorlab.core.runs import RunDir
    from armorlab.train.launch import build_trainer

    monkeypatch.setenv("ARMORLAB_CACHE", str(tmp_path / "cache"))
    held = math500_shaped(tmp_path, 6)  # problem i answers 3i
    cfg = resolve({"model": {"name": "tiny", "warm_start_steps": 0, "hidden_size": 64, "num_layers": 1, "num_heads": 2},
                   "task": {"name": "math", "path": str(dapo_shaped(tmp_path)), "val_size": 2, "test_size": 2},
                   "max_completion_length": 4, "kl_probe_prompts": 0, "val_samples": 1,
                   "eval_sets": {"m": {"path": str(held), "role": "val", "samples": 4, "k": 2}}})
    trainer = build_trainer(cfg, RunDir.create(tmp_path / "runs", cfg))

    def fixed(prompts, completions, completion_ids, rows):
        correct = int(rows[0]["answer"]) // 3 % 4
        return [1.0 if j < correct else 0.0 for j in range(len(completions))]

    trainer.validator.score = fixed
    logs = trainer.validator.scores(0)
    # correct per problem: 0, 1, 2, 3, 0, 1 of 4 → avg@4 = 7/24
    assert logs["val/m/acc"] == pytest.approx(7 / 24) and logs["val/m/n"] == 24
    # pass@2 = 1 − C(4−c, 2)/C(4, 2): c = 0 → 0, 1 → 1/2, 2 → 5/6, 3 → 1; mean = (0 + 1/2 + 5/6 + 1 + 0 + 1/2)/6
    assert logs["val/m/pass@k"] == pytest.approx(17 / 36)
    assert logs["val/n"] == 2 and logs["test/n"] == 2  # the task's own splits keep val_samples = 1

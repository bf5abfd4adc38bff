"""Tasks: arithmetic splits/formats, exact-match and math-verify rewards, the math file loader."""

from __future__ import annotations

import json
import re
import threading
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from armorlab.errors import ArmorLabError
from armorlab.tasks import build_task, exact_match_reward, math_verify_reward
from armorlab.tasks.arithmetic import evaluate, format_answer

DATA = Path(__file__).parent / "data" / "math_sample.jsonl"


def arith(**kw):
    return build_task({"name": "arithmetic", **kw})


def python_value(prompt: str) -> int:
    """Independent oracle: Python's own precedence on the prompt with leading zeros removed."""
    expr = re.sub(r"\d+", lambda m: str(int(m.group())), prompt.rstrip("="))
    return eval(expr)  # noqa: S307 - digits and + - * only (checked below)


# --------------------------------------------------------------------------- arithmetic
def test_default_task_shapes_and_examples():
    task = arith()
    assert (len(task.train), len(task.val), len(task.test)) == (256, 64, 64)
    assert task.train.column_names == ["prompt", "answer"]
    # 2-digit addition: "dd+dd=" and a 3-digit answer (99+99=198 needs 3).
    for row in task.train:
        assert re.fullmatch(r"\d\d\+\d\d=", row["prompt"])
        assert re.fullmatch(r"\d{3}", row["answer"])
        assert int(row["answer"]) == python_value(row["prompt"])
    assert task.completion_chars == 3


@pytest.mark.parametrize("settings_", [
    {"digits": 1, "operands": 3, "operators": "+-*"},
    {"digits": 3, "operands": 2, "operators": "-"},
    {"digits": 2, "operands": 4, "operators": "*+"},
])
def test_answers_are_exact_and_fixed_width(settings_):
    task = arith(train_size=200, val_size=20, test_size=20, **settings_)
    rows = [r for split in (task.train, task.val, task.test) for r in split]
    signed = "-" in settings_["operators"]
    assert len({len(r["prompt"]) for r in rows}) == 1
    assert len({len(r["answer"]) for r in rows}) == 1 == len({task.completion_chars})
    assert len(rows[0]["answer"]) == task.completion_chars
    for r in rows:
        assert set(r["prompt"][:-1]) <= set("0123456789" + settings_["operators"])
        value = python_value(r["prompt"])
        assert int(r["answer"]) == value  # int() reads "+005" and "-035" too
        assert (r["answer"][0] in "+-") == signed


def test_answer_format_by_hand():
    # widths: 2 operands of 2 digits: + → max 198 (3 digits); * → max 99·99 = 9801 (4 digits)
    assert format_answer(49, 2, 2, "+") == "049"
    assert format_answer(-35, 2, 2, "+-") == "-035"
    assert format_answer(5, 2, 2, "-") == "+005"
    assert format_answer(294, 2, 2, "*") == "0294"
    assert format_answer(0, 1, 3, "+-*") == "+000"  # 9·9·9 = 729 → 3 digits + sign
    assert evaluate([2, 3, 4], ["+", "*"]) == 14
    assert evaluate([2, 3, 4], ["*", "-"]) == 2
    assert evaluate([10, 2, 3], ["-", "-"]) == 5


def test_splits_deterministic_disjoint_and_seeded():
    a, b = arith(split_seed=3, train_size=None), arith(split_seed=3, train_size=None)
    for split in ("train", "val", "test", "warm_start"):
        assert getattr(a, split)["prompt"] == getattr(b, split)["prompt"]
    c = arith(split_seed=4)
    assert c.val["prompt"] != a.val["prompt"]
    pool, val, test = set(a.train["prompt"]), set(a.val["prompt"]), set(a.test["prompt"])
    assert not (pool & val) and not (pool & test) and not (val & test)
    assert len(val) == 64 and len(test) == 64  # no duplicates inside a split either
    # the whole 10^4-problem space is split: pool = everything not held out
    assert len(pool) == 10_000 - 128
    # the warm start reads the pool from position 1024 of the seeded order on
    warm = set(a.warm_start["prompt"])
    assert warm <= pool and len(warm) == 10_000 - 1024


def test_train_size_changes_train_only():
    small, big, pool = arith(train_size=16), arith(train_size=256), arith(train_size=None)
    assert small.val["prompt"] == big.val["prompt"] == pool.val["prompt"]
    assert small.test["prompt"] == big.test["prompt"] == pool.test["prompt"]
    assert big.train["prompt"][:16] == list(small.train["prompt"])
    assert len(pool.train) == 10_000 - 128
    assert pool.warm_start["prompt"] == small.warm_start["prompt"]
    # fewer held-out prompts: same warm-start pool (one shared base model)
    assert arith(val_size=16, test_size=16).warm_start["prompt"] == small.warm_start["prompt"]


def test_huge_space_is_sampled_without_repeats():
    task = arith(digits=6, operands=4, operators="+-*", train_size=500, val_size=50, test_size=50)
    prompts = [*task.val["prompt"], *task.test["prompt"], *task.train["prompt"]]
    assert len(set(prompts)) == len(prompts) == 600
    assert task.val["prompt"] == arith(digits=6, operands=4, operators="+-*", train_size=3, val_size=50,
                                       test_size=50).val["prompt"]
    r = task.train[0]
    assert int(r["answer"]) == python_value(r["prompt"])


def test_too_many_requested_problems_are_clear_errors():
    with pytest.raises(ArmorLabError, match="task.train_size"):
        arith(digits=1, operands=2, train_size=100, val_size=5, test_size=5)
    with pytest.raises(ArmorLabError, match="task.val_size"):
        arith(digits=1, operands=2, val_size=60, test_size=40)
    with pytest.raises(ArmorLabError, match="task.digits"):
        arith(digits=0)


# --------------------------------------------------------------------------- exact-match reward
def test_exact_match_right_wrong_and_malformed():
    completions = ["049", " 049\n", "049</s>junk", "49", "0049", "048", "", None, 49, b"049",
                   [{"role": "assistant", "content": "049"}], {"content": "049"}, ["049"], object()]
    expected = [1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 1, 1, 0, 0]
    assert exact_match_reward(prompts=None, completions=completions,
                              answer=["049"] * len(completions)) == expected


def test_exact_match_with_missing_or_odd_answers_never_raises():
    assert exact_match_reward(completions=["1", "2"], answer=None) == [0.0, 0.0]
    assert exact_match_reward(completions=["1", "2"], answer=["1"]) == [1.0, 0.0]
    assert exact_match_reward(completions=["1"], answer=[1]) == [0.0]  # answers are strings
    assert exact_match_reward(completions=None, answer=["1"]) == []
    assert exact_match_reward(completions=5, answer=["1"]) == []
    # TRL passes extra columns and its own kwargs
    assert exact_match_reward(prompts=["1+0="], completions=["1"], answer=["1"], trainer_state=None,
                              log_metric=print, completion_ids=[[1]]) == [1.0]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.none(), st.text(), st.integers(), st.binary(),
                          st.lists(st.dictionaries(st.text(), st.text())))))
def test_rewards_never_raise(completions):
    answers = ["7"] * len(completions)
    for func in (exact_match_reward, math_verify_reward):
        out = func(prompts=None, completions=completions, answer=answers)
        assert len(out) == len(completions)
        assert all(v in (0.0, 1.0) for v in out)


# --------------------------------------------------------------------------- math-verify reward
@pytest.mark.parametrize(("completion", "answer", "expected"), [
    ("\\boxed{\\frac{1}{2}}", "0.5", 1.0),
    ("So the answer is \\boxed{0.5}.", "\\frac{1}{2}", 1.0),
    ("\\boxed{1/2}", "\\frac{1}{2}", 1.0),
    ("\\boxed{2\\sqrt{2}}", "\\sqrt{8}", 1.0),
    ("first \\boxed{3} then \\boxed{4}", "4", 0.0),  # boxed="all": hedging with two answers is wrong
    ("first \\boxed{3} then \\boxed{4}", "\\{3, 4\\}", 1.0),
    ("\\boxed{0.6}", "0.5", 0.0),
    ("0.5", "0.5", 0.0),  # boxed-answer extraction: an unboxed number is not an answer
    ("\\boxed{", "0.5", 0.0),
    ("", "0.5", 0.0),
    ("\\boxed{7}", "", 0.0),
])
def test_math_verify_scoring(completion, answer, expected):
    assert math_verify_reward(prompts=None, completions=[completion], answer=[answer]) == [expected]


@pytest.mark.parametrize(("completion", "answer", "expected"), [
    ("\\boxed{nan}", "nan", 0.0),  # math-verify alone scores these 1.0: n·a·n = n·a·n
    ("\\boxed{NaN}", "NaN", 0.0),
    ("\\boxed{1e400}", "1e400", 0.0),  # 1·e·400
    ("\\boxed{inf}", "inf", 0.0),
    ("\\boxed{inf}", "\\infty", 0.0),  # the float spelling of ∞ is no answer, whatever the gold
    ("\\boxed{-Infinity}", "-\\infty", 0.0),
    ("\\boxed{\\infty}", "\\infty", 1.0),  # LaTeX's ∞ (a limit) and intervals stay answers
    ("\\boxed{(-\\infty, 3]}", "(-\\infty, 3]", 1.0),
    ("\\boxed{1e30}", "1e30", 1.0),
])
def test_non_finite_answers_never_score(completion, answer, expected):
    assert math_verify_reward(prompts=None, completions=[completion], answer=[answer]) == [expected]


@pytest.mark.parametrize("answer", ["NaN", "1e400", "-Infinity", '"nan"', '"inf"'])
def test_a_data_file_with_a_non_finite_answer_is_refused(tmp_path, answer):
    rows = [json.dumps({"problem": f"q{i}", "answer": str(i)}) for i in range(12)]
    rows[5] = f'{{"problem": "q5", "answer": {answer}}}'
    path = tmp_path / "d.jsonl"
    path.write_text("\n".join(rows) + "\n")
    with pytest.raises(ArmorLabError, match=r"record 6: answer .* not a finite number.*task.answer_key.*d.jsonl"):
        math_task(path)


def test_math_verify_reward_in_a_thread():
    # math-verify's signal-based timeout raises outside the main thread; the reward must not.
    out = {}
    thread = threading.Thread(target=lambda: out.setdefault("r", math_verify_reward(
        completions=["\\boxed{\\frac{1}{2}}", "\\boxed{3}"], answer=["0.5", "0.5"])))
    thread.start()
    thread.join()
    assert out["r"] == [1.0, 0.0]


# --------------------------------------------------------------------------- math task
def math_task(path=DATA, **kw):
    return build_task({"name": "math", "path": str(path), "val_size": 4, "test_size": 4, **kw})


def test_math_task_splits_and_score():
    task = math_task()
    assert (len(task.val), len(task.test), len(task.train)) == (4, 4, 12)
    lines = [json.loads(x) for x in DATA.read_text().splitlines()]
    by_problem = {row["problem"]: str(row["answer"]) for row in lines}
    splits = [set(s["prompt"]) for s in (task.train, task.val, task.test)]
    assert set().union(*splits) == set(by_problem)
    assert sum(map(len, splits)) == len(by_problem)  # disjoint
    for split in (task.train, task.val, task.test):
        for row in split:
            assert row["answer"] == by_problem[row["prompt"]]
    assert "120" in {*task.train["answer"], *task.val["answer"], *task.test["answer"]}
    assert math_task().val["prompt"] == task.val["prompt"]
    assert math_task(split_seed=1).val["prompt"] != task.val["prompt"]
    assert len(math_task(train_size=5).train) == 5
    gold = list(task.val["answer"])
    assert task.score([task.target_completion(a) for a in gold], gold) == [1.0] * 4
    assert task.score(["\\boxed{-1000}"] * 4, gold) == [0.0] * 4


def test_math_task_reads_parquet_with_custom_keys(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [json.loads(x) for x in DATA.read_text().splitlines()]
    table = pa.table({"question": [r["problem"] for r in rows], "solution": [str(r["answer"]) for r in rows]})
    path = tmp_path / "m.parquet"
    pq.write_table(table, path)
    task = math_task(path, problem_key="question", answer_key="solution")
    assert sorted([*task.val["prompt"], *task.test["prompt"], *task.train["prompt"]]) == \
        sorted(r["problem"] for r in rows)


def test_math_task_bad_files(tmp_path):
    with pytest.raises(ArmorLabError, match=r"file not found.*task.path.*nope.jsonl"):
        math_task(tmp_path / "nope.jsonl")
    bad_suffix = tmp_path / "m.csv"
    bad_suffix.write_text("problem,answer\n")
    with pytest.raises(ArmorLabError, match="JSONL .* or parquet"):
        math_task(bad_suffix)
    bad_json = tmp_path / "bad.jsonl"
    # rows enough for the held-out sets (counted when the config resolves), line 2 torn
    bad_json.write_text('{"problem": "a", "answer": "1"}\n{"problem": \n' + '{"problem": "b", "answer": "2"}\n' * 10)
    with pytest.raises(ArmorLabError, match=r"line 2 is not valid JSON.*bad.jsonl"):
        math_task(bad_json)
    with pytest.raises(ArmorLabError, match=r"no column 'question'.*task.problem_key.*math_sample.jsonl"):
        math_task(problem_key="question")
    missing_answer = tmp_path / "na.jsonl"
    missing_answer.write_text("".join(json.dumps({"problem": f"p{i}", "answer": None if i == 3 else "1"}) + "\n"
                                      for i in range(12)))
    with pytest.raises(ArmorLabError, match=r"record 4.*task.answer_key"):
        math_task(missing_answer)
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    with pytest.raises(ArmorLabError, match="no records"):
        math_task(empty)
    with pytest.raises(ArmorLabError, match="task.val_size"):
        math_task(val_size=10, test_size=10)
    corrupt = tmp_path / "c.parquet"
    corrupt.write_bytes(b"not parquet")
    with pytest.raises(ArmorLabError, match="cannot read parquet"):
        math_task(corrupt)
    with pytest.raises(ArmorLabError, match="task.path"):
        build_task({"name": "math"})


# --------------------------------------------------------------------------- scratchpad
def scratch(**kw):
    return build_task({"name": "scratchpad", **kw})


@pytest.mark.parametrize("text, ok", [
    ("7+42=49+5=54", True),            # left to right
    ("5+42=47+7=54", True),            # another order
    ("42+5=47+7=54", True),
    ("07+42=49+05=54", True),          # leading zeros read as numbers
    (" 7+5=12+42=54 ", True),          # surrounding space is trimmed
    ("7+42=49", False),                # one step short
    ("7+42=49+5=54+0=54", False),      # a step too many (0 is no term)
    ("7+42=48+6=54", False),           # the right answer through a wrong step
    ("7+42=49+7=56", False),           # a term used twice
    ("49+5=54", False),                # a partial result is no term
    ("7+42=49,49+5=54", False),        # another format
    ("54", False),                     # the answer without its derivation
    ("7+42+5=54", False),              # three terms in one step
    ("7-42=-35+5=-30", False),         # −42 is no term here
])
def test_scratchpad_reward_checks_every_step(text, ok):
    from armorlab.tasks.scratchpad import derivation_reward

    assert derivation_reward(completions=[text], answer=["7+42+5=54"]) == [1.0 if ok else 0.0]
    assert derivation_reward(completions=[text], answer=["not an answer"]) == [0.0]


def test_scratchpad_signed_terms():
    from armorlab.tasks.scratchpad import check_derivation, derivation, parse_answer

    terms, value = parse_answer("12-34+56=34")
    assert (terms, value) == ([12, -34, 56], 34)
    assert check_derivation("56-34=22+12=34", terms, value)
    assert check_derivation("12-34=-22+56=34", terms, value)
    assert check_derivation("-34+56=22+12=34", terms, value)         # a negative first term
    assert not check_derivation("12+34=46+56=102", terms, 102)        # +34 is not a term
    assert not check_derivation("56+34=90-12=78", terms, 78)
    assert not check_derivation("34+56=90-12=78", terms, 78)          # nor is 34
    assert derivation(terms, "right to left") == "56-34=22+12=34"
    assert derivation(terms, "largest first") == "56+12=68-34=34"


def test_scratchpad_task_splits_styles_and_gold():
    task = scratch(digits=2, operators="+", train_size=64, val_size=50, test_size=30)
    assert (len(task.train), len(task.val), len(task.test)) == (64, 50, 30)
    rows = [r for split in (task.train, task.val, task.test) for r in split]
    for r in rows:
        assert re.fullmatch(r"\d\d\+\d\d\+\d\d=", r["prompt"])
        left, value = r["answer"].split("=")
        assert int(value) == python_value(r["prompt"]) == python_value(left + "=")
    gold = [task.target_completion(a) for a in task.val["answer"]]
    assert task.score(gold, task.val["answer"]) == [1.0] * 50
    assert max(len(g) for g in gold) <= task.completion_chars == 16  # 99+99=198+99=297
    # the same problems as the arithmetic task's splits (same space, same seeded order)
    arithmetic = arith(digits=2, operands=3, train_size=64, val_size=50, test_size=30)
    assert task.val["prompt"] == arithmetic.val["prompt"] and task.train["prompt"] == arithmetic.train["prompt"]
    # the warm start: a correct derivation per row in a mix of the three styles, never a held-out prompt
    warm = task.warm_start.select(range(600))
    assert task.score(warm["target"], warm["answer"]) == [1.0] * 600
    held = set(task.val["prompt"]) | set(task.test["prompt"])
    assert not held & set(task.warm_start["prompt"])
    from armorlab.tasks.scratchpad import derivation, parse_answer
    styles = [next(s for s in ("left to right", "right to left", "largest first")
                   if derivation(parse_answer(a)[0], s) == t)
              for a, t in zip(warm["answer"], warm["target"], strict=True)]
    counts = {s: styles.count(s) for s in set(styles)}
    # a style that coincides with an earlier one for a prompt is counted as the earlier one, so the
    # later styles are at most a third; each is well represented
    assert len(counts) == 3 and min(counts.values()) > 100


def test_scratchpad_rejects_multiplication():
    with pytest.raises(ArmorLabError, match="task.operators"):
        scratch(operators="+*")

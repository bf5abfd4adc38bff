"""The DAPO recipe's pieces (issue 36 §3): soft overlong punishment, DAPO-Math's "Answer:" scorer
and prompt, validation top-p — each against values computed by hand from the DAPO paper /
verl's DAPO reward manager and ``math_dapo`` scorer."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from armorlab.core.config import resolve
from armorlab.errors import ArmorLabError
from armorlab.tasks.rewards import (
    DAPO_PROMPT_TEMPLATE,
    OverlongPenalty,
    answer_line,
    answer_line_reward,
    soft_overlong_penalty,
)


@pytest.mark.parametrize("length,expected", [(1, 0.0), (4096, 0.0), (4097, -1 / 4096), (6144, -0.5),
                                             (8192, -1.0)])
def test_soft_overlong_penalty_of_the_recipe(length, expected):
    # verl's test_dapo_7b_math.sh: max_response_length 8192, overlong buffer 4096, penalty 1.0:
    # no penalty up to 8192 − 4096 tokens, then −(|y| − 4096)/4096 down to −1 at 8192
    assert soft_overlong_penalty(length, 8192, 4096, 1.0) == pytest.approx(expected, abs=1e-15)
    assert soft_overlong_penalty(length, 8192, 4096, 0.5) == pytest.approx(expected / 2, abs=1e-15)


def test_overlong_penalty_reward_function_counts_completion_tokens():
    f = OverlongPenalty(max_len=10, buffer=4, factor=1.0)
    ids = [[1] * 3, [1] * 6, [1] * 8, [1] * 10]  # 6 = the buffer's start: 0; 8: −2/4; 10: −1
    assert f(prompts=[None] * 4, completions=["a"] * 4, completion_ids=ids) == [0.0, 0.0, -0.5, -1.0]
    assert f.__name__ == "overlong_penalty" and f.shapes_length


def test_anchors_and_validation_judge_correctness_without_the_shaping():
    from armorlab.train.trainer import ArmorLabTrainer

    def correct(prompts, completions, answer, **kw):
        return [1.0 if c == a else 0.0 for c, a in zip(completions, answer, strict=True)]

    fake = SimpleNamespace(reward_funcs=[correct, OverlongPenalty(4, 2, 1.0)], reward_weights=torch.ones(2),
                           state=None, _as_completion=lambda c, p: c)
    out = ArmorLabTrainer._reward_values(fake, ["p", "p"], ["7", "8"], [[1, 2, 3, 4], [1, 2, 3, 4]],
                                         [{"answer": "7"}, {"answer": "7"}])
    assert out == [1.0, 0.0]  # a 4-token completion would lose 1.0 to the punishment; here it does not
    fake.reward_funcs[1].shapes_length = False  # planted: the shaping counted
    out = ArmorLabTrainer._reward_values(fake, ["p", "p"], ["7", "8"], [[1, 2, 3, 4], [1, 2, 3, 4]],
                                         [{"answer": "7"}, {"answer": "7"}])
    assert out == [0.0, -1.0]


@pytest.mark.parametrize("text,expected", [
    ("x = 2, so\nAnswer: 4", "4"),
    ("answer:  \\frac{1}{2}\nmore text", "\\frac{1}{2}"),      # case-insensitive, to the end of its line
    ("Answer: 3\nthen again\nAnswer: 5", "5"),                  # the last one
    ("The result is \\boxed{5}", None),
    ("Answer: 1\n" + "y" * 400, None),                          # outside the last 300 characters
])
def test_answer_line_as_math_dapo_reads_it(text, expected):
    assert answer_line(text) == expected


def test_answer_line_reward():
    completions = ["work\nAnswer: 0.5", "Answer: \\frac{1}{2}", "Answer: 3", "so \\boxed{7}", "no answer"]
    answers = ["\\frac{1}{2}", "0.5", "4", "7", "7"]
    # equal values in other notations count (math-verify); no "Answer:" line: the boxed answer
    assert answer_line_reward(completions=completions, answer=answers) == [1.0, 1.0, 0.0, 1.0, 0.0]


def test_config_options(tmp_path):
    data = tmp_path / "d.jsonl"
    data.write_text("".join(f'{{"problem": "{i} + 1 = ?", "answer": "{i + 1}"}}\n' for i in range(40)))
    base = {"task": {"name": "math", "path": str(data), "val_size": 4, "test_size": 4}}
    plain = resolve(base, check_paths=False)
    assert "scorer" not in plain["task"] and "val_top_p" not in plain and "overlong_buffer_len" not in plain
    dapo = resolve({**base, "task": {**base["task"], "scorer": "answer_line", "prompt_template": "dapo"},
                    "val_top_p": 0.7, "overlong_buffer_len": 4, "max_completion_length": 8}, check_paths=False)
    assert dapo["task"]["scorer"] == "answer_line" and dapo["task"]["prompt_template"] == "dapo"
    assert dapo["val_top_p"] == 0.7 and dapo["overlong_buffer_len"] == 4
    with pytest.raises(ArmorLabError) as err:
        resolve({"overlong_buffer_len": 8, "max_completion_length": 8}, file="c.yaml")
    assert err.value.key == "overlong_buffer_len" and err.value.value == 8 and "c.yaml" in str(err.value)
    # the factor is inert without a buffer: one run id
    assert resolve({"overlong_penalty_factor": 0.5}) == resolve({})
    from armorlab.tasks.mathfile import make_prompt

    assert make_prompt("2 + 2?", template="dapo", system=None, chat=False) == DAPO_PROMPT_TEMPLATE.replace(
        "{problem}", "2 + 2?")
    assert not math.isnan(resolve({"overlong_buffer_len": 2, "overlong_penalty_factor": 0.5})["overlong_penalty_factor"])

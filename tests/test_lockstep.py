"""benchmarks/lockstep.py: trainers take single steps in turn, time only their own steps, and draw
the random numbers they would draw alone."""

import importlib.util
import random
import threading
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

_spec = importlib.util.spec_from_file_location("lockstep", Path(__file__).parents[1] / "benchmarks" / "lockstep.py")
lockstep = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(lockstep)

_fake_time = threading.local()


def fake_clock() -> float:
    return getattr(_fake_time, "t", 0.0)


class FakeTrainer:
    """Calls on_step_begin as transformers' loop does; each step costs ``costs[i]`` on the fake clock."""

    def __init__(self, name, costs, log, fail_at=None):
        self.name, self.costs, self.log, self.fail_at = name, costs, log, fail_at
        self.callbacks, self.draws = [], []

    def add_callback(self, callback):
        self.callbacks.append(callback)

    def train(self):
        _fake_time.t = 100.0  # setup before the first step: must not be timed
        for step, cost in enumerate(self.costs):
            for cb in self.callbacks:
                cb.on_step_begin(None, SimpleNamespace(global_step=step), None)
            if step == self.fail_at:
                raise ValueError(f"{self.name} broke at step {step}")
            self.log.append((self.name, step))
            self.draws.append((torch.rand(1).item(), np.random.rand(), random.random()))
            _fake_time.t += cost


def test_steps_alternate_one_each_and_the_order_rotates_every_round():
    log = []
    trainers = {n: FakeTrainer(n, [1.0] * 3, log) for n in "abc"}
    lockstep.run_lockstep(trainers, clock=fake_clock)
    # round 0 only reaches each first on_step_begin; round r runs step r-1, order rotated by r
    assert log == [("b", 0), ("c", 0), ("a", 0),
                   ("c", 1), ("a", 1), ("b", 1),
                   ("a", 2), ("b", 2), ("c", 2)]


def test_each_step_is_timed_on_its_own_trainer_clock_and_the_last_is_not():
    trainers = {"a": FakeTrainer("a", [1.0, 2.0, 4.0, 8.0], []), "b": FakeTrainer("b", [0.5, 0.25, 0.125], [])}
    steps = lockstep.run_lockstep(trainers, clock=fake_clock)
    assert steps == {"a": [1.0, 2.0, 4.0], "b": [0.5, 0.25]}


def test_every_trainer_draws_the_numbers_it_would_draw_alone():
    def draws(names, shared_seed):
        trainers, rng = {}, {}
        for i, name in enumerate(names):
            torch.manual_seed(shared_seed + i)
            np.random.seed(shared_seed + i)
            random.seed(shared_seed + i)
            rng[name] = lockstep.rng_state()
            trainers[name] = FakeTrainer(name, [1.0] * 4, [])
        lockstep.run_lockstep(trainers, clock=fake_clock, rng=rng)
        return {name: t.draws for name, t in trainers.items()}

    together = draws(["a", "b", "c"], 7)
    assert together["a"] == draws(["a"], 7)["a"]
    assert together["c"] == draws(["c"], 9)["c"]
    assert together["a"] != together["b"]  # different seeds really give different streams


def test_the_callers_rng_state_is_left_as_it_was():
    torch.manual_seed(3)
    expected = torch.rand(3)
    torch.manual_seed(3)
    lockstep.run_lockstep({"a": FakeTrainer("a", [1.0] * 3, [])}, clock=fake_clock)
    assert torch.equal(torch.rand(3), expected)


def test_a_failing_trainer_lets_the_others_finish_then_is_raised_by_name():
    log = []
    trainers = {"ok": FakeTrainer("ok", [1.0] * 4, log), "bad": FakeTrainer("bad", [1.0] * 4, log, fail_at=2)}
    with pytest.raises(RuntimeError, match="'bad'") as info:
        lockstep.run_lockstep(trainers, clock=fake_clock)
    assert isinstance(info.value.__cause__, ValueError)
    assert [s for n, s in log if n == "ok"] == [0, 1, 2, 3]
    assert [s for n, s in log if n == "bad"] == [0, 1]


def test_cycles_sum_whole_cycles_and_drop_the_warm_up():
    assert lockstep.cycles([1, 2, 3, 4, 5, 6, 7], per_cycle=2) == [7, 11]
    assert lockstep.cycles([1, 2, 3, 4, 5, 6], per_cycle=3, warmup=0) == [6, 15]
    assert lockstep.cycles([1, 2], per_cycle=2) == []

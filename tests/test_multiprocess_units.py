"""The multi-process launch rules without starting processes (tests/test_multiprocess.py starts them)."""

from __future__ import annotations

import signal

import pytest

from armorlab.core.config import resolve
from armorlab.core.runs import RunDir
from armorlab.errors import ArmorLabError
from armorlab.sweeps.jobs import TrainJob
from armorlab.sweeps.status import collect
from armorlab.train.launch import check_launch, process_layout


@pytest.mark.parametrize(("env", "layout"), [
    ({}, (0, 1)),
    ({"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1"}, (1, 2)),  # torchrun, accelerate --multi_gpu
    ({"OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_SIZE": "4"}, (3, 4)),  # accelerate --cpu with mpirun
    ({"PMI_RANK": "0", "PMI_SIZE": "2"}, (0, 2)),
])
def test_process_layout_from_the_launchers_environment(env, layout):
    assert process_layout(env) == layout


def test_accelerate_cpu_that_starts_one_process_is_refused():
    # what `accelerate launch --cpu --num_processes 2` hands its single process
    single = {"ACCELERATE_USE_CPU": "True", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}
    with pytest.raises(ArmorLabError, match="--multi_gpu"):
        check_launch(single)
    check_launch({**single, "RANK": "0", "WORLD_SIZE": "2"})  # really several processes
    check_launch({"ACCELERATE_USE_CPU": "True"})  # --cpu alone: one process was asked for
    check_launch({})


def test_world_size_is_kept_in_status_and_shown_by_status(tmp_path):
    rd = RunDir.create(tmp_path / "sweep", resolve({"seed": 1}))
    assert "world_size" not in rd.read_status()  # nothing claimed before a training attempt
    rd.write_status("running", world_size=2)
    assert rd.write_status("completed")["world_size"] == 2
    assert rd.write_status("running", world_size=1)["world_size"] == 1  # the new attempt's
    (row,) = collect(tmp_path / "sweep").rows
    assert row.world_size == 1


def test_interrupting_a_multi_process_launcher_sends_sigterm(tmp_path, monkeypatch):
    sent = []
    monkeypatch.setattr("os.killpg", lambda pid, sig: sent.append(sig))

    class Running:
        pid, returncode = 12345, None

    for launcher, want in (("python", signal.SIGUSR1), ("accelerate", signal.SIGTERM)):
        job = TrainJob(tmp_path, launcher=launcher, accelerate_config="x.yaml")
        job._proc = Running()
        assert job.interrupt()
        assert sent[-1] == want

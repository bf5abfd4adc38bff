"""Cluster profiles → submitit parameters and sbatch text; Slurm output parsing; array chunking."""

from __future__ import annotations

from pathlib import Path

import pytest

from armorlab.errors import ArmorLabError
from armorlab.sweeps import slurmctl
from armorlab.sweeps.executors import SlurmSubmitter, n_arrays
from armorlab.sweeps.profile import Profile, load_profile, parse_profile

REPO = Path(__file__).resolve().parents[1]


def test_shipped_profiles_load():
    default = load_profile(REPO / "slurm" / "default.yaml")
    assert default.executor == "local" and default.workers == 1
    gpu = load_profile(REPO / "slurm" / "gpu-example.yaml")
    assert gpu.executor == "slurm" and gpu.launcher == "accelerate"
    assert Path(gpu.accelerate_config).is_file()  # resolved next to the profile
    assert load_profile(None) == Profile()


def test_submitit_parameters_use_slurm_names():
    prof = parse_profile({"partition": "gpu", "account": "a", "qos": "q", "nodes": 2, "gpus_per_node": 4,
                          "cpus_per_task": 8, "mem_gb": 1.5, "time_min": 90, "array_parallelism": 3,
                          "signal_delay_s": 60, "setup": ["module load x"], "sbatch": {"constraint": "a100"}})
    params = prof.submitit_parameters(job_name="n")
    assert params == {"job_name": "n", "nodes": 2, "time": 90, "array_parallelism": 3, "signal_delay_s": 60,
                      "ntasks_per_node": 1, "stderr_to_stdout": False, "partition": "gpu", "account": "a",
                      "qos": "q", "cpus_per_task": 8, "gpus_per_node": 4, "mem": "1536MB",
                      "setup": ["module load x"], "additional_parameters": {"constraint": "a100"}}
    # no GPUs requested → no --gpus-per-node at all (clusters without GRES reject =0)
    assert "gpus_per_node" not in Profile().submitit_parameters()


@pytest.mark.parametrize("data, key", [
    ({"partiton": "gpu"}, "partiton"),
    ({"executor": "kubernetes"}, "executor"),
    ({"workers": 0}, "workers"),
    ({"time_min": "1h"}, "time_min"),
    ({"setup": "module load x"}, "setup"),
    ({"sbatch": {"bad key": 1}}, "sbatch"),
    ({"sbatch": {"constraint": ["a", "b"]}}, "sbatch"),
    ({"launcher": "accelerate"}, "accelerate_config"),
])
def test_profile_errors_name_key_and_file(data, key, tmp_path):
    with pytest.raises(ArmorLabError) as err:
        parse_profile(data, path=tmp_path / "p.yaml")
    assert err.value.key == key and "p.yaml" in str(err.value)


def test_sbatch_text_quotes_values_and_sets_the_array(tmp_path):
    prof = parse_profile({"array_parallelism": 2, "time_min": 5, "signal_delay_s": 30,
                          "sbatch": {"comment": "$(touch x); `id`"}})
    text = SlurmSubmitter(tmp_path, prof, job_name="s").sbatch_text(5)
    assert "#SBATCH --array=0-4%2" in text and "#SBATCH --signal=USR2@30" in text
    assert "#SBATCH --comment='$(touch x); `id`'" in text  # single-quoted: the shell never runs it
    assert "#SBATCH --time=5" in text and "-m armorlab.sweeps.array_task" in text  # one file per array
    single = SlurmSubmitter(tmp_path, prof, job_name="s").sbatch_text(1)
    assert "--array" not in single and "-m submitit.core._submit" in single  # submitit's plain job


def test_chunks_follow_max_array_size():
    prof = parse_profile({"max_array_size": 300})
    sub = SlurmSubmitter(Path("/tmp"), prof, job_name="s")
    assert sub.chunk_size(1001) == 300 and sub.chunk_size(100) == 100
    assert SlurmSubmitter(Path("/tmp"), Profile(), job_name="s").chunk_size(1001) == 1001
    assert [n_arrays(n, 1000) for n in (0, 1, 1000, 1001, 2500)] == [0, 1, 1, 2, 3]


def test_slurm_output_parsing():
    text = "12_0|COMPLETED\n12_[3-5%2]|PENDING\n12_1|CANCELLED by 0\n12_2.batch|COMPLETED\n13|RUNNING\n"
    assert slurmctl._parse(text) == {"12_0": "COMPLETED", "12_3": "PENDING", "12_4": "PENDING",
                                     "12_5": "PENDING", "12_1": "CANCELLED", "13": "RUNNING"}
    assert slurmctl._expand("7_[1,4-5]") == ["7_1", "7_4", "7_5"]
    assert slurmctl.is_active("REQUEUED") and not slurmctl.is_active("TIMEOUT")


def test_max_array_size_falls_back_without_slurm(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    assert slurmctl.max_array_size() == 1000
    assert not slurmctl.reachable()

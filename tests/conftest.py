import os

import pytest

# Offline by default: nothing in the suite may reach a hub.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("MPLBACKEND", "Agg")


def pytest_collection_modifyitems(config, items):
    """Tests marked ``vllm`` need vLLM (`make test-vllm` builds .venv-vllm for them): skipped without it."""
    import importlib.util


    if importlib.util.find_spec("vllm") is not None:
        return
    skip = pytest.mark.skip(reason="vLLM is not installed here: `make test-vllm` runs these")
    for item in items:
        if "vllm" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="module")
def three_arms(tmp_path_factory):
    """dapo collapses to 0.2 in every seed; armor and up end at 0.5 + k/30 (test_analysis_report's curves)."""
    from tests.test_analysis_report import armor_val, dapo_val, write_run

    root = tmp_path_factory.mktemp("three_arms") / "sw"
    for k in range(3):
        write_run(root, "dapo", k, dapo_val(k), 0.05)
        write_run(root, "armor", k, armor_val(k), 0.1)
        write_run(root, "up", k, armor_val(k), 0.1)
    return root

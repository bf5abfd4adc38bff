import os

# Offline by default: nothing in the suite may reach a hub.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("MPLBACKEND", "Agg")


def pytest_collection_modifyitems(config, items):
    """Tests marked ``vllm`` need vLLM (`make test-vllm` builds .venv-vllm for them): skipped without it."""
    import importlib.util

    import pytest

    if importlib.util.find_spec("vllm") is not None:
        return
    skip = pytest.mark.skip(reason="vLLM is not installed here: `make test-vllm` runs these")
    for item in items:
        if "vllm" in item.keywords:
            item.add_marker(skip)

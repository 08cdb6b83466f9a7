import pytest
import torch


def pytest_collection_modifyitems(config, items):
    """Tests marked `gpu` need a CUDA device: they skip (not fail) on machines without one, such as CI."""
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)

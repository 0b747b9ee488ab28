import pytest
import torch


@pytest.fixture(autouse=True)
def _float64_default():
    """Tests run in float64 unless they say otherwise (the verification tolerances are keyed by dtype)."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(previous)


@pytest.fixture
def generator():
    return torch.Generator().manual_seed(1234)


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)

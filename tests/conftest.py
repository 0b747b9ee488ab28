import pytest
import torch


@pytest.fixture(autouse=True)
def _float64_default_and_fixed_seed():
    """Tests run in float64 unless they say otherwise (the verification tolerances are keyed by dtype),
    and every test starts from the same global torch seed, so none depends on the order tests run in."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    torch.manual_seed(0)
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


@pytest.fixture
def one_thread():
    """One intra-op thread: tiny matrices on a shared 2-core machine are ~100× slower with two spinning threads."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)

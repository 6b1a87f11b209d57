"""Shared test fixtures."""

import pytest
import torch


@pytest.fixture(scope="module")
def one_thread():
    """The test tensors are tiny: a second intra-op thread costs more than it saves (10x on a busy
    2-core machine). Modules opt in with `pytestmark`; the setting is restored after the module."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)

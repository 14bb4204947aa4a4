"""Policy tests: one torch thread (the CI box is shared; OpenMP spin-waits across busy
cores cost far more than a second thread gains for these tiny models)."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True)
def _one_torch_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)

"""Fixtures for the sw.compress tests (shared helpers: compress_testutil.py)."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True)
def _one_thread():
    # Tests share 2 cores with other jobs; the small layers and models gain nothing from threads.
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)

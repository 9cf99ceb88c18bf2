# SPDX-License-Identifier: Apache-2.0
# The zinf package under test comes from the build tree (PYTHONPATH set by ctest).
import pytest
import torch


@pytest.fixture
def rng():
    return torch.Generator().manual_seed(1234)

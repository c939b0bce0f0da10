"""Fixtures of the fault tests (helpers in tests/fault_injection.py)."""
from __future__ import annotations

import pytest
from fault_injection import FaultReward


@pytest.fixture(scope="module")
def fault_reward(tmp_path_factory):
    """A faulty reward file (tests/faults/fault_reward.py) and its control switch."""
    return FaultReward(tmp_path_factory.mktemp("fault_reward"))

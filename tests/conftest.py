"""Shared test settings: hypothesis profiles, a seed fixture, CUDA skipping.

Profiles: ``ci`` (derandomized, few examples; selected by .ci/run) and ``dev``
(more examples, the default locally). Choose with HYPOTHESIS_PROFILE=ci|dev.
"""

import os

import pytest
import torch
from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci",
    max_examples=20,
    derandomize=True,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile(
    "dev",
    max_examples=100,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))


@pytest.fixture(autouse=True)
def _seed():
    """Every test starts from the same torch seed (functd itself never uses it)."""
    torch.manual_seed(0)
    yield


def pytest_collection_modifyitems(config, items):
    if os.environ.get("FUNCTD_SLOW") != "1":  # slow: minutes each (tests/test_wheel.py)
        slow = pytest.mark.skip(reason="slow: set FUNCTD_SLOW=1 to run it")
        for item in items:
            if "slow" in item.keywords:
                item.add_marker(slow)
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)

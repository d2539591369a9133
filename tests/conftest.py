"""Split the CPU into two logical devices before TensorFlow initialises, for mirrored tests."""

import os
import sys

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(__file__))

import kerastrain  # noqa: E402

kerastrain.configure_cpu_devices(2)


@pytest.fixture
def two_cpus():
    return {"cpu_devices": 2}

"""Split the CPU into two logical devices before TensorFlow initialises, for mirrored tests."""

import os
import sys
import tempfile

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(__file__))

import kerastrain  # noqa: E402
from kerastrain import _logging  # noqa: E402


def _start_tensorflow_quietly():
    """TensorFlow's C++ start-up lines (and cuInit's failure without a GPU) would otherwise
    end the README's test command's output, after the summary: hold them back as the CLI
    does; anything else TensorFlow says while starting still prints."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as held:
        os.dup2(held.fileno(), 2)
        try:
            kerastrain.configure_cpu_devices(2)   # imports TensorFlow
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            held.seek(0)
            for line in held.read().decode("utf-8", "replace").splitlines():
                if not (_logging._STARTUP_NOISE.match(line) or _logging._NO_CUDA.match(line)):
                    print(line, file=sys.stderr)


_start_tensorflow_quietly()


@pytest.fixture
def two_cpus():
    return {"cpu_devices": 2}

"""Split the CPU into two logical devices before TensorFlow initialises, for mirrored tests;
the fixtures every test directory shares: `two_cpus`, `make_trainer`, `tf_config_cluster`."""

import os
import sys
import tempfile

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(__file__))

import helpers  # noqa: E402
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


@pytest.fixture
def make_trainer():
    """`make_trainer(dataset_fn=None, model=helpers.build_model, **options)`: a `kt.Trainer`
    with the tests' defaults (verbose 0; checkpoints and TensorBoard off unless `options`
    ask for them), closed when the test ends. Options are the Trainer's own."""
    trainers = []

    def make(dataset_fn=None, *, model=helpers.build_model, **options):
        options = {"verbose": 0, "checkpoint": False, "tensorboard": False, **options}
        trainers.append(kerastrain.Trainer(model, dataset_fn, **options))
        return trainers[-1]

    yield make
    for trainer in trainers:
        trainer.close()


@pytest.fixture
def tf_config_cluster():
    """`tf_config_cluster(chief=1, worker=2, ps=1)`: a `helpers.LocalCluster`, a TF_CONFIG
    cluster of local processes on free loopback ports; every process it started is killed
    when the test ends. (A local in-process ps cluster, `strategy={"name": "ps", ...}`
    without TF_CONFIG, runs in a process of its own: once a process joins a cluster it
    stays in it, so not in the test process.)"""
    clusters = []

    def make(**tasks):
        clusters.append(helpers.LocalCluster(**tasks))
        return clusters[-1]

    yield make
    for cluster in clusters:
        cluster.kill()

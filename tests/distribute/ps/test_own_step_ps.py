"""A model's own `train_step` under parameter servers: a VAE and a GAN train as on one
device, and its metrics lose no update when two workers run steps concurrently."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import _own_step_models as models
import helpers
import kerastrain as kt

pytestmark = pytest.mark.multiprocess

PS = {"name": "ps", "num_workers": 1, "num_ps": 1}


def _start(jobs, out):
    env = helpers.child_env(TF_CPP_MIN_LOG_LEVEL="2")
    env.pop("TF_CONFIG", None)
    return subprocess.Popen([sys.executable, "tests/_own_step_worker.py", json.dumps(jobs), out],
                            cwd=helpers.REPO, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def test_a_vae_and_a_gan_train_under_ps_as_on_one_device_and_metrics_count_exactly(tmp_path):
    """One process per cluster size (TensorFlow starts once for the jobs of a local cluster;
    each job is its own Trainer, as in separate processes)."""
    clusters = {
        "one_worker": {"vae": {"model": "vae", "strategy": PS, "epochs": 2},
                       "gan": {"model": "gan", "strategy": PS, "epochs": 2},
                       "raw_loss": {"model": "raw_loss", "strategy": PS, "epochs": 2}},
        # 2 workers, 48 steps an epoch: concurrent updates of the model's `Sum`.
        "two_workers": {"counting": {"model": "counting", "epochs": 2, "steps": 48,
                                     "repeat": True, "strategy": dict(PS, num_workers=2),
                                     "steps_per_loop": 4}}}
    procs = {name: _start(jobs, str(tmp_path) + os.sep) for name, jobs in clusters.items()}
    try:
        outputs = {name: p.communicate(timeout=400)[0] for name, p in procs.items()}
    finally:
        for p in procs.values():
            p.kill()
    for name, p in procs.items():
        assert p.returncode == 0, name + outputs[name][-4000:]
    results = {name: json.loads((tmp_path / f"{name}.json").read_text())
               for jobs in clusters.values() for name in jobs}

    assert min(results["raw_loss"]["history"]["loss"]) > 0  # the step's loss, not 0
    for name in ("vae", "gan", "raw_loss"):
        trainer = kt.Trainer(models.BUILDERS[name], models.dataset, strategy="one_device",
                             verbose=0, steps_per_loop=2)
        expected = trainer.fit(epochs=2).history
        got = results[name]["history"]
        assert set(got) == set(expected) and len(got) > (name != "raw_loss"), (got, expected)
        for key in expected:
            np.testing.assert_allclose(got[key], expected[key], rtol=1e-5, err_msg=name + key)
        for ours, theirs in zip(results[name]["weights"], trainer.model.get_weights()):
            np.testing.assert_allclose(np.asarray(ours), theirs, rtol=1e-5, atol=1e-6)

    counting = results["counting"]
    assert counting["history"]["count"] == [48 * 16, 48 * 16]
    assert counting["global_step"] == 96

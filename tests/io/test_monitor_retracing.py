"""Many Trainers in one process (a sweep, a notebook, the tests) make TensorFlow warn of nothing."""

import logging

from helpers import arrays


def test_a_sweep_of_trainers_in_one_process_does_not_make_tensorflow_warn_of_retracing(
        make_trainer, tmp_path, caplog):
    """Each NumPy input compiled its own pass permutation and each TensorBoard writer its
    own scalar writer: after five, TensorFlow warned "5 out of the last 5 calls ... triggered
    tf.function retracing ... creating @tf.function repeatedly in a loop", about kerastrain's
    functions, not the user's."""
    x, y = arrays(32)
    with caplog.at_level(logging.WARNING):
        for i in range(6):
            trainer = make_trainer(None, strategy="one_device", seed=i,
                                   model_dir=str(tmp_path / f"run{i}"), tensorboard=True)
            trainer.fit((x, y), batch_size=8, epochs=2)
    assert "retracing" not in caplog.text
    assert (tmp_path / "run5" / "logs").exists() or any((tmp_path / "run5").rglob("events.*"))

"""Subprocess entry for multi-process tests: train as told by a JSON job, save results.

Usage: python tests/_worker.py JOB_JSON OUT_PREFIX
       python tests/_worker.py '[[JOB, OUT_PREFIX], ...]'
The second form runs the jobs one after another in this process (TensorFlow started once;
under ps, one local cluster: they must ask for the same cluster size), each job's log
following a line `@@ job INDEX` on stderr.
"""

import json
import sys
import time

sys.path.insert(0, __import__("os").path.dirname(__file__))

import helpers  # noqa: E402


def main():
    helpers.run_jobs(run, sys.argv)


def run(job, out):
    import kerastrain as kt  # the strategy must be built before any TF op runs
    import numpy as np
    import tensorflow as tf

    if job.get("data") == "slow":
        import os
        marker = job["started_marker"]

        def slow(x, y):
            if not os.path.exists(marker):
                open(marker, "w").close()
            time.sleep(0.03)
            return x, y

        def dataset_fn(ctx):
            x, y = helpers.arrays(job.get("n", 96))
            ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(helpers.GLOBAL_BATCH)
            return ds.map(lambda a, b: tf.py_function(slow, [a, b], [tf.float32, tf.float32])) \
                .map(lambda a, b: (tf.ensure_shape(a, [None, helpers.FEATURES]),
                                   tf.ensure_shape(b, [None, 1])))
    elif job.get("data") == "shuffled":
        def dataset_fn(ctx):
            x, y = helpers.arrays(job.get("n", 96))
            return tf.data.Dataset.from_tensor_slices((x, y)).shuffle(96, seed=7).batch(
                ctx.get_per_replica_batch_size(helpers.GLOBAL_BATCH))
    elif job.get("data") == "infinite":
        def dataset_fn(ctx):
            x, y = helpers.arrays(job.get("n", 96))
            return tf.data.Dataset.from_tensor_slices((x, y)).shuffle(96, seed=1).repeat().batch(
                ctx.get_per_replica_batch_size(helpers.GLOBAL_BATCH))
    else:
        dataset_fn = helpers.global_batch_dataset_fn(job.get("n", 96))
    model = helpers.build_counting_model if job.get("counting") else helpers.build_model
    registered = count_registrations_per_save() if job.get("count_registrations") else None
    if job.get("instance"):
        # A compiled model built the ordinary way, outside any scope, handed over as is.
        import keras
        keras.utils.set_random_seed(0)
        model = helpers.build_model()
        # Metric objects given to compile (keras.io's way) are made with their variables,
        # before the Trainer connects to a cluster.
        model.compile(optimizer="adam", loss="binary_crossentropy",
                      metrics=["accuracy", keras.metrics.AUC(name="auc")])
        if job.get("prior") == "both":
            x, y = helpers.arrays(16)
            model.predict(x, verbose=0)
            model.fit(x, y, batch_size=8, verbose=0)
        initial = model.get_weights()
    if job.get("optimizer_object"):
        # An optimizer object made the ordinary way, before the Trainer (and its cluster).
        import keras
        job["optimizer"] = keras.optimizers.Adam(learning_rate=job["optimizer_object"])
    trainer = kt.Trainer(model, dataset_fn, strategy=job["strategy"], seed=0,
                         optimizer=job.get("optimizer"),
                         verbose=job.get("verbose", 0), model_dir=job.get("model_dir"),
                         steps_per_loop=job.get("steps_per_loop", "auto"),
                         tensorboard=job.get("tensorboard", True),
                         checkpoint=job.get("checkpoint", True),
                         tuning=job.get("tuning", True))
    callbacks, seen = [], []
    if job.get("instance"):
        # A callback that closes over the user's object, as keras.io callbacks often do.
        import keras
        callbacks.append(keras.callbacks.LambdaCallback(
            on_epoch_end=lambda epoch, logs: seen.append(max(
                float(np.max(np.abs(a - b)))
                for a, b in zip(model.get_weights(), trainer.model.get_weights())))))
    if job.get("sleep_per_step"):
        import keras
        callbacks.append(keras.callbacks.LambdaCallback(
            on_train_batch_end=lambda b, logs: time.sleep(job["sleep_per_step"])))
    history = trainer.fit(epochs=job["epochs"], steps_per_epoch=job.get("steps_per_epoch"),
                          callbacks=callbacks)
    result = {
        "history": history.history,
        "global_step": trainer.global_step,
        "iterations": (int(trainer.model.optimizer.iterations.numpy())
                       if trainer.model.optimizer else None),
        "is_chief": trainer.is_chief,
        "optimizer": [type(trainer.model.optimizer).__name__,
                      float(trainer.model.optimizer.learning_rate.numpy())],
        "ckpt_background": getattr(trainer._state.run.checkpointer, "background", None),
        "stop_flag_device": trainer._state.stop_flag.device,
        # Every variable's place, or its shards' places when it is partitioned.
        "devices": sorted({part.device for v in trainer.model.variables
                           for part in getattr(v.value, "variables", [v.value])}),
        "shards": {v.path: len(v.value.variables) for v in trainer.model.variables
                   if hasattr(v.value, "variables")},
        "evaluate": trainer.evaluate(helpers.global_batch_dataset_fn(job.get("n", 96)))
        if job.get("evaluate") else None,
        # Every task predicts all of x itself (kerastrain.loop.predicting): 96 examples, batches of
        # 10, a last one of 6.
        "predict": trainer.predict(helpers.arrays(job.get("n", 96))[0], batch_size=10).tolist()
        if job.get("predict") else None,
    }
    if job.get("counting"):
        result["count"] = float(trainer.model.get_layer("count").count.numpy())
    if job.get("instance"):
        # The user's own object holds what was trained.
        result["user_vs_trained"] = max(float(np.max(np.abs(a - b))) for a, b in zip(
            model.get_weights(), trainer.model.get_weights()))
        result["user_vs_initial"] = max(float(np.max(np.abs(a - b))) for a, b in zip(
            model.get_weights(), initial))
        result["user_vs_trained_at_epoch_ends"] = seen
        if job.get("use_after_fit"):
            result["used_after_fit"] = helpers.use_after_fit(model, trainer,
                                                             job["use_after_fit"])
    if registered is not None:
        result["registered_per_save"] = registered
    if job.get("fresh_restore"):
        # A fresh trainer on the same model_dir asked for the same epochs: it restores
        # and has nothing left to train.
        again = kt.Trainer(helpers.build_model, dataset_fn, strategy=job["strategy"], seed=1,
                           verbose=0, model_dir=job.get("model_dir"))
        again.fit(epochs=job["epochs"], steps_per_epoch=job.get("steps_per_epoch"))
        result["fresh_global_step"] = again.global_step
        result["fresh_max_weight_diff"] = max(
            float(np.max(np.abs(a - b))) for a, b in zip(again.model.get_weights(),
                                                          trainer.model.get_weights()))
    np.savez(out + ".npz", *[np.asarray(w) for w in trainer.model.get_weights()])
    with open(out + ".json", "w") as f:
        json.dump(result, f)


def count_registrations_per_save():
    """The number of functions registered with the eager context (and so sent to every
    task of a cluster) during each checkpoint save of this process, in order."""
    from tensorflow.python.eager import context

    from kerastrain.io import checkpoints
    counted, per_save = [0], []
    cls = type(context.context())
    for name in ("add_function_def", "add_c_function"):
        def counting(self, *args, _original=getattr(cls, name)):
            counted[0] += 1
            return _original(self, *args)
        setattr(cls, name, counting)
    save = checkpoints.Checkpointer.save

    def counted_save(self, step):
        before = counted[0]
        try:
            return save(self, step)
        finally:
            per_save.append(counted[0] - before)
    checkpoints.Checkpointer.save = counted_save
    return per_save


if __name__ == "__main__":
    main()

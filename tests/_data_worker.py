"""Subprocess entry for input-pipeline tests: record which examples each worker reads, then train.

Usage: python tests/_data_worker.py JOB_JSON OUT_PREFIX
"""

import json
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))

import helpers  # noqa: E402

BATCH = 8


def main():
    job = json.loads(sys.argv[1])
    out = sys.argv[2]
    import kerastrain as kt  # the strategy must be built before any TF op runs
    import keras
    import tensorflow as tf

    class Count(keras.metrics.Metric):
        """Examples seen (a sum), to check that each is trained on exactly once."""

        def __init__(self, name="count", **kwargs):
            super().__init__(name=name, **kwargs)
            self.total = self.add_variable(shape=(), initializer="zeros", name="total")

        def update_state(self, y_true, y_pred, sample_weight=None):
            self.total.assign_add(keras.ops.cast(keras.ops.shape(y_true)[0], "float32"))

        def result(self):
            return self.total

    # One Trainer, hence one strategy, for the whole process: a second multi-worker
    # strategy in the same process can mismatch collective keys between workers.
    trainer = kt.Trainer(helpers.build_model, strategy=job["strategy"], seed=0, verbose=0,
                         metrics=lambda: ["accuracy", Count()])
    built = trainer._built

    from kerastrain import examples
    from kerastrain.data.distributed import DistributedInput

    def files_data(directory, with_ids):
        parse = examples.example_parser(helpers.FEATURES, 1, with_ids=with_ids)
        return lambda: kt.data.files(os.path.join(directory, "*.tfrecord"), parse,
                                     batch_size=BATCH, seed=3)

    strategy = built.strategy

    @tf.function
    def next_ids(iterator):
        optional = iterator.get_next_as_optional()
        if optional.has_value():
            ids = strategy.experimental_local_results(optional.get_value()[2])
            return tf.concat(ids, axis=0), True
        return tf.zeros([0], tf.int64), False

    results = {}
    for scenario in job["scenarios"]:
        try:
            policy = trainer._state.mode.input_policy()
            kind = policy.input_type(scenario["name"], DistributedInput)  # ps: WorkerInput
            data = kind(built, files_data(scenario["dir"], True), shard=scenario["shard"],
                        role=scenario["name"], policy=policy)
        except ValueError as e:
            results[scenario["name"]] = {"error": str(e)}
            continue
        seen = []
        if built.is_parameter_server:
            # What each worker's dataset function builds: worker i's shard, one pass.
            seen = [[int(i) for batch in data._worker_dataset(w, repeat=False)
                     for i in batch[2].numpy()] for w in range(built.num_workers)]
        else:
            for _ in range(2):  # two epochs: two passes over the distributed dataset
                iterator, ids = iter(data.distributed()), []
                while True:
                    batch, more = next_ids(iterator)
                    if not bool(more):
                        break
                    ids.extend(int(i) for i in batch.numpy())
                seen.append(ids)
        results[scenario["name"]] = {"policy": data.plan.policy, "seen": seen}

    fit = job.get("fit")
    if fit:
        data = (helpers.arrays(fit["numpy"])[0], helpers.arrays(fit["numpy"])[1]) \
            if fit.get("numpy") else files_data(fit["dir"], False)
        history = trainer.fit(data, epochs=fit["epochs"], steps_per_epoch=fit.get("steps"),
                              batch_size=BATCH if fit.get("numpy") else None,
                              validation_data=data if fit.get("validate") else None)
        results["fit"] = {"history": history.history, "global_step": trainer.global_step}
    with open(out + ".json", "w") as f:
        json.dump(results, f)


if __name__ == "__main__":
    main()

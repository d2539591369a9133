"""Input forms, the sharding policy and per-replica batching (docs/data.md)."""

import json
import os

import numpy as np
import pytest

import helpers
import kerastrain as kt
from kerastrain import examples
from kerastrain.data import sharding
from kerastrain.data.distributed import DistributedInput
from kerastrain.data.ps.workers import WorkerInput
from kerastrain.loop import modes

N_FILES_EXAMPLES = 84  # 8 files of 10 or 11 examples: the two workers get 40 and 44


@pytest.fixture(scope="module")
def record_dirs(tmp_path_factory):
    """The same 84 examples written as 8 TFRecord files and as 1."""
    x, y = helpers.arrays(N_FILES_EXAMPLES)
    root = tmp_path_factory.mktemp("records")
    examples.write_tfrecords(str(root / "eight"), x, y, num_files=8)
    examples.write_tfrecords(str(root / "one"), x, y, num_files=1)
    return {"eight": str(root / "eight"), "one": str(root / "one")}


def _policy(built):
    """The input policy of `built`'s kind of strategy, as the Trainer hands it down."""
    return modes.for_strategy(built).input_policy()


def _files(pattern):
    return lambda: kt.data.files(pattern, examples.example_parser(helpers.FEATURES, 1),
                                 batch_size=16)


# -- per-replica batching ---------------------------------------------------------

def test_global_batches_are_split_into_per_replica_batches(two_cpus, caplog):
    import tensorflow as tf

    built = kt.build_strategy({"name": "mirrored", **two_cpus})
    x, y = helpers.arrays(600)
    forms = {
        "dataset": tf.data.Dataset.from_tensor_slices((x, y)).batch(256),
        "function": lambda: tf.data.Dataset.from_tensor_slices((x, y)).batch(256),
        "numpy": (x, y),
    }
    for name, data in forms.items():
        with caplog.at_level("INFO", logger="kerastrain"):
            di = DistributedInput(built, data, batch_size=256 if name == "numpy" else None,
                                  policy=_policy(built))
        sizes = [[int(t.shape[0]) for t in built.strategy.experimental_local_results(batch[0])]
                 for batch in di.distributed()]
        # 600 = 256 + 256 + 88: full batches split 128/128. TensorFlow splits the last,
        # partial one as 88/0 or 44/44 depending on the pipeline's shape; kerastrain's
        # reduction is exact either way.
        assert sizes[:2] == [[128, 128], [128, 128]], (name, sizes)
        assert sum(sizes[2]) == 88 and len(sizes) == 3, (name, sizes)
        assert "each global batch of 256 is split into 2 per-replica batches of 128" in caplog.text


def test_a_global_batch_that_does_not_divide_over_the_replicas_trains_as_on_one_device(
        two_cpus, make_trainer, caplog):
    """Global batches of 5 over 2 replicas are split 3 + 2 (as Keras under MirroredStrategy);
    each replica is weighted by its share, so the losses and weights are one device's."""
    import tensorflow as tf

    x, y = helpers.arrays(25)
    results = {}
    for strategy in ["one_device", "mirrored"]:
        for data, batch_size in [((x, y), 5),
                                 (lambda: tf.data.Dataset.from_tensor_slices((x, y)).batch(5), None)]:
            options = two_cpus if strategy == "mirrored" else {}
            trainer = make_trainer(strategy={"name": strategy, **options}, seed=3)
            with caplog.at_level("INFO", logger="kerastrain"):
                history = trainer.fit(data, batch_size=batch_size, epochs=2, shuffle=False)
            results.setdefault(strategy, []).append(
                (history.history["loss"], trainer.model.get_weights(),
                 trainer.evaluate((x, y), batch_size=5)["loss"]))
    assert "each global batch of 5 is split into 2 per-replica batches of 2 or 3" in caplog.text
    for (loss_1, weights_1, eval_1), (loss_2, weights_2, eval_2) in zip(
            results["one_device"], results["mirrored"]):
        np.testing.assert_allclose(loss_1, loss_2, rtol=1e-5)
        np.testing.assert_allclose(eval_1, eval_2, rtol=1e-5)
        for a, b in zip(weights_1, weights_2):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


# -- NumPy input -----------------------------------------------------------------------

def test_numpy_input_trains_exactly_like_the_equivalent_dataset_fn(make_trainer):
    import tensorflow as tf

    x, y = helpers.arrays(100)
    w = np.linspace(0.5, 1.5, 100).astype("float32")

    def dataset_fn(ctx):
        # The order docs/data.md states: each pass a permutation keyed from the seed.
        return helpers.numpy_orders(100, 5).flat_map(lambda order: tf.data.Dataset.from_tensor_slices(
            (tf.gather(x, order), tf.gather(y, order), tf.gather(w, order)))).batch(16)

    results = []
    for data in [(x, y, w), dataset_fn]:
        trainer = make_trainer(data, strategy="one_device", seed=5)
        history = trainer.fit(epochs=3, batch_size=16 if isinstance(data, tuple) else None)
        results.append((trainer.model.get_weights(), history.history["loss"], trainer.global_step))
    (w_np, loss_np, steps_np), (w_fn, loss_fn, steps_fn) = results
    assert steps_np == steps_fn == 3 * 7
    np.testing.assert_allclose(loss_np, loss_fn, rtol=0, atol=1e-6)
    for a, b in zip(w_np, w_fn):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-6)
    # Shuffled each epoch: the first epoch's order differs from the second's.
    assert loss_np[0] != loss_np[1]


def test_a_loop_of_fits_keeps_one_copy_and_evaluation_leaves_the_training_position(make_trainer):
    import gc
    import weakref

    x, y = helpers.arrays(96)

    def run(evaluate_between):
        trainer = make_trainer(strategy="one_device", seed=2)
        data = (x, y)
        trainer.fit(data, batch_size=16, epochs=1, steps_per_epoch=4)  # 4 of 6 batches
        if evaluate_between:  # the same arrays evaluated: a separate input, own position
            trainer.evaluate(data, batch_size=16)
        trainer.fit(data, batch_size=16, epochs=2, initial_epoch=1, steps_per_epoch=4)
        return trainer

    for a, b in zip(run(False).model.get_weights(), run(True).model.get_weights()):
        np.testing.assert_array_equal(a, b)

    # Keras's idiom of one `fit` per epoch, new arrays each time: the trainer holds the
    # latest data only (it held a copy per call).
    trainer = make_trainer(strategy="one_device", seed=2)
    first = x.copy()
    gone = weakref.ref(first)
    trainer.fit((first, y), batch_size=16, epochs=1)
    del first
    trainer.fit((x.copy(), y), batch_size=16, epochs=1)
    gc.collect()
    assert gone() is None


def test_numpy_training_data_with_a_dataset_for_validation(make_trainer):
    import tensorflow as tf

    x, y = helpers.arrays(64)
    trainer = make_trainer(strategy="one_device", seed=0)
    # `batch_size` is for the NumPy training data; the validation dataset batches itself.
    history = trainer.fit((x, y), batch_size=16, epochs=1,
                          validation_dataset_fn=tf.data.Dataset.from_tensor_slices((x, y)).batch(8))
    assert trainer.global_step == 4 and "val_loss" in history.history
    with pytest.raises(ValueError, match=r"`batch_size` applies to NumPy input only"):
        trainer.evaluate(tf.data.Dataset.from_tensor_slices((x, y)).batch(8), batch_size=8)


def test_numpy_arrays_are_held_in_variables_not_graph_constants():
    import tensorflow as tf

    built = kt.build_strategy("one_device")
    x = np.random.RandomState(0).randn(20000, 50).astype("float32")  # 4 MB
    y = np.zeros((20000, 1), "float32")
    di = WorkerInput(built, (x, y), batch_size=100, policy=_policy(built))
    # The function a parameter-server worker runs to build its dataset: the arrays are
    # captured variables, not 4 MB of constants in the function sent to the worker.
    traced = tf.function(lambda: di._worker_dataset(0)).get_concrete_function()
    assert traced.graph.as_graph_def().ByteSize() < 100_000
    naive = tf.function(lambda: tf.data.Dataset.from_tensor_slices((x, y)).batch(100))
    assert naive.get_concrete_function().graph.as_graph_def().ByteSize() > 4_000_000


def test_numpy_input_errors():
    built = kt.build_strategy("one_device")
    x, y = helpers.arrays(10)
    with pytest.raises(ValueError, match=r"same number of examples.*\(\[10, 6\], \[9, 1\]\)"):
        DistributedInput(built, (x, y[:9]), batch_size=2, policy=_policy(built))
    with pytest.raises(ValueError, match=r"`batch_size` must be a positive int. Received: "
                                         r"batch_size=0"):
        DistributedInput(built, (x, y), batch_size=0, policy=_policy(built))
    with pytest.raises(ValueError, match=r"`batch_size` applies to NumPy input only.*"
                                         r"Received: batch_size=4"):
        DistributedInput(built, lambda: None, batch_size=4, policy=_policy(built))
    with pytest.raises(TypeError, match=r"not a tuple `\(x, y\)`.*Received: dataset_fn of type "
                                        r"dict"):
        DistributedInput(built, {"x": x, "y": y}, policy=_policy(built))
    with pytest.raises(TypeError, match=r"not data kerastrain can read.*Received: "
                                        r"dataset_fn='data.csv'"):
        DistributedInput(built, "data.csv", policy=_policy(built))


# -- the policy, pure --------------------------------------------------------------

def test_policy_decision_table():
    eight, one = sharding.FileSource(8, "TFRecord"), sharding.FileSource(1, "TFRecord")

    def decide(shard, source, pipelines=2, form="global_fn", ps=False):
        return sharding.decide(shard, form=form, pipelines=pipelines, source=source,
                               in_turn=ps, global_batch=256, replicas=2)
    assert decide("auto", eight).policy == "file"
    assert decide("auto", eight).sentence.startswith(
        "sharding 8 TFRecord files across 2 workers by file: 4 files each")
    assert "3 or 4 files each" in decide("auto", sharding.FileSource(7, "TFRecord")).sentence
    assert decide("auto", one).policy == "data"
    assert "the data has 1 TFRecord file, fewer than the 2 workers" in decide("auto", one).sentence
    assert decide("auto", None).policy == "data"
    assert decide("data", eight).policy == "data"
    assert decide("off", eight).policy == "off"
    assert decide("file", eight, pipelines=1).policy == "none"
    assert decide("auto", eight, form="context_fn").policy == "user"
    assert "batches i, i+2, i+4" in decide("data", None, ps=True).sentence
    with pytest.raises(ValueError, match=r"each of the 2 workers a file: the data has 1 TFRecord "
                                         r"file. Use shard='data'"):
        decide("file", one)
    with pytest.raises(ValueError, match=r"none was found in this one. Use shard='data'"):
        decide("file", None)
    with pytest.raises(ValueError, match=r"`shard` must be one of 'auto', 'file', 'data', 'off'. "
                                         r"Received: shard='files'"):
        kt.Trainer(helpers.build_model, strategy="one_device", shard="files")


def test_file_sources_and_batch_sizes_are_read_from_the_pipeline(record_dirs):
    import tensorflow as tf

    names = sorted(tf.io.gfile.glob(os.path.join(record_dirs["eight"], "*")))
    cases = {
        "helper": (_files(os.path.join(record_dirs["eight"], "*"))(), 8, 16),
        "reader": (tf.data.TFRecordDataset(names).batch(5).prefetch(1), 8, 5),
        "list_files": (tf.data.Dataset.list_files(os.path.join(record_dirs["eight"], "*"), seed=1)
                       .interleave(tf.data.TFRecordDataset).batch(3, drop_remainder=True), 8, 3),
        "one file": (tf.data.TFRecordDataset(names[0]).batch(4), 1, 4),
        "memory": (tf.data.Dataset.range(10).batch(6).map(lambda i: i * 2), None, 6),
        "unbatched": (tf.data.Dataset.range(10).batch(6).unbatch(), None, None),
    }
    for name, (ds, files, batch) in cases.items():
        source = sharding.file_source(ds)
        assert (source.count if source else None) == files, name
        assert sharding.batch_size(ds) == batch, name


# -- across processes -------------------------------------------------------------------

def _ids_by_file():
    bounds = np.linspace(0, N_FILES_EXAMPLES, 9).astype(int)
    return {i: k for k in range(8) for i in range(bounds[k], bounds[k + 1])}


@pytest.mark.multiprocess
def test_batches_within_files_hold_one_files_records_and_every_record_once(record_dirs,
                                                                            caplog):
    """The faster files mode: a batch never mixes files, a file's last batch may be short,
    and a pass still reads every record exactly once."""
    pattern = os.path.join(record_dirs["eight"], "*.tfrecord")
    bounds = np.linspace(0, N_FILES_EXAMPLES, 9).astype(int)   # write_tfrecords' runs

    def file_of(i):
        return int(np.searchsorted(bounds, i, side="right")) - 1

    from kerastrain.data import record_files
    record_files._SAID_WITHIN_FILES = False
    with caplog.at_level("INFO", logger="kerastrain"):
        ds = kt.data.files(pattern, examples.example_parser(helpers.FEATURES, 1, with_ids=True),
                           batch_size=4, batch_within_files=True, shuffle_buffer=8,
                           threads=None)
        kt.data.files(pattern, batch_size=4, batch_within_files=True)
    said = [r.getMessage() for r in caplog.records if "batch_within_files" in r.getMessage()]
    assert len(said) == 1 and "each batch holds one file's records" in said[0] and \
        "the order differs from run to run" in said[0], said
    for _ in range(2):   # two passes, each whole
        batches = [ids.numpy().tolist() for _, _, ids in ds]
        assert sorted(i for b in batches for i in b) == list(range(N_FILES_EXAMPLES))
        assert all(len({file_of(i) for i in b}) == 1 for b in batches), batches
        short = [file_of(b[0]) for b in batches if len(b) < 4]
        assert sorted(short) == sorted(set(short)) and len(short) == 8   # 10 or 11 a file
    dropped = kt.data.files(pattern, examples.example_parser(helpers.FEATURES, 1),
                            batch_size=4, batch_within_files=True, drop_remainder=True)
    assert sum(int(x.shape[0]) for x, _ in dropped) == 8 * 8
    with pytest.raises(ValueError, match=r"needs `batch_size`. Received: batch_size=None"):
        kt.data.files(pattern, batch_within_files=True)
    with pytest.raises(ValueError, match=r"Received: batch_within_files='yes'"):
        kt.data.files(pattern, batch_size=4, batch_within_files="yes")


def test_two_workers_shard_files_and_data_exactly_once(tmp_path, record_dirs,
                                                       tf_config_cluster):
    job = {"strategy": "multi_worker_mirrored", "scenarios": [
        {"name": "eight-auto", "dir": record_dirs["eight"], "shard": "auto"},
        {"name": "one-auto", "dir": record_dirs["one"], "shard": "auto"},
        {"name": "one-file", "dir": record_dirs["one"], "shard": "file"},
        {"name": "one-off", "dir": record_dirs["one"], "shard": "off"},
    ], "fit": {"dir": record_dirs["eight"], "epochs": 2}}
    # TensorFlow's own C++ warnings are let through, to show none is about sharding.
    codes, outputs = tf_config_cluster(worker=2).run_workers(
        "tests/_data_worker.py", job, str(tmp_path / "w"), env={"TF_CPP_MIN_LOG_LEVEL": "0"})
    assert codes == [0, 0], "\n".join(o[-4000:] for o in outputs)
    results = [json.loads((tmp_path / f"w{i}.json").read_text()) for i in range(2)]
    everything = list(range(N_FILES_EXAMPLES))
    file_of = _ids_by_file()

    eight = [r["eight-auto"] for r in results]
    assert [r["policy"] for r in eight] == ["file", "file"]
    for epoch in range(2):
        per_worker = [r["seen"][epoch] for r in eight]
        assert sorted(per_worker[0] + per_worker[1]) == everything  # exactly once
        files = [{file_of[i] for i in ids} for ids in per_worker]
        assert [len(f) for f in files] == [4, 4] and not files[0] & files[1]

    one = [r["one-auto"] for r in results]
    assert [r["policy"] for r in one] == ["data", "data"]
    for epoch in range(2):
        assert sorted(one[0]["seen"][epoch] + one[1]["seen"][epoch]) == everything
        assert one[0]["seen"][epoch] and one[1]["seen"][epoch]

    for r in results:
        assert "each of the 2 workers a file: the data has 1 TFRecord file" in \
            r["one-file"]["error"]
        assert r["one-off"]["policy"] == "off"
        assert sorted(r["one-off"]["seen"][0]) == everything  # every worker reads everything

    # Training over the uneven shards (40 and 44 examples) runs every epoch to its end on
    # both workers without hanging, and counts each example once.
    for r in results:
        assert r["fit"]["history"]["count"] == [N_FILES_EXAMPLES] * 2
        # The worker with 44 examples batches them 8,8,8,8,8,4 and TensorFlow splits each
        # batch into 2 per-replica pieces: 12 steps an epoch, the other worker idling at
        # the end with empty batches instead of hanging.
        assert r["fit"]["global_step"] == 2 * 12

    for output in outputs:
        assert "training data: sharding 8 TFRecord files across 2 workers by file: 4 files " \
            "each" in output
        assert ("one-auto data: sharding by data across 2 workers (the data has 1 TFRecord "
                "file, fewer than the 2 workers)") in output
        lowered = output.lower()
        for tf_phrase in ("auto_shard", "autoshard", "auto sharding policy", "sharding policy"):
            assert tf_phrase not in lowered, output[-4000:]


@pytest.mark.multiprocess
def test_parameter_server_workers_read_different_shards(tmp_path, record_dirs):
    job = {"strategy": {"name": "ps", "num_workers": 2, "num_ps": 1}, "scenarios": [
        {"name": "eight-auto", "dir": record_dirs["eight"], "shard": "auto"},
        {"name": "one-auto", "dir": record_dirs["one"], "shard": "auto"},
    ], "fit": {"numpy": 96, "epochs": 2, "validate": True}}
    proc = helpers.run_python(["tests/_data_worker.py", json.dumps(job), str(tmp_path / "ps")])
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    result = json.loads((tmp_path / "ps.json").read_text())
    everything = list(range(N_FILES_EXAMPLES))
    file_of = _ids_by_file()
    for name, policy in [("eight-auto", "file"), ("one-auto", "data")]:
        assert result[name]["policy"] == policy
        shard0, shard1 = result[name]["seen"]
        assert shard0 and shard1 and not set(shard0) & set(shard1), name
        assert sorted(shard0 + shard1) == everything, name
    files = [{file_of[i] for i in ids} for ids in result["eight-auto"]["seen"]]
    assert [len(f) for f in files] == [4, 4]
    # NumPy input trained on the workers: 96 examples at 8 per step, 12 steps an epoch.
    fit = result["fit"]
    assert fit["global_step"] == 24
    assert fit["history"]["count"] == [96, 96]
    assert "worker i takes batches i, i+2, i+4" in proc.stderr   # the scenarios' inputs
    # Training data under ps: loops carry positions instead (tests/distribute/ps/test_visits.py).
    assert "training data: every worker reads the whole data, in one device's order" in proc.stderr
    # The coordinator evaluates: validation data is read there, not sharded across workers.
    assert fit["history"]["val_count"] == [96, 96]
    assert "validation data: sharding" not in proc.stderr   # as it said before 2026-11-28


def test_arrays_changed_in_place_between_calls_are_read_anew_as_keras_reads_them(make_trainer):
    """`data = (x, y)`; `evaluate(data)`; `x *= 10`; `evaluate(data)`: Keras reads the arrays
    at every call. kerastrain kept its first copy of the same tuple: the second evaluation
    scored the old values (and `fit` trained on them). Strings (object arrays) too."""
    x, y = helpers.arrays(64)
    data = (x, y)
    trainer = make_trainer()
    first = trainer.evaluate(data, batch_size=16)["loss"]
    assert trainer.evaluate(data, batch_size=16)["loss"] == first   # unchanged: the same
    x *= 10
    expected = trainer.model.evaluate(x, y, batch_size=16, verbose=0, return_dict=True)["loss"]
    assert trainer.evaluate(data, batch_size=16)["loss"] == pytest.approx(expected, rel=1e-5)
    assert expected != pytest.approx(first, rel=1e-3)
    from kerastrain.data import trainer_inputs
    words = np.array(["a", "b", "c"], dtype=object)
    before = trainer_inputs._content((words,))
    words[1] = "z"
    assert trainer_inputs._content((words,)) != before

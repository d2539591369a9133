"""Speed choices (kerastrain.loop.tuning, precision, all-reduce): results unchanged, logged, switchable."""

import logging

import numpy as np
import pytest
from helpers import FEATURES, arrays, build_model

import kerastrain as kt
from kerastrain.cli import config, template
from kerastrain.distribute import strategies
from kerastrain.data import pipelines
from kerastrain.loop import tuning


def readme_dataset_fn(ctx):
    """The pipeline a Keras user writes (README): slices, batch, prefetch."""
    import tensorflow as tf
    x, y = arrays(640)  # 40 batches: the first two loops measure steps_per_loop
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(
        ctx.get_per_replica_batch_size(16)).prefetch(tf.data.AUTOTUNE)


def _global_slices(x, y):
    import tensorflow as tf
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(16)


def _weights(trainer):
    return [np.asarray(w) for w in trainer.model.get_weights()]


@pytest.mark.parametrize("strategy", ["default", "mirrored"])
def test_the_loops_callees_unconverted_by_autograph_train_bit_for_bit_as_converted(
        strategy, two_cpus, monkeypatch):
    """Leaving the step, the reads and the reductions to plain tracing (kerastrain._tracing)
    only saves autograph's work at start-up (bench/startup.py): with every one of them
    converted again, the same seed trains the same weights and logs, to the last bit."""
    import keras

    from kerastrain.data import in_step_batches, numpy_data
    from kerastrain.distribute.ps import visits
    from kerastrain.step import accumulation, loops
    from kerastrain import _tracing
    options = two_cpus if strategy == "mirrored" else {}
    x, y = arrays(100, seed=5)   # a partial last batch

    def build():
        model = keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(8),
                                  keras.layers.BatchNormalization(),
                                  keras.layers.Dropout(0.3), keras.layers.Dense(1)])
        model.compile(optimizer="adam", loss="mse", metrics=["mae"])
        return model
    runs = []
    for convert in (False, True):
        if convert:
            for module in (_tracing, numpy_data, accumulation, loops, visits):
                monkeypatch.setattr(module, "unconverted", lambda fn: fn)
            in_step_batches._iterator_type.cache_clear()
            in_step_batches._next_type.cache_clear()
        trainer = kt.Trainer(build, strategy=strategy if strategy == "default" else
                             {"name": "mirrored", **options}, seed=4, verbose=0)
        history = trainer.fit((x, y), batch_size=16, epochs=2, validation_data=(x, y)).history
        runs.append((history, _weights(trainer)))
    in_step_batches._iterator_type.cache_clear()   # the next tests' iterators: unconverted again
    in_step_batches._next_type.cache_clear()
    assert runs[0][0] == runs[1][0]
    for a, b in zip(runs[0][1], runs[1][1]):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("strategy", ["default", "mirrored"])
def test_tuning_on_and_off_train_the_same_weights(strategy, two_cpus, caplog):
    options = two_cpus if strategy == "mirrored" else {}
    x, y = arrays(96, seed=3)
    runs = {}
    for tuned in (True, False):  # every choice on (unrolling is off by default), all off
        with caplog.at_level(logging.DEBUG, logger="kerastrain"):  # the full account
            caplog.clear()
            trainer = kt.Trainer(build_model, strategy=strategy, strategy_options=options,
                                 seed=0, verbose=0,
                                 tuning={"unroll_steps": True} if tuned else False)
            first = trainer.fit(readme_dataset_fn, epochs=2).history["loss"]
            second = trainer.fit((x, y), batch_size=16, epochs=3, initial_epoch=2)
            # A global dataset of whole batches: split per replica by TensorFlow.
            third = trainer.fit(lambda: _global_slices(x, y), epochs=4, initial_epoch=3)
        runs[tuned] = (_weights(trainer), first + second.history["loss"] +
                       third.history["loss"], caplog.text)
    for a, b in zip(runs[True][0], runs[False][0]):
        np.testing.assert_array_equal(a, b)
    # Loop sizes differ (measured vs 100): losses are summed in other groups, in float32.
    np.testing.assert_allclose(runs[True][1], runs[False][1], rtol=1e-6)
    # One replica reads in-memory batches inside the loop; two replicas through tf.data.
    said = ("read inside the compiled loop, one batch per step, no tf.data iterator: "
            "from_tensor_slices(...).batch(...) sliced in order" if strategy == "default" else
            "tf.data options: from_tensor_slices(...).batch(...) read as whole-batch slices")
    assert said in runs[True][2]
    assert ("training loop: 4 steps per iteration where" in runs[True][2]) == (
        strategy == "default")
    assert "training loop: 4 steps" not in runs[False][2]
    assert "steps_per_loop='auto':" in runs[True][2]
    assert "tf.data options" not in runs[False][2]
    assert "inside the compiled loop" not in runs[False][2]
    assert "steps_per_loop='auto':" not in runs[False][2]


@pytest.mark.parametrize("shuffle", [True, False])
def test_unrolled_loops_train_the_same_steps(shuffle):
    """4 steps per loop iteration where 4 batches are left: the same steps as one at a time,
    across loops that are not multiples of 4, partial last batches and new passes."""
    x, y = arrays(100, seed=4)  # 7 batches of 16, the last of 4
    runs = []
    for unroll in (True, False):
        trainer = kt.Trainer(build_model, seed=0, verbose=0, steps_per_loop=6,
                             tuning={"unroll_steps": unroll})
        losses = trainer.fit((x, y), batch_size=16, shuffle=shuffle, epochs=3,
                             steps_per_epoch=5).history["loss"]
        losses += trainer.fit((x, y), batch_size=16, shuffle=shuffle, epochs=4,
                              initial_epoch=3).history["loss"]
        runs.append((_weights(trainer), losses, trainer.global_step))
    assert runs[0][2] == runs[1][2] == 5 + 2 + 5 + 7  # an epoch ends where a pass does
    assert runs[0][1] == runs[1][1]
    for a, b in zip(runs[0][0], runs[1][0]):
        np.testing.assert_array_equal(a, b)


def test_gathered_pipeline_yields_the_same_batches():
    import tensorflow as tf
    x = np.random.RandomState(0).rand(50, 3).astype("float32")
    ids = np.arange(50)
    for drop in (False, True):
        ds = tf.data.Dataset.from_tensor_slices((x, {"id": ids})).batch(
            8, drop_remainder=drop).prefetch(2)
        rebuilt = pipelines.gathered(ds)
        assert rebuilt.element_spec == ds.element_spec
        got, want = list(rebuilt), list(ds)
        assert len(got) == len(want) == (6 if drop else 7)
        for a, b in zip(got, want):
            for u, v in zip(tf.nest.flatten(a), tf.nest.flatten(b)):
                np.testing.assert_array_equal(u, v)
    # No remainder: every batch is whole, and the shapes say so.
    whole = pipelines.gathered(tf.data.Dataset.from_tensor_slices(x[:48]).batch(8))
    assert whole.element_spec.shape.as_list() == [8, 3] and len(list(whole)) == 6
    # Anything but slices -> batch -> prefetch is left alone (a shuffle's order, a map's work).
    assert pipelines.gathered(tf.data.Dataset.from_tensor_slices(x).shuffle(5).batch(8)) is None
    assert pipelines.gathered(tf.data.Dataset.from_tensor_slices(x).map(tf.abs).batch(8)) is None


def _batches(reader_or_dataset):
    """Each batch as a flat list of NumPy arrays."""
    import tensorflow as tf
    return [[np.asarray(t) for t in tf.nest.flatten(b)] for b in reader_or_dataset]


def test_in_step_batches_are_the_pipelines_batches_in_its_order():
    import tensorflow as tf

    from kerastrain.data import numpy_data as data
    from kerastrain.data import in_step_batches
    x = np.random.RandomState(0).rand(50, 3).astype("float32")
    ids = np.arange(50)
    numpy = data.NumpyData((x, ids), 8, shuffle=True, seed=5)
    pipeline = numpy.dataset()
    reader = in_step_batches.InStepBatches(numpy.variables, pipeline.element_spec, 8,
                                  orders=numpy.order_drawer())
    passes = []
    for _ in range(3):  # each iteration of either draws the next pass's order
        got, want = _batches(iter(reader)), _batches(pipeline)
        assert len(got) == len(want) == 7  # the last batch partial, as tf.data's
        for a, b in zip(got, want):
            for u, v in zip(a, b):
                np.testing.assert_array_equal(u, v)
        passes.append(np.concatenate([b[1] for b in got]))
    assert sorted(passes[0]) == list(ids) and list(passes[0]) != list(passes[1])

    # In order, as `from_tensor_slices(...).batch(b, drop_remainder)` slices them.
    for drop in (False, True):
        ds = tf.data.Dataset.from_tensor_slices((x, {"id": ids})).batch(8, drop_remainder=drop)
        tensors, spec = [tf.constant(x), tf.constant(ids)], ds.element_spec
        reader = in_step_batches.InStepBatches(tensors, spec, 8, drop_remainder=drop)
        assert _batches(iter(reader)) and len(_batches(iter(reader))) == (6 if drop else 7)
        for a, b in zip(_batches(iter(reader)), _batches(ds)):
            for u, v in zip(a, b):
                np.testing.assert_array_equal(u, v)
        assert reader.element_spec[0].shape.as_list() == ([8, 3] if drop else [None, 3])

    # A compiled loop is traced for the iterator's type: once for every pass, and once
    # for another input of the same shapes (no trace holds an input's tensors).
    traces = []
    reader = in_step_batches.InStepBatches(numpy.variables, pipeline.element_spec, 8,
                                  orders=numpy.order_drawer())
    other = data.NumpyData((x, ids), 8, shuffle=True, seed=6)
    other = in_step_batches.InStepBatches(other.variables, pipeline.element_spec, 8,
                                 orders=other.order_drawer())

    @tf.function
    def total(iterator):
        traces.append(1)
        seen = tf.constant(0, tf.int64)
        while tf.constant(True):
            optional = iterator.get_next_as_optional()
            if not optional.has_value():
                break
            seen += tf.reduce_sum(optional.get_value()[1])
        return seen
    assert [int(total(iter(r))) for r in (reader, reader, other)] == [int(ids.sum())] * 3
    assert len(traces) == 1


def test_in_step_placement_keeps_tf_data_for_many_replicas_and_big_gpu_data():
    from kerastrain.data import in_step_batches
    cpu, gpu = "/job:localhost/replica:0/task:0/device:CPU:0", "/job:localhost/device:GPU:0"
    assert in_step_batches.placement(10 ** 12, [cpu]) == (None, None)  # host memory: left in place
    assert in_step_batches.placement(2 ** 20, [gpu]) == (gpu, None)    # copied to the GPU once
    device, why = in_step_batches.placement(3 * 2 ** 30, [gpu])
    assert device is None and "3.0 GiB" in why                # prefetched by tf.data instead
    assert in_step_batches.placement(10, [cpu, cpu])[1] == "2 replicas on this worker"
    assert in_step_batches.placement(10, [cpu], strings=True) == (None, None)
    assert "string arrays cannot be copied" in in_step_batches.placement(10, [gpu], strings=True)[1]


def test_tuned_keeps_options_the_pipeline_sets():
    import tensorflow as tf
    options = tf.data.Options()
    options.threading.private_threadpool_size = 3
    options.autotune.enabled = True
    ds = tf.data.Dataset.range(10).batch(2).with_options(options)
    tuned, sentence = pipelines.tuned(ds, cores=2)
    assert tuned.options().threading.private_threadpool_size == 3
    assert tuned.options().autotune.enabled is True
    assert "own tf.data options" in sentence
    tuned, sentence = pipelines.tuned(tf.data.Dataset.range(10).batch(2), cores=16)
    assert tuned.options().threading.private_threadpool_size == 8
    assert tuned.options().autotune.cpu_budget == 8
    assert tuned.options().autotune.enabled is None
    assert list(tuned.as_numpy_iterator())[0].tolist() == [0, 1]


def test_cores_are_the_ones_this_process_may_run_on():
    """Pinned to one CPU (`taskset`, a cgroup cpuset), kerastrain sizes its input pools
    for one core, as TensorFlow sizes its own, not for the whole machine."""
    import os
    import threading
    seen = {}

    def pinned():  # on Linux, affinity is per thread: this thread only
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
        seen["cores"], seen["threads"] = pipelines.usable_cores(), pipelines.input_threads()
    thread = threading.Thread(target=pinned)
    thread.start()
    thread.join()
    assert seen == {"cores": 1, "threads": 1}
    assert pipelines.usable_cores() == len(os.sched_getaffinity(0))


def test_loop_sizer_rule_and_probes():
    sizer = tuning.LoopSizer(fallback=100, probe=16, overhead=0.01, most=1000, seconds=2.0)
    assert sizer.next_size() == 100  # not calibrated: the constant
    sizer.fixed = 0.001
    assert sizer.next_size() == 16
    sizer.observe(16, 16, 0.5)  # the first probe creates kernels: not used
    sizer.observe(16, 16, 0.001 + 16 * 0.0005)
    sizer.observe_gap(0.0005)
    # (1 ms call + 0.5 ms between loops) / (1% of 0.5 ms per step) = 300 steps.
    assert sizer.size == 300 and sizer.next_size() == 300
    assert sizer.decide(fixed=0.1, per_step=0.5) == 4        # at most 2 s per loop
    assert sizer.decide(fixed=1.0, per_step=1e-6) == 1000    # at most `most`
    assert sizer.decide(fixed=0.001, per_step=0.0) == 100    # unusable: the constant


def test_all_reduce_chosen_by_device_count():
    choose = strategies.choose_cross_device_ops
    assert choose(["/gpu:0", "/gpu:1"], nccl_available=True)[0] == "nccl"
    assert choose(["/gpu:0", "/gpu:1", "/gpu:2"], nccl_available=False)[0] == "hierarchical_copy"
    assert choose(["/gpu:0"], nccl_available=True)[0] == "reduction_to_one_device"
    assert choose(["/cpu:0", "/cpu:1"], nccl_available=True)[0] == "reduction_to_one_device"
    assert choose(["/cpu:0", "/gpu:0"], nccl_available=True)[0] == "reduction_to_one_device"


def test_mixed_bfloat16_trains(caplog):
    x, y = arrays(96)
    with caplog.at_level(logging.INFO, logger="kerastrain"):
        trainer = kt.Trainer(build_model, seed=0, verbose=0, mixed_precision="mixed_bfloat16")
        losses = trainer.fit((x, y), batch_size=16, epochs=4).history["loss"]
    assert trainer.model.layers[0].compute_dtype == "bfloat16"
    assert trainer.model.layers[0].kernel.dtype == "float32"
    assert np.all(np.isfinite(losses)) and losses[-1] < losses[0]
    assert "mixed precision: mixed_bfloat16" in caplog.text
    import keras
    assert keras.mixed_precision.dtype_policy().name == "float32"  # put back


def _float16_model(initial_scale):
    import keras

    def build():
        model = build_model()
        model.compile(optimizer=keras.optimizers.LossScaleOptimizer(
            keras.optimizers.SGD(0.1), initial_scale=initial_scale), loss="binary_crossentropy")
        return model
    return build


def test_mixed_float16_scales_the_loss_and_skips_non_finite_steps():
    x, y = arrays(96)
    # A scale of 2**40 makes float16 gradients overflow: the step is skipped, the scale halved.
    trainer = kt.Trainer(_float16_model(2.0 ** 40), seed=0, verbose=0,
                         mixed_precision="mixed_float16", steps_per_loop=1)
    before = _weights(trainer)
    trainer.fit((x, y), batch_size=16, epochs=1, steps_per_epoch=2)
    for a, b in zip(_weights(trainer), before):
        np.testing.assert_array_equal(a, b)
    assert float(trainer.model.optimizer.dynamic_scale) == 2.0 ** 38
    assert trainer.global_step == 2
    # A workable scale: the unscaled update is that of float32 SGD on the same batch, to
    # float16 precision (a wrong unscaling would be off by the factor 2**10).
    scaled = kt.Trainer(_float16_model(2.0 ** 10), seed=0, verbose=0,
                        mixed_precision="mixed_float16", steps_per_loop=1)
    plain = kt.Trainer(build_model, seed=0, verbose=0, optimizer=lambda: __import__(
        "keras").optimizers.SGD(0.1), loss="binary_crossentropy", metrics=[])
    plain.model.set_weights(scaled.model.get_weights())
    start = _weights(scaled)
    for t in (scaled, plain):
        t.fit((x, y), batch_size=96, epochs=1, shuffle=False)
    for a, b, s in zip(_weights(scaled), _weights(plain), start):
        assert not np.array_equal(a, s)
        np.testing.assert_allclose(a - s, b - s, atol=2e-3, rtol=0.05)
    assert float(scaled.model.optimizer.dynamic_scale) == 2.0 ** 10


def test_mixed_precision_errors():
    with pytest.raises(ValueError, match="Received: mixed_precision='float16'"):
        kt.Trainer(build_model, mixed_precision="float16")
    with pytest.raises(ValueError, match="was given already built, with policy 'float32'"):
        kt.Trainer(build_model(), mixed_precision="mixed_bfloat16")
    with pytest.raises(ValueError, match="Unknown tuning option"):
        kt.Trainer(build_model, tuning={"input_option": False})


def test_recipe_takes_the_speed_options():
    base = {"model": {"builder": "kerastrain.examples:build_mlp"},
            "data": {"train": {"builder": "kerastrain.examples:synthetic_data"}}}
    recipe = config.validate({**base, "trainer": {"jit_compile": "auto",
                                                  "mixed_precision": "mixed_bfloat16"},
                              "tuning": {"measure_steps_per_loop": False}}, imports=False)
    assert recipe.trainer.jit_compile == "auto"
    assert recipe.trainer.mixed_precision == "mixed_bfloat16"
    assert recipe.tuning == {"measure_steps_per_loop": False}
    with pytest.raises(config.RecipeError) as e:
        config.validate({**base, "trainer": {"jit_compile": "yes", "mixed_precision": "fp16"},
                         "tuning": {"input_options": "no"}}, imports=False)
    text = str(e.value)
    assert "trainer.jit_compile" in text and "trainer.mixed_precision" in text
    assert "tuning.input_options" in text
    assert "tuning:" in template.template()


def test_compiled_metric_results_read_a_variable_returned_by_result():
    import keras

    class Count(keras.metrics.Metric):
        def __init__(self, name="count", **kwargs):
            super().__init__(name=name, **kwargs)
            self.total = self.add_variable(shape=(), initializer="zeros", name="total")

        def update_state(self, y_true, y_pred, sample_weight=None):
            self.total.assign_add(keras.ops.cast(keras.ops.shape(y_true)[0], "float32"))

        def result(self):
            return self.total  # the variable itself: read inside the stateless scope

    trainer = kt.Trainer(build_model, seed=0, verbose=0, metrics=lambda: ["accuracy", Count()])
    history = trainer.fit(arrays(96), batch_size=16, epochs=2).history
    assert history["count"] == [96.0, 96.0]

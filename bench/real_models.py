"""Real keras.io-style models: kerastrain vs Keras `model.fit` (defaults, tuned) vs a bare loop.

Workloads (synthetic data from a fixed seed). Full sizes aim at an epoch of `model.fit` of
roughly 5-20 s on one device of a 2-core CPU (estimated from `--quick` runs, not measured);
under mirrored the recommender's Keras Adam epochs are far longer (a dense update of the
million-row table on each device: a minute or more), and so is its part of the run:
  convnet      keras.io's MNIST convnet with BatchNormalization: 28x28x1 images ->
               Conv2D(32,3)-BN-ReLU-MaxPool -> Conv2D(64,3)-BN-ReLU-MaxPool -> Flatten ->
               Dropout(0.5) -> Dense(10, softmax); Adam, sparse cross-entropy, accuracy.
               8,192 images, batch 128.
  transformer  keras.io's "Text classification with Transformer": token ids (maxlen 128,
               vocabulary 20,000, Zipf-like) -> TokenAndPositionEmbedding(32) ->
               TransformerBlock(2 heads, FFN 32) -> GlobalAveragePooling1D -> Dropout ->
               Dense(20, relu) -> Dropout -> Dense(2, softmax); Adam, sparse cross-entropy,
               accuracy. 8,192 sequences, batch 64.
  recommender  user and item ids (Zipf-like popularity) -> Embedding(100,000, 32) and
               Embedding(1,000,000, 32) -> concat -> Dense(64, relu) -> Dense(1); mse.
               65,536 examples, batch 1,024.

Contenders, per workload and strategy: each is built and trains one untimed warm-up epoch;
once all are built each trains one more untimed epoch; then they take turns one epoch each for
`--rounds` rounds (bench/_rounds.py). Figures are medians over rounds, ratios medians of
within-round ratios (wall time, and CPU time of the process: all its threads, the ps
cluster's included). All contenders train the same model on the same examples, the same
number of batches of the same size per epoch:
  kerastrain    `kt.Trainer(build_model, (x, y), strategy=..., seed=0, verbose=0)`, defaults,
                `fit(batch_size=B)` one epoch at a time.
  fit defaults  `model.fit(x, y, batch_size=B, epochs=1)`, compiled with defaults (built and
                compiled in `strategy.scope()` under mirrored).
  fit best      `model.fit` with the fastest (steps_per_execution in 1/8/64/256) x
                (jit_compile False/True) of a short search, one warm-up and one timed epoch
                each (for the recommender also x optimizer Adam / LazyAdam); combinations
                that fail (XLA) are skipped and listed.
  bare loop     the ceiling: the same model and optimizer, a `tf.function` running the whole
                epoch per call over in-memory tensors, `optimizer.apply`; under mirrored
                `strategy.run` over `experimental_distribute_dataset`; under ps a bare
                `ClusterCoordinator` scheduling closures of kerastrain's loop size.
Differences left in on purpose: the bare loop updates no metric and does not shuffle (fit
and kerastrain shuffle NumPy input each epoch and update accuracy); under ps each worker of
the bare loop reads its own pass over the batches (same count, not the same order); on
one_device, fit and the bare loop run under no strategy, as keras.io's code does, kerastrain
under its OneDeviceStrategy.

Optimizers: Adam everywhere, except the recommender: kerastrain and the bare loop use
`kerastrain.optimizers.LazyAdam` (updates only the rows a batch touched); `fit defaults` uses
Keras Adam (what a `model.fit` user has; it updates the whole 1M-row table every step), and
`fit best` picks Adam or LazyAdam (with `kerastrain.optimizers.read_rows`) by speed. The
lazy contenders' recommender epochs last well under a second: their ratios are noisier.

Strategies: one_device; mirrored (2 logical CPU devices, or the GPUs with `--device gpu`);
ps (recommender only: a local in-process cluster of 2 workers + 1 ps; Keras 3's `model.fit`
has no parameter-server support, so there it is kerastrain vs the bare coordinator loop).
Each (workload, strategy) runs in its own process: mirrored splits the CPU before TensorFlow
starts, ps starts its own cluster.

`--quick` checks that everything runs (its figures mean nothing): convnet 1,024 images,
transformer 512 sequences of 32 tokens, recommender 8,192 examples over tables of 10,000
users and 100,000 items, 2 rounds, a search of two configurations per optimizer (Keras's
defaults; 256 steps per execution with XLA). `--device gpu` trains on the GPU(s) (mirrored
over them, no CPU split) and allows `--mixed-precision` (mixed_float16, every contender).

    python bench/real_models.py [--only convnet,transformer,recommender]
        [--strategies one_device,mirrored,ps] [--rounds 5] [--quick] [--device cpu|gpu]
        [--mixed-precision] [--json out.json]
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

import kerastrain as kt  # noqa: E402  (names import on first use: nothing heavy yet)

if "--child" in sys.argv[:-1] and sys.argv[sys.argv.index("--child") + 1].endswith(":ps"):
    # The ps child's local cluster: TensorFlow's servers listen on every interface and run
    # any graph sent to them. Loopback only, which must come before NumPy or TensorFlow
    # start threads, so before the imports below.
    kt.isolate_network()

import keras  # noqa: E402  (importing Keras does not start TensorFlow's devices)
import numpy as np  # noqa: E402
from keras import layers, ops  # noqa: E402

from _rounds import FitEpochs, interleave, machine, ratio  # noqa: E402

WORKLOADS = ("convnet", "transformer", "recommender")
STRATEGIES = ("one_device", "mirrored", "ps")
KT, FIT, BEST, BARE = "kerastrain", "fit defaults", "fit best", "bare loop"
SEARCH_SPE = (1, 8, 64, 256)
SEARCH_JIT = (False, True)


# -- the models, as keras.io writes them ------------------------------------------------

def build_convnet(optimizer=None, **compile_kwargs):
    model = keras.Sequential([
        keras.Input(shape=(28, 28, 1)),
        layers.Conv2D(32, kernel_size=(3, 3)),
        layers.BatchNormalization(),
        layers.ReLU(),
        layers.MaxPooling2D(pool_size=(2, 2)),
        layers.Conv2D(64, kernel_size=(3, 3)),
        layers.BatchNormalization(),
        layers.ReLU(),
        layers.MaxPooling2D(pool_size=(2, 2)),
        layers.Flatten(),
        layers.Dropout(0.5),
        # float32 output: under mixed_float16 the softmax and the loss stay in float32.
        layers.Dense(10, activation="softmax", dtype="float32"),
    ])
    # Loss as an object, not "sparse_categorical_crossentropy": the bare loop calls model.loss.
    model.compile(optimizer=optimizer or keras.optimizers.Adam(),
                  loss=keras.losses.SparseCategoricalCrossentropy(), metrics=["accuracy"],
                  **compile_kwargs)
    return model


class TransformerBlock(layers.Layer):
    def __init__(self, embed_dim, num_heads, ff_dim, rate=0.1, **kwargs):
        super().__init__(**kwargs)
        self.embed_dim, self.num_heads, self.ff_dim, self.rate = embed_dim, num_heads, ff_dim, rate
        self.att = layers.MultiHeadAttention(num_heads=num_heads, key_dim=embed_dim)
        self.ffn = keras.Sequential(
            [layers.Dense(ff_dim, activation="relu"), layers.Dense(embed_dim)])
        self.layernorm1 = layers.LayerNormalization(epsilon=1e-6)
        self.layernorm2 = layers.LayerNormalization(epsilon=1e-6)
        self.dropout1 = layers.Dropout(rate)
        self.dropout2 = layers.Dropout(rate)

    def call(self, inputs, training=None):
        attn_output = self.att(inputs, inputs)
        attn_output = self.dropout1(attn_output, training=training)
        out1 = self.layernorm1(inputs + attn_output)
        ffn_output = self.ffn(out1)
        ffn_output = self.dropout2(ffn_output, training=training)
        return self.layernorm2(out1 + ffn_output)

    def get_config(self):
        # Lets Keras clone the model (kerastrain re-creates a model instance in a strategy's
        # scope from its config; a builder function, as used here, does not need it).
        return {**super().get_config(), "embed_dim": self.embed_dim,
                "num_heads": self.num_heads, "ff_dim": self.ff_dim, "rate": self.rate}


class TokenAndPositionEmbedding(layers.Layer):
    def __init__(self, maxlen, vocab_size, embed_dim, **kwargs):
        super().__init__(**kwargs)
        self.maxlen, self.vocab_size, self.embed_dim = maxlen, vocab_size, embed_dim
        self.token_emb = layers.Embedding(input_dim=vocab_size, output_dim=embed_dim)
        self.pos_emb = layers.Embedding(input_dim=maxlen, output_dim=embed_dim)

    def call(self, x):
        maxlen = ops.shape(x)[-1]
        positions = ops.arange(start=0, stop=maxlen, step=1)
        positions = self.pos_emb(positions)
        x = self.token_emb(x)
        return x + positions

    def get_config(self):
        return {**super().get_config(), "maxlen": self.maxlen, "vocab_size": self.vocab_size,
                "embed_dim": self.embed_dim}


def build_transformer(maxlen, vocab_size=20_000, optimizer=None, **compile_kwargs):
    embed_dim, num_heads, ff_dim = 32, 2, 32
    inputs = layers.Input(shape=(maxlen,), dtype="int32")
    x = TokenAndPositionEmbedding(maxlen, vocab_size, embed_dim)(inputs)
    x = TransformerBlock(embed_dim, num_heads, ff_dim)(x)
    x = layers.GlobalAveragePooling1D()(x)
    x = layers.Dropout(0.1)(x)
    x = layers.Dense(20, activation="relu")(x)
    x = layers.Dropout(0.1)(x)
    outputs = layers.Dense(2, activation="softmax", dtype="float32")(x)
    model = keras.Model(inputs=inputs, outputs=outputs)
    model.compile(optimizer=optimizer or keras.optimizers.Adam(),
                  loss=keras.losses.SparseCategoricalCrossentropy(), metrics=["accuracy"],
                  **compile_kwargs)
    return model


def build_recommender(users, items, optimizer=None, **compile_kwargs):
    user = keras.Input(shape=(1,), dtype="int32", name="user")
    item = keras.Input(shape=(1,), dtype="int32", name="item")
    u = layers.Flatten()(layers.Embedding(users, 32, name="user_embedding")(user))
    i = layers.Flatten()(layers.Embedding(items, 32, name="item_embedding")(item))
    x = layers.Concatenate()([u, i])
    x = layers.Dense(64, activation="relu")(x)
    outputs = layers.Dense(1, dtype="float32")(x)
    model = keras.Model(inputs={"user": user, "item": item}, outputs=outputs)
    model.compile(optimizer=optimizer or _lazy_adam(), loss=keras.losses.MeanSquaredError(),
                  **compile_kwargs)
    return model


def _lazy_adam():
    from kerastrain.optimizers import LazyAdam
    return LazyAdam()


# -- the workloads: data, sizes, builders --------------------------------------------------

class Workload:
    """One model and its data; `build(optimizer=None, **compile_kwargs)` returns it compiled."""

    lazy = False  # kerastrain and the bare loop train with LazyAdam

    def fit_optimizers(self):
        """(label, factory) pairs the `fit best` search tries; a None factory: the default."""
        return [("Adam", None)]


class Convnet(Workload):
    name = "convnet"

    def __init__(self, quick):
        self.n, self.batch = (1024, 128) if quick else (8192, 128)

    def data(self):
        rng = np.random.RandomState(0)
        x = rng.rand(self.n, 28, 28, 1).astype("float32")
        # A learnable labelling: the argmax of a fixed random projection of the pixels.
        w = np.random.RandomState(1234).randn(28 * 28, 10).astype("float32")
        y = np.argmax((x.reshape(self.n, -1) - 0.5) @ w, axis=1).astype("int32")
        return x, y

    def build(self, optimizer=None, **compile_kwargs):
        return build_convnet(optimizer, **compile_kwargs)


class Transformer(Workload):
    name = "transformer"
    vocab = 20_000

    def __init__(self, quick):
        self.n, self.batch, self.maxlen = (512, 64, 32) if quick else (8192, 64, 128)

    def data(self):
        rng = np.random.RandomState(0)
        # Word frequencies in text are Zipf-like; id 0 (padding in keras.io's IMDB) unused.
        x = (1 + (rng.zipf(1.2, size=(self.n, self.maxlen)) - 1) % (self.vocab - 1)).astype(
            "int32")
        score = np.random.RandomState(1234).randn(self.vocab).astype("float32")
        s = score[x].mean(axis=1)
        y = (s > np.median(s)).astype("int32")
        return x, y

    def build(self, optimizer=None, **compile_kwargs):
        return build_transformer(self.maxlen, self.vocab, optimizer, **compile_kwargs)


class Recommender(Workload):
    name = "recommender"
    lazy = True

    def __init__(self, quick):
        self.n, self.batch = (8192, 1024) if quick else (65536, 1024)
        # --quick only checks that it runs: under mirrored, Keras Adam's dense update of a
        # million-row table copied on both devices makes each quick epoch last seconds.
        self.users, self.items = (10_000, 100_000) if quick else (100_000, 1_000_000)

    def data(self):
        rng = np.random.RandomState(0)
        users = ((rng.zipf(1.3, size=(self.n, 1)) - 1) % self.users).astype("int32")
        items = ((rng.zipf(1.3, size=(self.n, 1)) - 1) % self.items).astype("int32")
        # A rating from hidden 4-dimensional user and item factors, plus noise.
        task = np.random.RandomState(1234)
        uf = task.randn(self.users, 4).astype("float32")
        itf = task.randn(self.items, 4).astype("float32")
        y = ((uf[users[:, 0]] * itf[items[:, 0]]).sum(axis=1, keepdims=True)
             + 0.1 * rng.randn(self.n, 1)).astype("float32")
        return {"user": users, "item": items}, y

    def build(self, optimizer=None, **compile_kwargs):
        return build_recommender(self.users, self.items, optimizer, **compile_kwargs)

    def build_for_fit(self, optimizer=None, **compile_kwargs):
        # What a model.fit user has: Keras Adam (dense update of the whole table per step).
        return self.build(optimizer or keras.optimizers.Adam(), **compile_kwargs)

    def fit_optimizers(self):
        return [("Adam", keras.optimizers.Adam), ("LazyAdam", _lazy_adam)]


WORKLOAD_CLASSES = {"convnet": Convnet, "transformer": Transformer, "recommender": Recommender}


def _build_for_fit(workload, optimizer=None, **compile_kwargs):
    build = getattr(workload, "build_for_fit", workload.build)
    return build(optimizer, **compile_kwargs)


def _scope(strategy):
    return strategy.scope() if strategy is not None else contextlib.nullcontext()


# -- the contenders -----------------------------------------------------------------------

class ModelFit:
    """Keras `model.fit(x, y, batch_size=B, epochs=1)`; `epoch()` trains one more epoch."""

    def __init__(self, workload, x, y, strategy, optimizer=None, **compile_kwargs):
        from kerastrain.optimizers import is_lazy, read_rows
        keras.utils.set_random_seed(0)
        with _scope(strategy):
            self.model = _build_for_fit(workload, optimizer() if optimizer else None,
                                        **compile_kwargs)
        if is_lazy(self.model.optimizer):
            # docs/optimizers.md: with Keras's own fit, Embedding layers must read only their
            # rows, else each step copies the whole table after the in-place row updates.
            read_rows(self.model)
        self.x, self.y, self.batch = x, y, workload.batch
        self.epoch()

    def epoch(self):
        self.model.fit(self.x, self.y, batch_size=self.batch, epochs=1, verbose=0)


def search_fit(workload, x, y, strategy, quick=False):
    """Time each (optimizer, steps_per_execution, jit_compile); return (table, fastest ModelFit).

    `quick` tries two per optimizer: Keras's defaults, and 256 steps per execution (more
    than a quick epoch has) with XLA: each configuration builds, traces and maybe
    XLA-compiles a model again, the bulk of a quick run's time.
    """
    table, best, best_time = [], None, float("inf")
    started = time.perf_counter()
    grid = ([(1, False), (SEARCH_SPE[-1], True)] if quick else
            [(spe, jit) for spe in SEARCH_SPE for jit in SEARCH_JIT])
    for opt_label, optimizer in workload.fit_optimizers():
        for spe, jit in grid:
            entry = {"optimizer": opt_label, "steps_per_execution": spe, "jit_compile": jit}
            try:
                run = ModelFit(workload, x, y, strategy, optimizer,
                               steps_per_execution=spe, jit_compile=jit)  # + warm-up epoch
                w0 = time.perf_counter()
                run.epoch()
                seconds = time.perf_counter() - w0
            except Exception as e:  # noqa: BLE001  (XLA refusing an op, among others)
                entry["error"] = _why(e)
                print(f"search: {_label(entry)}: FAILED {entry['error']}", flush=True)
                table.append(entry)
                gc.collect()
                continue
            # Keras quietly turns jit_compile=True off for a model with a layer that
            # does not support XLA: record what ran, not what was asked.
            entry["jit_compile_ran"] = bool(run.model.jit_compile)
            entry["examples_per_s"] = workload.n / seconds
            print(f"search: {_label(entry)}: {entry['examples_per_s']:,.0f} examples/s"
                  + ("" if entry["jit_compile_ran"] == jit else
                     " (Keras ran it without XLA)"), flush=True)
            table.append(entry)
            if seconds < best_time:
                best, best_time = run, seconds
                best.setting = entry
            del run
            gc.collect()  # a losing model (and its 1M-row table) goes now
    print(f"search: {len(table)} configurations in {time.perf_counter() - started:.0f} s",
          flush=True)
    return table, best


def _why(error):
    """The line of a TensorFlow error that says what went wrong, not where it was traced."""
    import re
    lines = [ln.strip() for ln in str(error).splitlines() if ln.strip()]
    noise = re.compile(r'Graph execution error|Detected at node|File "|\[\[|Cf\. |'
                       r"\d+ root error\(s\) found|\d+ successful operations|\d+ derived errors")
    useful = [ln for ln in lines if not noise.match(ln)] or lines or [""]
    first = re.sub(r"^\(\d+\) [A-Z_]+:\s*", "", useful[0])  # "(0) INVALID_ARGUMENT: ..."
    first = re.sub(r" \(defined @ [^)]*\)", "", first)  # where the variable was made
    # Which variable does not matter, and naming it would make one note per model.
    first = re.sub(r"resource \S+ located", "resource <a variable> located", first)
    return f"{type(error).__name__}: {first[:240]}"


def _label(entry):
    return (f"{entry['optimizer']}, steps_per_execution={entry['steps_per_execution']}, "
            f"jit_compile={entry['jit_compile']}")


class BareLoop:
    """The ceiling: one `tf.function` call trains the whole epoch from in-memory tensors.

    No metrics (fit and kerastrain also update accuracy) and no shuffling (both shuffle
    NumPy input each epoch): the ceiling leaves out what a user can do without. Same
    model, optimizer, loss, batches per epoch and examples per epoch.
    """

    def __init__(self, workload, x, y, strategy=None):
        import tensorflow as tf

        from kerastrain.optimizers import read_rows
        keras.utils.set_random_seed(0)
        with _scope(strategy):
            model = workload.build()
            optimizer = model.optimizer
            # Slots made here, in the scope: made by the first apply inside a tf.function
            # under mirrored, they fail on TF 2.21.
            optimizer.build(model.trainable_variables)
        if workload.lazy:
            read_rows(model)  # as kerastrain does for a lazy optimizer
        loss_fn = model.loss
        steps, batch = workload.n // workload.batch, workload.batch
        replicas = strategy.num_replicas_in_sync if strategy is not None else 1
        self.steps_per_call = steps

        def step(xb, yb):
            with tf.GradientTape() as tape:
                # Mean over this replica's batch; the replicas' gradients are summed.
                loss = loss_fn(yb, model(xb, training=True)) / replicas
                scaled = optimizer.scale_loss(loss)  # a LossScaleOptimizer's, under mixed_float16
            grads = tape.gradient(scaled, model.trainable_variables)
            optimizer.apply(grads, model.trainable_variables)

        if strategy is None:
            def batches(a):
                return tf.constant(a[:steps * batch].reshape((steps, batch) + a.shape[1:]))
            xb, yb = tf.nest.map_structure(batches, x), batches(y)

            @tf.function
            def epoch():
                for i in tf.range(steps):
                    step(tf.nest.map_structure(lambda t: t[i], xb), yb[i])
            self.epoch = epoch
        else:
            dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(batch, drop_remainder=True)
            distributed = strategy.experimental_distribute_dataset(dataset)

            @tf.function
            def loop(iterator):
                for _ in tf.range(steps):
                    strategy.run(step, args=next(iterator))
            self.epoch = lambda: loop(iter(distributed))
        self.epoch()


class BareCoordinator:
    """The ps ceiling: a bare `ClusterCoordinator` scheduling `loop`-step closures.

    Each worker reads its own endless pass over the same in-memory batches (the
    coordinator hands closures to whichever worker is free), so an epoch is the same
    number of steps and examples as kerastrain's, not the same batches in the same order.
    """

    def __init__(self, workload, x, y, built, loop):
        import tensorflow as tf

        from kerastrain.optimizers import read_rows
        strategy, coordinator = built.strategy, built.coordinator
        keras.utils.set_random_seed(0)
        with strategy.scope():
            model = workload.build()
            optimizer = model.optimizer
            optimizer.build(model.trainable_variables)
        if workload.lazy:
            read_rows(model)  # a gather on the ps: only the looked-up rows cross the network
        loss_fn = model.loss
        steps, batch = workload.n // workload.batch, workload.batch
        self.steps_per_call = loop

        @tf.function
        def per_worker():
            return tf.data.Dataset.from_tensor_slices((x, y)).batch(
                batch, drop_remainder=True).repeat()
        iterator = iter(coordinator.create_per_worker_dataset(per_worker))

        def step(xb, yb):
            with tf.GradientTape() as tape:
                loss = loss_fn(yb, model(xb, training=True))
                scaled = optimizer.scale_loss(loss)
            grads = tape.gradient(scaled, model.trainable_variables)
            optimizer.apply(grads, model.trainable_variables)

        @tf.function
        def many(it, count):
            for _ in tf.range(count):
                strategy.run(step, args=next(it))

        self.closures = [loop] * (steps // loop) + ([steps % loop] if steps % loop else [])

        def epoch():
            for count in self.closures:
                coordinator.schedule(many, args=(iterator, tf.constant(count)))
            coordinator.join()
        self.epoch = epoch
        self.epoch()


# -- one (workload, strategy) in this process ----------------------------------------------

def strategy_spec(name, device):
    if name == "mirrored":
        # On a GPU machine: over the GPUs; on a CPU: 2 logical CPU devices.
        return {"name": "mirrored", "cpu_devices": 2} if device == "cpu" else "mirrored"
    if name == "ps":
        return {"name": "ps", "num_workers": 2, "num_ps": 1}
    return "one_device"


def child(workload_name, strategy_name, args):
    if strategy_name == "mirrored" and args.device == "cpu":
        kt.configure_cpu_devices(2)  # before anything starts TensorFlow's devices
    precision = None
    if args.mixed_precision:
        precision = "mixed_float16"
        # fit and the bare loop build under the global policy; kerastrain under its option.
        keras.mixed_precision.set_global_policy(precision)
    workload = WORKLOAD_CLASSES[workload_name](args.quick)
    x, y = workload.data()
    spec = strategy_spec(strategy_name, args.device)
    built = kt.build_strategy(spec)  # the Trainer's own: one strategy per device set / cluster
    strategy = built.strategy if strategy_name != "one_device" else None  # one device: no scope
    rounds = args.rounds or (2 if args.quick else 5)
    notes, search, settings = [], None, {}

    if strategy_name != "ps":
        search, best = search_fit(workload, x, y, strategy, args.quick)
        if best is None:
            raise RuntimeError("every model.fit configuration of the search failed")
        best.setting["chosen"] = True
        settings[BEST] = _label(best.setting) + (
            "" if best.setting["jit_compile_ran"] == best.setting["jit_compile"]
            else " (ran without XLA)")
    trainer = kt.Trainer(workload.build, (x, y), strategy=spec, seed=0, verbose=0,
                         mixed_precision=precision)
    runners = {KT: FitEpochs(trainer, batch_size=workload.batch)}
    settings[KT] = (f"defaults (steps_per_loop={trainer.steps_per_loop}"
                    + (", LazyAdam" if workload.lazy else "") + ")")
    if strategy_name == "ps":
        # Keras 3's model.fit does not train under ParameterServerStrategy.
        notes.append("ps: no model.fit contenders (Keras 3 fit has no parameter-server support)")
        bare = BareCoordinator(workload, x, y, built, trainer.steps_per_loop)
        # Both schedule closures of kerastrain's loop size: with an epoch no longer than
        # one loop, a single worker trains the whole epoch (closures are not split).
        notes.append(f"ps ({workload_name}): an epoch of {workload.n // workload.batch} steps "
                     f"is {len(bare.closures)} closure(s) of at most {bare.steps_per_call} "
                     "steps (kerastrain's steps_per_loop) for both contenders: "
                     f"{min(len(bare.closures), 2)} of the 2 workers busy at a time")
        settings[BARE] = (f"ClusterCoordinator, {bare.steps_per_call} steps per closure"
                          + (", LazyAdam" if workload.lazy else ""))
    else:
        runners[FIT] = ModelFit(workload, x, y, strategy)
        settings[FIT] = "compile defaults" + (", Keras Adam" if workload.lazy else "")
        runners[BEST] = best
        bare = BareLoop(workload, x, y, strategy)
        settings[BARE] = (f"{bare.steps_per_call} steps per tf.function call"
                          + (" over strategy.run" if strategy is not None else "")
                          + (", LazyAdam" if workload.lazy else ""))
    runners[BARE] = bare
    for name, setting in settings.items():
        print(f"setting: {name}: {setting}", flush=True)
    # Building a contender seeds (keras.utils.set_random_seed -> tf.random.set_seed), which
    # clears TensorFlow's kernel caches: the next call of every compiled function built
    # before then costs 0.1-0.2 s more (measured), a first round skewed against whoever was
    # built first. So one more untimed epoch each, once all are built.
    for runner in runners.values():
        runner.epoch()
    wall, cpu = interleave(runners, rounds, workload.n)
    print("RESULT " + json.dumps({
        "workload": workload_name, "strategy": strategy_name, "examples_per_epoch": workload.n,
        "batch": workload.batch, "rounds": rounds, "wall": wall, "cpu": cpu,
        "settings": settings, "search": search, "notes": notes}), flush=True)


# -- the parent: one child per (workload, strategy), one table -----------------------------

def run_child(workload, strategy, args):
    """Run one child, echoing its progress; return its RESULT dict, or {"failed": why}."""
    command = [sys.executable, os.path.abspath(__file__), "--child", f"{workload}:{strategy}",
               "--device", args.device]
    command += ["--quick"] if args.quick else []
    command += ["--mixed-precision"] if args.mixed_precision else []
    command += ["--rounds", str(args.rounds)] if args.rounds else []
    result = None
    # stderr to a file: TensorFlow's logs could fill a pipe nobody reads while stdout streams.
    with tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=err, text=True)
        for line in proc.stdout:
            if line.startswith("RESULT "):
                result = json.loads(line[len("RESULT "):])
            elif line.startswith(("round", "search", "setting")):
                print(f"  {line.rstrip()}", flush=True)
        proc.wait()
        if proc.returncode or result is None:
            err.seek(0)
            tail = err.read()[-3000:]
            print(tail, file=sys.stderr)
            lines = [ln for ln in tail.strip().splitlines() if ln.strip()]
            return {"workload": workload, "strategy": strategy,
                    "failed": lines[-1] if lines else f"exit code {proc.returncode}"}
    return result


def summarise(result):
    """Per contender: median examples/s, CPU s per epoch, kerastrain's within-round ratios."""
    wall, cpu, n = result["wall"], result["cpu"], result["examples_per_epoch"]
    rows = []
    for name in wall:
        rows.append({"contender": name, "setting": result["settings"].get(name, ""),
                     "examples_per_s": n / statistics.median(wall[name]),
                     "cpu_s_per_epoch": statistics.median(cpu[name]),
                     "kt_speed_ratio_wall": ratio(wall, KT, name) if name != KT else None,
                     "kt_speed_ratio_cpu": ratio(cpu, KT, name) if name != KT else None})
    return rows


def _f(value, spec):
    return "-" if value is None or value != value else format(value, spec)


def print_tables(results, args, seconds):
    print("\n### Throughput per contender (medians over rounds)\n")
    print("| workload | strategy | contender | setting | examples/s (wall) | CPU s / epoch |")
    print("|---|---|---|---|---:|---:|")
    for r in results:
        if "failed" in r:
            print(f"| {r['workload']} | {r['strategy']} | FAILED | {r['failed'][:100]} | | |")
            continue
        for row in summarise(r):
            print(f"| {r['workload']} | {r['strategy']} | {row['contender']} | {row['setting']} "
                  f"| {_f(row['examples_per_s'], ',.0f')} | {_f(row['cpu_s_per_epoch'], '.2f')} |")
    print("\n### kerastrain's speed over each contender (median of within-round ratios; "
          "> 1: kerastrain faster)\n")
    print("| workload | strategy | x fit defaults (wall / CPU) | x fit best (wall / CPU) "
          "| x bare loop (wall / CPU) |")
    print("|---|---|---|---|---|")
    for r in results:
        if "failed" in r:
            continue
        cells = []
        for base in (FIT, BEST, BARE):
            if base in r["wall"]:
                cells.append(f"{_f(ratio(r['wall'], KT, base), '.2f')} / "
                             f"{_f(ratio(r['cpu'], KT, base), '.2f')}")
            else:
                cells.append("n/a")
        print(f"| {r['workload']} | {r['strategy']} | " + " | ".join(cells) + " |")
    print_search(results)
    notes = sorted({n for r in results for n in r.get("notes", [])})
    if notes:
        print("\nNotes:")
        for n in notes:
            print(f"- {n}")
    rounds = sorted({r["rounds"] for r in results if "rounds" in r})
    print(f"\n{time.strftime('%Y-%m-%d %H:%M')} on {machine()}, device {args.device}"
          f"{', mixed_float16' if args.mixed_precision else ''}; "
          f"{'quick' if args.quick else 'full'} run in {seconds:.0f} s; {rounds} timed epochs "
          "per contender, interleaved (bench/_rounds.py); CPU: this process, all threads")


def print_search(results):
    """The `fit best` searches: examples/s of each configuration's one timed epoch."""
    searched = [r for r in results if r.get("search")]
    if not searched:
        return
    print("\n### model.fit search (one warm-up + one timed epoch each; examples/s)\n")
    print("| workload | strategy | optimizer | steps_per_execution | jit_compile=False "
          "| jit_compile=True |")
    print("|---|---|---|---:|---:|---:|")
    failures = {}
    for r in searched:
        cells = {}
        for e in r["search"]:
            key = (e["optimizer"], e["steps_per_execution"])
            if "error" in e:
                # One footnote per distinct error: under mirrored every XLA try fails alike.
                mark = failures.setdefault(e["error"], f"failed [{len(failures) + 1}]")
                cells.setdefault(key, {})[e["jit_compile"]] = mark
            else:
                ran_without = e["jit_compile"] and not e["jit_compile_ran"]
                cells.setdefault(key, {})[e["jit_compile"]] = (
                    f"{e['examples_per_s']:,.0f}" + (" (XLA off)" if ran_without else "")
                    + (" *" if e.get("chosen") else ""))
        for (optimizer, spe), by_jit in cells.items():
            print(f"| {r['workload']} | {r['strategy']} | {optimizer} | {spe} | "
                  f"{by_jit.get(False, '-')} | {by_jit.get(True, '-')} |")
    print("\n\\* the `fit best` contender. Keras's defaults are steps_per_execution=1, "
          "jit_compile=False on a CPU-only machine.")
    for error, mark in failures.items():
        print(f"\n{mark.split(' ')[1]} {error}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default=",".join(WORKLOADS),
                        help=f"comma-separated workloads of {WORKLOADS}")
    parser.add_argument("--strategies", default=",".join(STRATEGIES),
                        help=f"comma-separated strategies of {STRATEGIES} (ps: recommender only)")
    parser.add_argument("--rounds", type=int, default=None,
                        help="timed epochs per contender (default 5; 2 with --quick)")
    parser.add_argument("--quick", action="store_true", help="tiny sizes and 2 rounds: does it run")
    parser.add_argument("--device", choices=("cpu", "gpu"), default="cpu",
                        help="gpu: train on the GPU(s), mirrored over them, no CPU split")
    parser.add_argument("--mixed-precision", action="store_true",
                        help="mixed_float16 (with --device gpu only)")
    parser.add_argument("--json", default=None, help="also write every figure here")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.mixed_precision and args.device != "gpu":
        parser.error("--mixed-precision (mixed_float16) needs --device gpu: on CPUs float16 "
                     "matrix multiplications are emulated")
    if args.child:
        child(*args.child.split(":"), args)
        return
    workloads = [w.strip() for w in args.only.split(",") if w.strip()]
    strategies = [s.strip() for s in args.strategies.split(",") if s.strip()]
    if set(workloads) - set(WORKLOADS):
        parser.error(f"unknown workload(s) {sorted(set(workloads) - set(WORKLOADS))}; "
                     f"choose from {list(WORKLOADS)}")
    if set(strategies) - set(STRATEGIES):
        parser.error(f"unknown strategy(ies) {sorted(set(strategies) - set(STRATEGIES))}; "
                     f"choose from {list(STRATEGIES)}")
    if args.device == "gpu":
        import tensorflow as tf  # the parent trains nothing: listing devices here is harmless
        if not tf.config.list_physical_devices("GPU"):
            sys.exit("--device gpu: TensorFlow sees no GPU on this machine")
    started, results = time.perf_counter(), []
    for workload in workloads:
        for strategy in strategies:
            if strategy == "ps" and workload != "recommender":
                continue  # ps is for embedding-heavy models: the recommender only
            print(f"[{workload} / {strategy}] at {time.perf_counter() - started:.0f} s",
                  flush=True)
            results.append(run_child(workload, strategy, args))
    seconds = time.perf_counter() - started
    print_tables(results, args, seconds)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"results": [dict(r, summary=summarise(r)) if "failed" not in r else r
                                   for r in results],
                       "machine": machine(), "date": time.strftime("%Y-%m-%d %H:%M"),
                       "device": args.device, "mixed_precision": args.mixed_precision,
                       "quick": args.quick, "seconds": seconds}, f, indent=1)


if __name__ == "__main__":
    main()

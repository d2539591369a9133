"""A gallery of small keras.io-style models, each trained by `model.fit` and by kerastrain.

Every example is a builder (called inside the strategy's scope, seeded), the data
arguments of `fit` (made after the strategy exists: a parameter-server cluster
replaces the devices a dataset made before it lives on), and what is special about
it. `compare` trains one example both ways under one strategy; `run_kerastrain`
trains it with kerastrain alone (parameter servers, `tests/_gallery_ps.py`).
`python tests/gallery.py REPORT.json` prints the table of docs/keras_compatibility.md.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from typing import Callable

import numpy as np

import keras
import tensorflow as tf
from keras import layers, ops

SEED = 7
N, BATCH = 64, 16


@dataclasses.dataclass(frozen=True)
class Example:
    name: str
    what: str                        # one line for the table
    build: Callable                  # () -> a compiled model
    data: Callable                   # () -> fit's data arguments
    epochs: int = 2
    callbacks: Callable | None = None  # (directory) -> callbacks
    own_step: bool = False           # overrides train_step (refused under ps today)
    mixed_precision: str | None = None
    ps_loss: tuple = (0.3, 1.5)      # the range the final loss must fall in under ps


EXAMPLES: dict[str, Example] = {}


def example(name, what, **options):
    def register(data):
        def wrap(build):
            EXAMPLES[name] = Example(name, what, build, data, **options)
            return build
        return wrap
    return register


def rng(offset=0):
    return np.random.RandomState(SEED + offset)


def binary_arrays(n=N, features=6):
    x = rng().randn(n, features).astype("float32")
    return x, (x[:, :2].sum(axis=1, keepdims=True) > 0).astype("float32")


def seeded(build):
    def wrapped():
        keras.utils.set_random_seed(SEED)
        return build()
    wrapped.__name__ = build.__name__
    return wrapped


def mlp(units=8, out=1, activation="sigmoid", **dense):
    return keras.Sequential([keras.Input((6,)), layers.Dense(units, activation="relu", **dense),
                             layers.Dense(out, activation=activation)])


# -- 1. a plain MLP -----------------------------------------------------------------------

@example("mlp", "Sequential MLP, NumPy x/y, accuracy")(
    lambda: dict(zip(("x", "y"), binary_arrays()), batch_size=BATCH))
@seeded
def build_mlp():
    model = mlp()
    model.compile(optimizer="adam", loss="binary_crossentropy", metrics=["accuracy"])
    return model


# -- 2. a custom layer with add_loss ------------------------------------------------------

class ActivityPenalty(layers.Layer):
    """keras.io "The add_loss() method": a loss created during the forward pass."""

    def __init__(self, rate=0.1, **kwargs):
        super().__init__(**kwargs)
        self.rate = rate

    def call(self, inputs):
        self.add_loss(self.rate * ops.mean(ops.square(inputs)))
        return inputs


@example("add_loss", "custom layer calling `add_loss` in `call`")(
    lambda: dict(zip(("x", "y"), binary_arrays()), batch_size=BATCH))
@seeded
def build_add_loss():
    inputs = keras.Input((6,))
    hidden = ActivityPenalty()(layers.Dense(8, activation="relu")(inputs))
    model = keras.Model(inputs, layers.Dense(1, activation="sigmoid")(hidden))
    model.compile(optimizer="adam", loss="binary_crossentropy")
    return model


# -- 3. activity and weight regularizers --------------------------------------------------

@example("regularizers", "activity_regularizer and kernel_regularizer")(
    lambda: dict(zip(("x", "y"), binary_arrays()), batch_size=BATCH))
@seeded
def build_regularizers():
    model = mlp(activity_regularizer=keras.regularizers.L2(0.05),
                kernel_regularizer=keras.regularizers.L2(1e-3))
    model.compile(optimizer="adam", loss="binary_crossentropy", metrics=["accuracy"])
    return model


# -- 4. an endpoint layer, trained on x alone ---------------------------------------------

class LogisticEndpoint(layers.Layer):
    """keras.io's endpoint layer: it receives the targets and adds the loss itself."""

    def __init__(self, name=None):
        super().__init__(name=name)
        self.loss_fn = keras.losses.BinaryCrossentropy(from_logits=True)

    def call(self, targets, logits, sample_weights=None):
        self.add_loss(self.loss_fn(targets, logits, sample_weights))
        return ops.sigmoid(logits)


def endpoint_data():
    x, y = binary_arrays()
    return {"x": {"inputs": x, "targets": y}, "batch_size": BATCH}


@example("endpoint", "endpoint layer; `fit(x)` with a dict of inputs and targets, no y")(
    endpoint_data)
@seeded
def build_endpoint():
    inputs = keras.Input((6,), name="inputs")
    targets = keras.Input((1,), name="targets")
    logits = layers.Dense(1)(layers.Dense(8, activation="relu")(inputs))
    outputs = LogisticEndpoint(name="predictions")(targets, logits)
    model = keras.Model({"inputs": inputs, "targets": targets}, outputs)
    model.compile(optimizer="adam")  # no loss: the endpoint adds it
    return model


# -- 5. a VAE with its own train_step -----------------------------------------------------

class Sampling(layers.Layer):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.seed_generator = keras.random.SeedGenerator(1337)

    def call(self, inputs):
        z_mean, z_log_var = inputs
        epsilon = keras.random.normal(ops.shape(z_mean), seed=self.seed_generator)
        return z_mean + ops.exp(0.5 * z_log_var) * epsilon


class VAE(keras.Model):
    """keras.io's "Variational AutoEncoder", on 12-feature vectors."""

    def __init__(self, encoder, decoder, **kwargs):
        super().__init__(**kwargs)
        self.encoder, self.decoder = encoder, decoder
        self.total_loss_tracker = keras.metrics.Mean(name="total_loss")
        self.reconstruction_loss_tracker = keras.metrics.Mean(name="reconstruction_loss")
        self.kl_loss_tracker = keras.metrics.Mean(name="kl_loss")

    @property
    def metrics(self):
        return [self.total_loss_tracker, self.reconstruction_loss_tracker, self.kl_loss_tracker]

    def call(self, x):
        return self.decoder(self.encoder(x)[2])

    def train_step(self, data):
        with tf.GradientTape() as tape:
            z_mean, z_log_var, z = self.encoder(data)
            reconstruction = self.decoder(z)
            reconstruction_loss = ops.mean(ops.sum(
                keras.losses.binary_crossentropy(data[..., None], reconstruction[..., None]),
                axis=1))
            kl_loss = -0.5 * (1 + z_log_var - ops.square(z_mean) - ops.exp(z_log_var))
            kl_loss = ops.mean(ops.sum(kl_loss, axis=1))
            total_loss = reconstruction_loss + kl_loss
        grads = tape.gradient(total_loss, self.trainable_weights)
        self.optimizer.apply_gradients(zip(grads, self.trainable_weights))
        self.total_loss_tracker.update_state(total_loss)
        self.reconstruction_loss_tracker.update_state(reconstruction_loss)
        self.kl_loss_tracker.update_state(kl_loss)
        return {"loss": self.total_loss_tracker.result(),
                "reconstruction_loss": self.reconstruction_loss_tracker.result(),
                "kl_loss": self.kl_loss_tracker.result()}


def unit_vectors(n=N, features=12):
    return (rng(1).rand(n, features) > 0.5).astype("float32")


@example("vae", "VAE, own `train_step`, seeded sampling, `fit(x)` on NumPy x alone",
         own_step=True)(lambda: {"x": unit_vectors(), "batch_size": BATCH})
@seeded
def build_vae():
    inputs = keras.Input((12,))
    h = layers.Dense(8, activation="relu")(inputs)
    z_mean, z_log_var = layers.Dense(2, name="z_mean")(h), layers.Dense(2, name="z_log_var")(h)
    encoder = keras.Model(inputs, [z_mean, z_log_var, Sampling()([z_mean, z_log_var])])
    latent = keras.Input((2,))
    decoder = keras.Model(latent, layers.Dense(12, activation="sigmoid")(
        layers.Dense(8, activation="relu")(latent)))
    model = VAE(encoder, decoder)
    model.compile(optimizer=keras.optimizers.Adam(1e-2))
    return model


# -- 6. a GAN with its own train_step and compile -----------------------------------------

class GAN(keras.Model):
    """keras.io's "DCGAN overriding train_step", with Dense nets on 8-feature vectors."""

    def __init__(self, discriminator, generator, latent_dim):
        super().__init__()
        self.discriminator, self.generator, self.latent_dim = discriminator, generator, latent_dim
        self.seed_generator = keras.random.SeedGenerator(1337)

    def compile(self, d_optimizer, g_optimizer, loss_fn):
        super().compile()
        self.d_optimizer, self.g_optimizer, self.loss_fn = d_optimizer, g_optimizer, loss_fn
        self.d_loss_metric = keras.metrics.Mean(name="d_loss")
        self.g_loss_metric = keras.metrics.Mean(name="g_loss")

    @property
    def metrics(self):
        return [self.d_loss_metric, self.g_loss_metric]

    def train_step(self, real):
        batch_size = ops.shape(real)[0]
        noise = keras.random.normal((batch_size, self.latent_dim), seed=self.seed_generator)
        combined = ops.concatenate([self.generator(noise), real], axis=0)
        labels = ops.concatenate([ops.ones((batch_size, 1)), ops.zeros((batch_size, 1))], 0)
        labels += 0.05 * keras.random.uniform(ops.shape(labels), seed=self.seed_generator)
        with tf.GradientTape() as tape:
            d_loss = self.loss_fn(labels, self.discriminator(combined))
        grads = tape.gradient(d_loss, self.discriminator.trainable_weights)
        self.d_optimizer.apply_gradients(zip(grads, self.discriminator.trainable_weights))
        noise = keras.random.normal((batch_size, self.latent_dim), seed=self.seed_generator)
        with tf.GradientTape() as tape:
            g_loss = self.loss_fn(ops.zeros((batch_size, 1)),
                                  self.discriminator(self.generator(noise)))
        grads = tape.gradient(g_loss, self.generator.trainable_weights)
        self.g_optimizer.apply_gradients(zip(grads, self.generator.trainable_weights))
        self.d_loss_metric.update_state(d_loss)
        self.g_loss_metric.update_state(g_loss)
        return {"d_loss": self.d_loss_metric.result(), "g_loss": self.g_loss_metric.result()}


@example("gan", "GAN, own `train_step` and `compile`, two optimizers, x-only tf.data",
         own_step=True)(
    lambda: {"x": tf.data.Dataset.from_tensor_slices(rng(2).randn(N, 8).astype(
        "float32")).batch(BATCH)})
@seeded
def build_gan():
    discriminator = keras.Sequential([keras.Input((8,)), layers.Dense(8, activation="relu"),
                                      layers.Dense(1, activation="sigmoid")])
    generator = keras.Sequential([keras.Input((4,)), layers.Dense(8, activation="relu"),
                                  layers.Dense(8)])
    model = GAN(discriminator, generator, latent_dim=4)
    d_opt, g_opt = keras.optimizers.Adam(1e-3), keras.optimizers.Adam(1e-3)
    # Built here, in the strategy's scope: a MirroredStrategy refuses variables created
    # inside the replicated step (Keras's fit builds only `model.optimizer` itself).
    d_opt.build(discriminator.trainable_variables)
    g_opt.build(generator.trainable_variables)
    model.compile(d_optimizer=d_opt, g_optimizer=g_opt,
                  loss_fn=keras.losses.BinaryCrossentropy())
    return model


# -- 7. a compute_loss override -----------------------------------------------------------

class SmoothedLoss(keras.Model):
    """keras.io "customizing fit" via `compute_loss`: the compiled loss plus a penalty."""

    def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None, training=True):
        loss = super().compute_loss(x, y, y_pred, sample_weight, training)
        return loss + 0.1 * ops.mean(ops.square(y_pred))


@example("compute_loss", "`compute_loss` override calling super (compiled loss, model.losses)")(
    lambda: dict(zip(("x", "y"), binary_arrays()), batch_size=BATCH))
@seeded
def build_compute_loss():
    inputs = keras.Input((6,))
    h = layers.Dense(8, activation="relu", kernel_regularizer="l2")(inputs)
    model = SmoothedLoss(inputs, layers.Dense(1)(h))
    model.compile(optimizer="adam", loss="mse", metrics=["mae"])
    return model


# -- 8. dict inputs and outputs -----------------------------------------------------------

def tickets():
    r = rng(3)
    title = r.randint(1, 50, size=(N, 8))
    tags = (r.rand(N, 4) > 0.5).astype("float32")
    priority = r.rand(N, 1).astype("float32")
    department = r.randint(0, 3, size=(N,))
    return {"x": {"title": title, "tags": tags},
            "y": {"priority": priority, "department": department}, "batch_size": BATCH}


@example("multi_io", "keras.io multi-input/output: dict x and y, loss_weights, metrics per output")(
    tickets)
@seeded
def build_multi_io():
    title, tags = keras.Input((8,), name="title", dtype="int32"), keras.Input((4,), name="tags")
    features = layers.GlobalAveragePooling1D()(layers.Embedding(50, 6)(title))
    h = layers.concatenate([features, tags])
    outputs = {"priority": layers.Dense(1, name="priority")(h),
               "department": layers.Dense(3, activation="softmax", name="department")(h)}
    model = keras.Model({"title": title, "tags": tags}, outputs)
    model.compile(optimizer="adam",
                  loss={"priority": "mse", "department": "sparse_categorical_crossentropy"},
                  loss_weights={"priority": 1.0, "department": 0.2},
                  metrics={"department": ["accuracy"]})
    return model


# -- 9. class_weight ----------------------------------------------------------------------

def imbalanced():
    x = rng(4).randn(N, 6).astype("float32")
    return {"x": x, "y": (x[:, 0] > 0.8).astype("float32")[:, None], "batch_size": BATCH,
            "class_weight": {0: 1.0, 1: 4.0}}


@example("class_weight", "imbalanced classes, `class_weight`, Recall metric")(imbalanced)
@seeded
def build_class_weight():
    model = mlp()
    model.compile(optimizer="adam", loss="binary_crossentropy",
                  metrics=[keras.metrics.Recall(name="recall")])
    return model


# -- 10. sample weights in a dataset ------------------------------------------------------

def weighted_dataset():
    x = rng(5).randn(N, 6).astype("float32")
    y = x @ np.arange(1, 7, dtype="float32")[:, None] / 6
    w = np.linspace(0.2, 2.0, N).astype("float32")
    return {"x": tf.data.Dataset.from_tensor_slices((x, y, w)).batch(BATCH)}


@example("sample_weight", "tf.data of (x, y, sample_weight), regression, MAE",
         ps_loss=(0.5, 10.0))(weighted_dataset)
@seeded
def build_sample_weight():
    model = mlp(activation=None)
    model.compile(optimizer="adam", loss="mse", metrics=["mae"], weighted_metrics=["mse"])
    return model


# -- 11. lookup-table preprocessing in the model ------------------------------------------

VOCABULARY = ["red", "green", "blue", "cyan", "magenta"]


def colours():
    r = rng(6)
    words = np.array(VOCABULARY + ["unknown"])[r.randint(0, 6, size=(N, 4))]
    y = (words == "red").sum(axis=1, keepdims=True).astype("float32")
    # As keras.io feeds strings: a tf.data pipeline (model.fit refuses NumPy unicode arrays).
    return {"x": tf.data.Dataset.from_tensor_slices((words, y)).batch(BATCH)}


@example("lookup", "StringLookup (a lookup table) + Embedding, string inputs from tf.data")(
    colours)
@seeded
def build_lookup():
    inputs = keras.Input((4,), dtype="string")
    ids = layers.StringLookup(vocabulary=VOCABULARY)(inputs)
    h = layers.GlobalAveragePooling1D()(layers.Embedding(len(VOCABULARY) + 1, 4)(ids))
    model = keras.Model(inputs, layers.Dense(1)(h))
    model.compile(optimizer="adam", loss="mse")
    return model


# -- 12. a BatchNorm convnet --------------------------------------------------------------

def images():
    r = rng(7)
    y = r.randint(0, 3, size=(N,))
    x = r.randn(N, 8, 8, 1).astype("float32") + y[:, None, None, None]
    return {"x": x, "y": y, "batch_size": BATCH}


@example("convnet_bn", "Conv2D + BatchNormalization + pooling, sparse categorical")(images)
@seeded
def build_convnet():
    model = keras.Sequential([
        keras.Input((8, 8, 1)), layers.Conv2D(4, 3, use_bias=False),
        layers.BatchNormalization(), layers.ReLU(), layers.MaxPooling2D(),
        layers.Flatten(), layers.Dense(3, activation="softmax")])
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy",
                  metrics=["sparse_categorical_accuracy"])
    return model


# -- 13. an RNN ---------------------------------------------------------------------------

def sequences():
    x = rng(8).randint(1, 20, size=(N, 6))
    return {"x": x, "y": (x[:, -1] > 10).astype("float32")[:, None], "batch_size": BATCH}


@example("rnn", "Embedding + LSTM sequence classifier")(sequences)
@seeded
def build_rnn():
    model = keras.Sequential([keras.Input((6,), dtype="int32"), layers.Embedding(20, 4),
                              layers.LSTM(6), layers.Dense(1, activation="sigmoid")])
    model.compile(optimizer="adam", loss="binary_crossentropy", metrics=["accuracy"])
    return model


# -- 14. mixed precision ------------------------------------------------------------------

@example("mixed_bfloat16", "mixed_bfloat16 policy (CPU), float32 output layer",
         mixed_precision="mixed_bfloat16")(
    lambda: dict(zip(("x", "y"), binary_arrays()), batch_size=BATCH))
@seeded
def build_mixed():
    model = keras.Sequential([keras.Input((6,)), layers.Dense(8, activation="relu"),
                              layers.Dense(1, activation="sigmoid", dtype="float32")])
    model.compile(optimizer="adam", loss="binary_crossentropy", metrics=["accuracy"])
    return model


# -- 15-16. Keras callbacks ---------------------------------------------------------------

def early_stop_callbacks(directory):
    return [keras.callbacks.EarlyStopping(monitor="val_loss", patience=2, min_delta=0.05,
                                          restore_best_weights=True),
            keras.callbacks.ReduceLROnPlateau(monitor="loss", factor=0.5, patience=0,
                                              min_delta=0.5)]


@example("early_stop_reduce_lr", "EarlyStopping(restore_best_weights) + ReduceLROnPlateau, "
         "validation_split", epochs=6, callbacks=early_stop_callbacks)(
    lambda: dict(zip(("x", "y"), binary_arrays()), batch_size=BATCH, validation_split=0.25))
@seeded
def build_early_stop():
    model = mlp()
    model.compile(optimizer=keras.optimizers.SGD(0.05), loss="binary_crossentropy")
    return model


def file_callbacks(directory):
    return [keras.callbacks.ModelCheckpoint(os.path.join(directory, "e{epoch}.keras")),
            keras.callbacks.CSVLogger(os.path.join(directory, "log.csv"))]


@example("checkpoint_csv", "ModelCheckpoint (.keras each epoch) + CSVLogger",
         callbacks=file_callbacks)(
    lambda: dict(zip(("x", "y"), binary_arrays()), batch_size=BATCH))
@seeded
def build_checkpoint_csv():
    model = mlp()
    model.compile(optimizer="adam", loss="binary_crossentropy", metrics=["accuracy"])
    return model


NAMES = list(EXAMPLES)


# -- running ------------------------------------------------------------------------------

def _callbacks(ex, directory):
    if ex.callbacks is None:
        return []
    os.makedirs(directory, exist_ok=True)
    return ex.callbacks(str(directory))


def run_keras(ex, directory, strategy=None):
    """`model.fit` on the example (built in `strategy`'s scope when given)."""
    import contextlib
    previous = keras.mixed_precision.dtype_policy()
    if ex.mixed_precision:
        keras.mixed_precision.set_dtype_policy(ex.mixed_precision)
    try:
        with strategy.scope() if strategy is not None else contextlib.nullcontext():
            model = ex.build()
    finally:
        keras.mixed_precision.set_dtype_policy(previous)
    history = model.fit(epochs=ex.epochs, verbose=0, shuffle=False,
                        callbacks=_callbacks(ex, directory), **ex.data())
    return history.history, model


def run_kerastrain(ex, directory, strategy):
    import kerastrain as kt
    trainer = kt.Trainer(ex.build, strategy=strategy, verbose=0, seed=SEED,
                         mixed_precision=ex.mixed_precision)
    history = trainer.fit(epochs=ex.epochs, shuffle=False, callbacks=_callbacks(ex, directory),
                          **ex.data())
    return history.history, trainer


def relative_difference(ours, theirs):
    """The largest relative difference over every logged value of every epoch."""
    worst = 0.0
    for key in theirs:
        a, b = np.asarray(ours[key], np.float64), np.asarray(theirs[key], np.float64)
        if a.shape != b.shape:
            return float("inf")
        worst = max(worst, float(np.max(np.abs(a - b) / np.maximum(np.abs(b), 1e-12))))
    return worst


def compare(ex, strategy, directory):
    """Train `ex` with kerastrain under `strategy` and with `model.fit`: plain (no strategy)
    against one_device, else under the Trainer's own strategy object. Returns the figures
    the table shows; `keras_error` when `model.fit` cannot train it there."""
    ours, trainer = run_kerastrain(ex, os.path.join(directory, "ours"), strategy)
    result = {"ours": ours, "final_loss": _final(ours),
              "epochs": len(next(iter(ours.values())))}
    plain = trainer.strategy_name == "one_device"
    try:
        theirs, _ = run_keras(ex, os.path.join(directory, "keras"),
                              None if plain else trainer.strategy)
    except Exception as e:  # recorded: the table says what model.fit does here
        result["keras_error"] = f"{type(e).__name__}: {str(e).splitlines()[0]}"
        return result
    result.update(keras=theirs, keys=sorted(theirs) == sorted(ours),
                  rel=relative_difference(ours, theirs) if sorted(theirs) == sorted(ours)
                  else None)
    return result


def _final(history):
    key = "loss" if "loss" in history else sorted(history)[0]
    return float(history[key][-1])


def table(report):
    """Markdown rows of docs/keras_compatibility.md from a report
    `{example: {strategy: figures}}`."""
    rows = ["| example | what it exercises | one_device vs `fit` | mirrored (2 CPUs) vs `fit` "
            "under the same strategy | ps (2 workers, 1 ps) |", "|---|---|---|---|---|"]
    for name, ex in EXAMPLES.items():
        cells = []
        for strategy in ("one_device", "mirrored"):
            r = report.get(name, {}).get(strategy)
            if r is None:
                cells.append("not run")
            elif r.get("keras_error"):
                cells.append(f"kerastrain trains (final loss {r['final_loss']:.4f}); `model.fit` "
                             f"fails: {r['keras_error'].split('. ')[0][:110]}")
            elif r.get("rel") is not None and r["rel"] <= 1e-5:
                cells.append(f"equal: max rel. diff {r['rel']:.1e}, {r['epochs']} epochs")
            else:
                cells.append(f"differs: max rel. diff {r.get('rel')}")
        ps = report.get(name, {}).get("ps")
        if ps is None:
            cells.append("not run")
        elif ps.get("refused"):
            cells.append("refused with a clear error (own `train_step`)")
        else:
            low, high = ex.ps_loss
            predicted = (f"; `predict` = `model.predict` (rel. diff {ps['predict_rel']:.1e})"
                         if "predict_rel" in ps else "")
            cells.append(f"trains: final loss {ps['final_loss']:.3f} after {ps['epochs']} epochs "
                         f"(range {low}-{high}){predicted}")
        rows.append(f"| `{name}` | {ex.what} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


if __name__ == "__main__":
    with open(sys.argv[1]) as f:
        print(table(json.load(f)))

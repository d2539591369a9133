"""A gallery of small keras.io-style models, each trained with `model.fit` and with kerastrain.

Each `Example` builds a seeded, compiled model and gives `fit` arguments with unshuffled
data, so `model.fit` and `kerastrain.Trainer.fit` see the same batches in the same order.
`tests/test_gallery.py` runs them on one device, under MirroredStrategy and under parameter
servers; `docs/keras_compatibility.md` tabulates the results.
"""

from __future__ import annotations

import dataclasses
import os

import numpy as np

import keras
import tensorflow as tf
from keras import ops

N, BATCH = 48, 16  # 3 steps an epoch
_rng = np.random.RandomState(0)
X = _rng.randn(N, 6).astype("float32")
Y = (X[:, :1] * 2 + 1).astype("float32")
LABELS = (X[:, :1] > 0).astype("float32")


@dataclasses.dataclass(frozen=True)
class Example:
    """One gallery model.

    build: () -> a compiled model (seeded inside).
    fit_args: (directory) -> `fit` keyword arguments shared by model.fit and kerastrain
        (`x` is an array, a dict of arrays or a dataset; `callbacks` made fresh in directory).
    ps: None when it trains under parameter servers, else a regex of the refusal.
    trainer_kwargs: extra `kerastrain.Trainer` options (with the matching Keras setting
        applied by the test around the reference build).
    """
    name: str
    build: object
    fit_args: object
    ps: str | None = None
    ps_key: str = "loss"  # the logged value judged under ps
    trainer_kwargs: dict = dataclasses.field(default_factory=dict)
    epochs: int = 2
    missing_keys: tuple = ()  # logged by model.fit, not by kerastrain (a known difference)
    keras_mirrored: bool = True  # False: Keras fit fails under MirroredStrategy (compared
    # with Keras fit on one device instead)
    keras_by_hand: object = None  # (model) -> None: what a user must add for Keras fit to
    # run under a tf.distribute strategy, done to the reference before its fit (kerastrain
    # does it itself)


def _seeded(fn):
    def build():
        keras.utils.set_random_seed(1)
        return fn()
    return build


def _xy(x=X, y=Y, **extra):
    return lambda directory: dict(x=x, y=y, batch_size=BATCH, shuffle=False, **extra)


# -- 1. a custom layer that adds a loss (keras.io "Making new layers and models") ----------

class ActivityPenalty(keras.layers.Layer):
    def call(self, inputs):
        self.add_loss(0.1 * ops.mean(ops.square(inputs)))
        return inputs


@_seeded
def custom_layer_add_loss():
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(4), ActivityPenalty(),
                              keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse", metrics=["mae"])
    return model


# -- 2. activity regularizer -----------------------------------------------------------

@_seeded
def activity_regularizer():
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(
        4, activity_regularizer=keras.regularizers.L2(1.0)), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse")
    return model


# -- 3. an endpoint layer: the loss from targets passed as inputs, x-only data ------------

class LogisticEndpoint(keras.layers.Layer):
    def __init__(self, name=None):
        super().__init__(name=name)
        self.loss_fn = keras.losses.BinaryCrossentropy(from_logits=True)
        self.accuracy_fn = keras.metrics.BinaryAccuracy(name="accuracy")

    def call(self, targets, logits):
        self.add_loss(self.loss_fn(targets, logits))
        probabilities = ops.sigmoid(logits)
        self.accuracy_fn.update_state(targets, probabilities)  # a layer-owned metric
        return probabilities


@_seeded
def endpoint_layer():
    x, t = keras.Input((6,), name="x"), keras.Input((1,), name="t")
    model = keras.Model({"x": x, "t": t}, LogisticEndpoint()(t, keras.layers.Dense(1)(x)))
    model.compile(optimizer=keras.optimizers.Adam(0.01))  # no loss: the layer adds it
    return model


def _endpoint_data(directory):
    return dict(x=tf.data.Dataset.from_tensor_slices({"x": X, "t": LABELS}).batch(BATCH))


# -- 4. a VAE with its own train_step (keras.io "Variational AutoEncoder") -----------------

class Sampling(keras.layers.Layer):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.seed_generator = keras.random.SeedGenerator(1337)

    def call(self, inputs):
        mean, log_var = inputs
        eps = keras.random.normal(ops.shape(mean), seed=self.seed_generator)
        return mean + ops.exp(0.5 * log_var) * eps


class VAE(keras.Model):
    def __init__(self, encoder, decoder, **kwargs):
        super().__init__(**kwargs)
        self.encoder, self.decoder = encoder, decoder
        self.total = keras.metrics.Mean(name="loss")
        self.reconstruction = keras.metrics.Mean(name="reconstruction_loss")
        self.kl = keras.metrics.Mean(name="kl_loss")

    @property
    def metrics(self):
        return [self.total, self.reconstruction, self.kl]

    def call(self, x):
        return self.decoder(self.encoder(x)[2])

    def train_step(self, data):
        with tf.GradientTape() as tape:
            mean, log_var, z = self.encoder(data)
            reconstruction = ops.mean(ops.sum(ops.square(data - self.decoder(z)), axis=1))
            kl = ops.mean(ops.sum(-0.5 * (1 + log_var - ops.square(mean) - ops.exp(log_var)),
                                  axis=1))
            total = reconstruction + kl
        grads = tape.gradient(total, self.trainable_weights)
        self.optimizer.apply_gradients(zip(grads, self.trainable_weights))
        self.total.update_state(total)
        self.reconstruction.update_state(reconstruction)
        self.kl.update_state(kl)
        return {m.name: m.result() for m in self.metrics}


@_seeded
def vae_train_step():
    inputs = keras.Input((6,))
    h = keras.layers.Dense(4, activation="relu")(inputs)
    mean, log_var = keras.layers.Dense(2)(h), keras.layers.Dense(2)(h)
    encoder = keras.Model(inputs, [mean, log_var, Sampling()([mean, log_var])])
    latent = keras.Input((2,))
    decoder = keras.Model(latent, keras.layers.Dense(6)(keras.layers.Dense(4)(latent)))
    model = VAE(encoder, decoder)
    model.compile(optimizer=keras.optimizers.Adam(0.01))
    return model


def _x_only(directory):
    return dict(x=tf.data.Dataset.from_tensor_slices(X).batch(BATCH))


# -- 5. a GAN: two optimizers in its own train_step (keras.io "DCGAN"/"Conditional GAN") --

class GAN(keras.Model):
    def __init__(self, discriminator, generator, latent_dim, **kwargs):
        super().__init__(**kwargs)
        self.discriminator, self.generator, self.latent_dim = discriminator, generator, \
            latent_dim
        self.seed_generator = keras.random.SeedGenerator(7)
        self.d_loss = keras.metrics.Mean(name="d_loss")
        self.g_loss = keras.metrics.Mean(name="g_loss")

    @property
    def metrics(self):
        return [self.d_loss, self.g_loss]

    def compile(self, d_optimizer, g_optimizer, loss_fn):
        super().compile()
        self.d_optimizer, self.g_optimizer, self.loss_fn = d_optimizer, g_optimizer, loss_fn
        # Built here, not on their first step: under MirroredStrategy both Keras fit and
        # kerastrain fail to create an optimizer's slots inside the compiled step.
        d_optimizer.build(self.discriminator.trainable_variables)
        g_optimizer.build(self.generator.trainable_variables)

    def call(self, images):
        # What the model does to a batch of the data (Keras builds it from one before
        # training under a strategy): here, the discriminator's logits.
        return self.discriminator(images)

    def train_step(self, real):
        batch = ops.shape(real)[0]
        z = keras.random.normal((batch, self.latent_dim), seed=self.seed_generator)
        fake = self.generator(z)
        images = ops.concatenate([fake, real], axis=0)
        labels = ops.concatenate([ops.ones((batch, 1)), ops.zeros((batch, 1))], axis=0)
        with tf.GradientTape() as tape:
            d_loss = self.loss_fn(labels, self.discriminator(images))
        grads = tape.gradient(d_loss, self.discriminator.trainable_weights)
        self.d_optimizer.apply_gradients(zip(grads, self.discriminator.trainable_weights))
        z = keras.random.normal((batch, self.latent_dim), seed=self.seed_generator)
        with tf.GradientTape() as tape:
            g_loss = self.loss_fn(ops.zeros((batch, 1)), self.discriminator(self.generator(z)))
        grads = tape.gradient(g_loss, self.generator.trainable_weights)
        self.g_optimizer.apply_gradients(zip(grads, self.generator.trainable_weights))
        self.d_loss.update_state(d_loss)
        self.g_loss.update_state(g_loss)
        return {"d_loss": self.d_loss.result(), "g_loss": self.g_loss.result()}


@_seeded
def gan_two_optimizers():
    discriminator = keras.Sequential([keras.Input((6,)), keras.layers.Dense(4, activation="relu"),
                                      keras.layers.Dense(1)])
    generator = keras.Sequential([keras.Input((3,)), keras.layers.Dense(6)])
    model = GAN(discriminator, generator, latent_dim=3)
    model.compile(d_optimizer=keras.optimizers.Adam(0.01), g_optimizer=keras.optimizers.Adam(0.01),
                  loss_fn=keras.losses.BinaryCrossentropy(from_logits=True))
    return model


# -- 5b. the GAN exactly as keras.io writes it ("DCGAN overriding train_step") -------------
# Its optimizers build themselves in their first `apply` (kerastrain builds them first:
# `models.build_step_optimizers`), its metrics are made in `compile`, it has no `call`.

class KerasIoGAN(keras.Model):
    def __init__(self, discriminator, generator, latent_dim):
        super().__init__()
        self.discriminator = discriminator
        self.generator = generator
        self.latent_dim = latent_dim
        self.seed_generator = keras.random.SeedGenerator(1337)

    def compile(self, d_optimizer, g_optimizer, loss_fn):
        super().compile()
        self.d_optimizer = d_optimizer
        self.g_optimizer = g_optimizer
        self.loss_fn = loss_fn
        self.d_loss_metric = keras.metrics.Mean(name="d_loss")
        self.g_loss_metric = keras.metrics.Mean(name="g_loss")

    @property
    def metrics(self):
        return [self.d_loss_metric, self.g_loss_metric]

    def train_step(self, real_images):
        batch_size = ops.shape(real_images)[0]
        random_latent_vectors = keras.random.normal(
            shape=(batch_size, self.latent_dim), seed=self.seed_generator)
        generated_images = self.generator(random_latent_vectors)
        combined_images = ops.concatenate([generated_images, real_images], axis=0)
        labels = ops.concatenate([ops.ones((batch_size, 1)), ops.zeros((batch_size, 1))], axis=0)
        labels += 0.05 * keras.random.uniform(ops.shape(labels), seed=self.seed_generator)
        with tf.GradientTape() as tape:
            predictions = self.discriminator(combined_images)
            d_loss = self.loss_fn(labels, predictions)
        grads = tape.gradient(d_loss, self.discriminator.trainable_weights)
        self.d_optimizer.apply_gradients(zip(grads, self.discriminator.trainable_weights))
        random_latent_vectors = keras.random.normal(
            shape=(batch_size, self.latent_dim), seed=self.seed_generator)
        misleading_labels = ops.zeros((batch_size, 1))
        with tf.GradientTape() as tape:
            predictions = self.discriminator(self.generator(random_latent_vectors))
            g_loss = self.loss_fn(misleading_labels, predictions)
        grads = tape.gradient(g_loss, self.generator.trainable_weights)
        self.g_optimizer.apply_gradients(zip(grads, self.generator.trainable_weights))
        self.d_loss_metric.update_state(d_loss)
        self.g_loss_metric.update_state(g_loss)
        return {"d_loss": self.d_loss_metric.result(), "g_loss": self.g_loss_metric.result()}


def _build_gan_by_hand(gan):
    # Keras fit under a tf.distribute strategy cannot build a model without `call`, nor
    # (under MirroredStrategy) create an optimizer's slots in its first `apply`.
    gan.d_optimizer.build(gan.discriminator.trainable_variables)
    gan.g_optimizer.build(gan.generator.trainable_variables)
    gan.built = True


@_seeded
def gan_keras_io():
    discriminator = keras.Sequential([keras.Input((6,)), keras.layers.Dense(4),
                                      keras.layers.LeakyReLU(negative_slope=0.2),
                                      keras.layers.Dense(1)], name="discriminator")
    generator = keras.Sequential([keras.Input((3,)), keras.layers.Dense(6)], name="generator")
    gan = KerasIoGAN(discriminator=discriminator, generator=generator, latent_dim=3)
    gan.compile(d_optimizer=keras.optimizers.Adam(learning_rate=0.01),
                g_optimizer=keras.optimizers.Adam(learning_rate=0.01),
                loss_fn=keras.losses.BinaryCrossentropy(from_logits=True))
    return gan


# -- 6. compute_loss overridden ------------------------------------------------------------

class HuberPlusL1(keras.Model):
    def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None, training=True):
        loss = ops.mean(keras.losses.huber(y, y_pred, delta=0.5))
        return loss + 0.01 * ops.mean(ops.abs(y_pred)) + ops.sum(self.losses)


@_seeded
def compute_loss_override():
    inputs = keras.Input((6,))
    outputs = keras.layers.Dense(1, kernel_regularizer="l2")(
        keras.layers.Dense(4, activation="tanh")(inputs))
    model = HuberPlusL1(inputs, outputs)
    model.compile(optimizer=keras.optimizers.SGD(0.05), metrics=["mae"])
    return model


# -- 7. multi-input, multi-output with dicts (keras.io "functional API") ------------------

@_seeded
def multi_io_dict():
    a, b = keras.Input((6,), name="a"), keras.Input((3,), name="b")
    h = keras.layers.Dense(8, activation="relu")(keras.layers.Concatenate()([a, b]))
    model = keras.Model({"a": a, "b": b}, {
        "value": keras.layers.Dense(1, name="value")(h),
        "label": keras.layers.Dense(1, activation="sigmoid", name="label")(h)})
    model.compile(optimizer=keras.optimizers.Adam(0.01),
                  loss={"value": "mse", "label": "binary_crossentropy"},
                  loss_weights={"value": 1.0, "label": 0.5},
                  metrics={"value": ["mae"], "label": ["accuracy"]})
    return model


_multi_io_data = _xy(x={"a": X, "b": X[:, :3] * 0.5}, y={"value": Y, "label": LABELS})


# -- 8. x-only data with add_loss: an autoencoder whose loss is added in call ------------

class Autoencoder(keras.Model):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.encode = keras.layers.Dense(3, activation="relu")
        self.decode = keras.layers.Dense(6)

    def call(self, x):
        reconstruction = self.decode(self.encode(x))
        self.add_loss(ops.mean(ops.square(x - reconstruction)))
        return reconstruction


@_seeded
def x_only_add_loss():
    model = Autoencoder()
    model.compile(optimizer=keras.optimizers.Adam(0.01))
    return model


# -- 9. class_weight on a binary classifier ------------------------------------------------

@_seeded
def class_weight():
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(4, activation="relu"),
                              keras.layers.Dense(1, activation="sigmoid")])
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="binary_crossentropy",
                  metrics=["accuracy"])
    return model


# -- 10. StringLookup preprocessing inside the model ----------------------------------------

WORDS = np.array(["red", "green", "blue", "cyan", "pink", "gray"])[np.arange(N) % 6][:, None]
WORD_LABELS = (np.arange(N) % 3 == 0).astype("float32")[:, None]


def _words(directory):
    # A dataset: Keras's fit refuses NumPy string arrays ("Invalid dtype: str160");
    # kerastrain takes them.
    return dict(x=tf.data.Dataset.from_tensor_slices((WORDS, WORD_LABELS)).batch(BATCH))


@_seeded
def string_lookup():
    inputs = keras.Input((1,), dtype="string")
    ids = keras.layers.StringLookup(vocabulary=["red", "green", "blue", "cyan"])(inputs)
    x = keras.layers.Flatten()(keras.layers.Embedding(5, 4)(ids))
    model = keras.Model(inputs, keras.layers.Dense(1, activation="sigmoid")(x))
    model.compile(optimizer=keras.optimizers.Adam(0.05), loss="binary_crossentropy",
                  metrics=["accuracy"])
    return model


# -- 11. a convnet with BatchNormalization --------------------------------------------------

IMAGES = _rng.rand(N, 8, 8, 1).astype("float32")
CLASSES = (np.arange(N) % 3).astype("int32")


@_seeded
def batchnorm_convnet():
    model = keras.Sequential([
        keras.Input((8, 8, 1)), keras.layers.Conv2D(4, 3, use_bias=False),
        keras.layers.BatchNormalization(), keras.layers.ReLU(), keras.layers.MaxPooling2D(),
        keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(3, activation="softmax")])
    model.compile(optimizer=keras.optimizers.SGD(0.1, momentum=0.9),
                  loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    return model


# -- 12. recurrent: GRU then LSTM -------------------------------------------------------

SEQUENCES = X.reshape(N, 3, 2)


@_seeded
def gru_lstm():
    model = keras.Sequential([keras.Input((3, 2)), keras.layers.GRU(4, return_sequences=True),
                              keras.layers.LSTM(4), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.RMSprop(0.01), loss="mse")
    return model


# -- 13. mixed precision (bfloat16 compute, float32 variables) ------------------------

@_seeded
def mixed_bfloat16():
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(8, activation="relu"),
                              keras.layers.Dense(1, dtype="float32")])
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
    return model


# -- 14. callbacks: EarlyStopping, ReduceLROnPlateau, CSVLogger, ModelCheckpoint ----------

@_seeded
def callbacks():
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse", metrics=["mae"])
    return model


def _callbacks_data(directory):
    return dict(x=X, y=Y, batch_size=BATCH, shuffle=False, validation_data=(X[:16], Y[:16]),
                callbacks=[
                    # min_delta so large that no epoch improves: stops after patience + 1.
                    keras.callbacks.EarlyStopping(monitor="val_loss", patience=2,
                                                  min_delta=1e6),
                    keras.callbacks.ReduceLROnPlateau(monitor="loss", patience=0, factor=0.5,
                                                      min_delta=1e6),
                    keras.callbacks.CSVLogger(os.path.join(directory, "log.csv")),
                    keras.callbacks.ModelCheckpoint(os.path.join(directory, "best.weights.h5"),
                                                    monitor="val_loss",
                                                    save_weights_only=True)])


# -- 14b. a Keras script's BackupAndRestore (kerastrain keeps its checkpoints there) --------

def _backup_data(directory):
    return dict(x=X, y=Y, batch_size=BATCH, shuffle=False, callbacks=[
        keras.callbacks.BackupAndRestore(os.path.join(directory, "backup"), save_freq=2)])


# -- 15. sample weights with weighted metrics --------------------------------------------

@_seeded
def sample_weight_metrics():
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(4, activation="relu"),
                              keras.layers.Dense(1, activation="sigmoid")])
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="binary_crossentropy",
                  metrics=["accuracy"], weighted_metrics=["accuracy", "auc"])
    return model


# -- 16. a subclassed model with Dropout (seeded randomness in the step) -------------------

class DropoutMLP(keras.Model):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.hidden = keras.layers.Dense(8, activation="relu")
        self.dropout = keras.layers.Dropout(0.5, seed=3)
        self.out = keras.layers.Dense(1)

    def call(self, x, training=False):
        return self.out(self.dropout(self.hidden(x), training=training))


@_seeded
def dropout_subclassed():
    model = DropoutMLP()
    model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
    return model


# -- 17. Embedding + sparse categorical cross-entropy on integer tokens -------------------

TOKENS = _rng.randint(0, 20, size=(N, 4)).astype("int32")


@_seeded
def embedding_classifier():
    inputs = keras.Input((4,), dtype="int32")
    x = keras.layers.GlobalAveragePooling1D()(keras.layers.Embedding(20, 4)(inputs))
    model = keras.Model(inputs, keras.layers.Dense(3)(x))
    model.compile(optimizer=keras.optimizers.Adam(0.02),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["sparse_categorical_accuracy"])
    return model



# -- 17. keras.io's "Text classification with Transformer", unseeded Dropout everywhere -----

class TransformerBlock(keras.layers.Layer):
    def __init__(self, embed_dim, num_heads, ff_dim, rate=0.1):
        super().__init__()
        self.att = keras.layers.MultiHeadAttention(num_heads=num_heads, key_dim=embed_dim)
        self.ffn = keras.Sequential([keras.layers.Dense(ff_dim, activation="relu"),
                                     keras.layers.Dense(embed_dim)])
        self.layernorm1 = keras.layers.LayerNormalization(epsilon=1e-6)
        self.layernorm2 = keras.layers.LayerNormalization(epsilon=1e-6)
        self.dropout1 = keras.layers.Dropout(rate)
        self.dropout2 = keras.layers.Dropout(rate)

    def call(self, inputs, training=None):
        attn_output = self.att(inputs, inputs)
        attn_output = self.dropout1(attn_output, training=training)
        out1 = self.layernorm1(inputs + attn_output)
        ffn_output = self.ffn(out1)
        ffn_output = self.dropout2(ffn_output, training=training)
        return self.layernorm2(out1 + ffn_output)


class TokenAndPositionEmbedding(keras.layers.Layer):
    def __init__(self, maxlen, vocab_size, embed_dim):
        super().__init__()
        self.token_emb = keras.layers.Embedding(input_dim=vocab_size, output_dim=embed_dim)
        self.pos_emb = keras.layers.Embedding(input_dim=maxlen, output_dim=embed_dim)

    def call(self, x):
        positions = ops.arange(start=0, stop=ops.shape(x)[-1], step=1)
        return self.token_emb(x) + self.pos_emb(positions)


@_seeded
def transformer_keras_io():
    inputs = keras.layers.Input(shape=(4,))
    x = TokenAndPositionEmbedding(4, 20, 8)(inputs)
    x = TransformerBlock(8, 2, 8)(x)
    x = keras.layers.GlobalAveragePooling1D()(x)
    x = keras.layers.Dropout(0.1)(x)
    x = keras.layers.Dense(8, activation="relu")(x)
    x = keras.layers.Dropout(0.1)(x)
    outputs = keras.layers.Dense(3, activation="softmax")(x)
    model = keras.Model(inputs=inputs, outputs=outputs)
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    return model


EXAMPLES = [
    Example("custom_layer_add_loss", custom_layer_add_loss, _xy()),
    Example("activity_regularizer", activity_regularizer, _xy()),
    Example("endpoint_layer", endpoint_layer, _endpoint_data),
    Example("vae_train_step", vae_train_step, _x_only),
    Example("gan_two_optimizers", gan_two_optimizers, _x_only, ps_key="d_loss"),
    Example("gan_keras_io", gan_keras_io, _x_only, ps_key="d_loss",
            keras_by_hand=_build_gan_by_hand),
    Example("compute_loss_override", compute_loss_override, _xy()),
    Example("multi_io_dict", multi_io_dict, _multi_io_data),
    Example("x_only_add_loss", x_only_add_loss, _x_only),
    Example("class_weight", class_weight, _xy(y=LABELS, class_weight={0: 1.0, 1: 3.0})),
    Example("string_lookup", string_lookup, _words, keras_mirrored=False),
    Example("batchnorm_convnet", batchnorm_convnet, _xy(x=IMAGES, y=CLASSES)),
    Example("gru_lstm", gru_lstm, _xy(x=SEQUENCES)),
    Example("mixed_bfloat16", mixed_bfloat16, _xy(),
            trainer_kwargs={"mixed_precision": "mixed_bfloat16"}),
    Example("callbacks", callbacks, _callbacks_data, epochs=6),
    Example("backup_and_restore", callbacks, _backup_data, epochs=3),
    Example("sample_weight_metrics", sample_weight_metrics,
            _xy(y=LABELS, sample_weight=np.linspace(0.1, 2.0, N).astype("float32"))),
    Example("dropout_subclassed", dropout_subclassed, _xy()),
    Example("embedding_classifier", embedding_classifier, _xy(x=TOKENS, y=CLASSES)),
    Example("transformer_keras_io", transformer_keras_io, _xy(x=TOKENS, y=CLASSES), epochs=3),
]
BY_NAME = {example.name: example for example in EXAMPLES}


def build_reference(example):
    """The example's model for `model.fit`, under the Keras setting its Trainer options mean."""
    policy = example.trainer_kwargs.get("mixed_precision")
    if policy is None:
        return example.build()
    previous = keras.mixed_precision.dtype_policy()
    keras.mixed_precision.set_dtype_policy(policy)
    try:
        return example.build()
    finally:
        keras.mixed_precision.set_dtype_policy(previous)

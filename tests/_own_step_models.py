"""Models with their own `train_step` (a VAE with `add_loss`, a GAN with two optimizers),
shared by `test_own_step_ps.py` and its worker processes."""

import numpy as np

import keras
import tensorflow as tf
from keras import ops

LATENT = 2


def data(n=64):
    rng = np.random.RandomState(0)
    x = rng.rand(n, 8).astype("float32")
    return x, x.copy()


def dataset():
    return tf.data.Dataset.from_tensor_slices(data()).batch(16)


class Sampling(keras.layers.Layer):
    """Draws z from (mean, log variance); adds the KL divergence as a loss (`add_loss`)."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.seed_generator = keras.random.SeedGenerator(7)

    def call(self, inputs):
        mean, log_var = inputs
        kl = -0.5 * ops.mean(ops.sum(1 + log_var - ops.square(mean) - ops.exp(log_var), axis=1))
        self.add_loss(kl)
        noise = keras.random.normal(ops.shape(mean), seed=self.seed_generator)
        return mean + ops.exp(0.5 * log_var) * noise


class VAE(keras.Model):
    """keras.io's VAE, small: its own trackers, the KL term from `model.losses` (with a
    weight regularizer's term: it failed to trace under ps, reading its weight in a
    stateless scope)."""

    def __init__(self, **kwargs):
        inputs = keras.Input((8,))
        hidden = keras.layers.Dense(8, activation="relu",
                                    kernel_regularizer=keras.regularizers.L2(1e-3))(inputs)
        z = Sampling()([keras.layers.Dense(LATENT)(hidden), keras.layers.Dense(LATENT)(hidden)])
        outputs = keras.layers.Dense(8, activation="sigmoid")(
            keras.layers.Dense(8, activation="relu")(z))
        super().__init__(inputs, outputs, **kwargs)
        self.total_tracker = keras.metrics.Mean(name="loss")
        self.reconstruction_tracker = keras.metrics.Mean(name="reconstruction_loss")
        self.kl_tracker = keras.metrics.Mean(name="kl_loss")

    @property
    def metrics(self):
        return [self.total_tracker, self.reconstruction_tracker, self.kl_tracker]

    def train_step(self, data):
        x, y = data
        with tf.GradientTape() as tape:
            reconstruction = self(x, training=True)
            reconstruction_loss = ops.mean(ops.sum(ops.square(y - reconstruction), axis=1))
            kl = ops.sum(self.losses)
            total = reconstruction_loss + kl
        grads = tape.gradient(total, self.trainable_weights)
        self.optimizer.apply_gradients(zip(grads, self.trainable_weights))
        self.total_tracker.update_state(total)
        self.reconstruction_tracker.update_state(reconstruction_loss)
        self.kl_tracker.update_state(kl)
        return {m.name: m.result() for m in self.metrics}


def build_vae():
    keras.utils.set_random_seed(3)
    model = VAE()
    model.compile(optimizer=keras.optimizers.Adam(0.01))
    return model


class GAN(keras.Model):
    """keras.io's GAN, small: two networks, two optimizers, noise from a seed generator."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.discriminator = keras.Sequential([keras.Input((8,)), keras.layers.Dense(8, "relu"),
                                               keras.layers.Dense(1)])
        self.generator = keras.Sequential([keras.Input((LATENT,)), keras.layers.Dense(8, "relu"),
                                           keras.layers.Dense(8, "sigmoid")])
        self.seed_generator = keras.random.SeedGenerator(11)
        self.d_tracker = keras.metrics.Mean(name="d_loss")
        self.g_tracker = keras.metrics.Mean(name="g_loss")

    def call(self, x):
        return self.discriminator(x)

    def compile(self, d_optimizer, g_optimizer):
        super().compile()
        self.d_optimizer, self.g_optimizer = d_optimizer, g_optimizer
        # Built here, in the strategy's scope: under parameter servers a worker's step
        # cannot create the optimizers' variables.
        d_optimizer.build(self.discriminator.trainable_variables)
        g_optimizer.build(self.generator.trainable_variables)
        self.loss_fn = keras.losses.BinaryCrossentropy(from_logits=True)

    @property
    def metrics(self):
        return [self.d_tracker, self.g_tracker]

    def train_step(self, data):
        real, _ = data
        batch = ops.shape(real)[0]
        noise = keras.random.normal((batch, LATENT), seed=self.seed_generator)
        images = ops.concatenate([self.generator(noise), real], axis=0)
        labels = ops.concatenate([ops.ones((batch, 1)), ops.zeros((batch, 1))], axis=0)
        with tf.GradientTape() as tape:
            d_loss = self.loss_fn(labels, self.discriminator(images))
        weights = self.discriminator.trainable_weights
        self.d_optimizer.apply_gradients(zip(tape.gradient(d_loss, weights), weights))
        noise = keras.random.normal((batch, LATENT), seed=self.seed_generator)
        with tf.GradientTape() as tape:
            g_loss = self.loss_fn(ops.zeros((batch, 1)),
                                  self.discriminator(self.generator(noise)))
        weights = self.generator.trainable_weights
        self.g_optimizer.apply_gradients(zip(tape.gradient(g_loss, weights), weights))
        self.d_tracker.update_state(d_loss)
        self.g_tracker.update_state(g_loss)
        return {"d_loss": self.d_tracker.result(), "g_loss": self.g_tracker.result()}


def build_gan():
    keras.utils.set_random_seed(5)
    model = GAN()
    model.compile(keras.optimizers.Adam(0.01), keras.optimizers.Adam(0.02))
    return model


class Counting(keras.Model):
    """A `Sum` of the examples each step sees: exact only if no update is lost."""

    def __init__(self, **kwargs):
        inputs = keras.Input((8,))
        super().__init__(inputs, keras.layers.Dense(8)(inputs), **kwargs)
        self.loss_tracker = keras.metrics.Mean(name="loss")
        self.count = keras.metrics.Sum(name="count")

    @property
    def metrics(self):
        return [self.loss_tracker, self.count]

    def train_step(self, data):
        x, _ = data
        loss = RawLoss.train_step(self, data)["loss"]
        self.loss_tracker.update_state(loss)
        self.count.update_state(ops.cast(ops.shape(x)[0], "float32"))
        return {"loss": self.loss_tracker.result(), "count": self.count.result()}


def build_counting():
    keras.utils.set_random_seed(1)
    model = Counting()
    model.compile(optimizer=keras.optimizers.SGD(0.01))
    return model


class RawLoss(keras.Model):
    """A step returning its own loss tensor, the keras.io way, while `model.metrics` holds
    Keras's loss tracker (from `compile(loss=...)`) that the step never updates: `fit`
    logs the returned value, not the untouched tracker's 0."""

    def train_step(self, data):
        x, y = data
        with tf.GradientTape() as tape:
            loss = ops.mean(ops.square(y - self(x, training=True)))
        grads = tape.gradient(loss, self.trainable_variables)
        self.optimizer.apply_gradients(zip(grads, self.trainable_variables))
        return {"loss": loss}


def build_raw_loss():
    keras.utils.set_random_seed(2)
    inputs = keras.Input((8,))
    model = RawLoss(inputs, keras.layers.Dense(8)(inputs))
    model.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse")
    return model


BUILDERS = {"vae": build_vae, "gan": build_gan, "counting": build_counting,
            "raw_loss": build_raw_loss}

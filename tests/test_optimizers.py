"""Lazy optimizers (issue 17): touched rows only, against NumPy, Keras, mirrored and checkpoints."""

import numpy as np
import pytest

import helpers
import kerastrain as kt

ROWS, DIM, TOUCHED, IDS, STEPS = 20, 4, 14, 8, 50   # rows TOUCHED.. are never looked up
LR, WD, CLIP = 0.01, 0.1, 0.5


def sparse_steps(seed=0):
    """50 steps of (ids, values): duplicate ids, rows >= TOUCHED never touched."""
    rng = np.random.default_rng(seed)
    return [(rng.integers(0, TOUCHED, IDS).astype("int32"),
             rng.normal(size=(IDS, DIM)).astype("float32")) for _ in range(STEPS)]


def reference(kind, table, steps, amsgrad=False, weight_decay=None, clip=None):
    """Lazy updates in NumPy, in float32 with Keras's constants (as the variables are):
    the variable and its slots after `steps`."""
    f = np.float32
    w = table.copy()
    m, v, v_hat = np.zeros_like(w), np.zeros_like(w), np.zeros_like(w)
    acc = np.full_like(w, 0.1)   # Adagrad's initial_accumulator_value
    b1, b2, eps = (f(0.9), f(0.99), f(1e-7)) if kind == "lion" else (f(0.9), f(0.999), f(1e-7))
    # Keras's Adam takes 1 - beta in float64, then float32 (Lion subtracts in float32).
    c1, c2 = (1 - b1, 1 - b2) if kind == "lion" else (f(1 - 0.9), f(1 - 0.999))
    lr = f(LR)
    for t, (ids, values) in enumerate(steps, 1):
        g = np.zeros_like(w)
        np.add.at(g, ids, values)
        if clip is not None:
            g *= min(f(1.0), f(clip) / np.sqrt((g ** 2).sum()))
        r = np.unique(ids)
        if weight_decay is not None:
            w[r] -= w[r] * f(weight_decay) * lr
        if kind == "adam":
            m[r] += (g[r] - m[r]) * c1
            v[r] += (g[r] ** 2 - v[r]) * c2
            v_hat[r] = np.maximum(v_hat[r], v[r])
            alpha = lr * np.sqrt(1 - b2 ** f(t)) / (1 - b1 ** f(t))
            w[r] -= m[r] * alpha / (np.sqrt(v_hat[r] if amsgrad else v[r]) + eps)
        elif kind == "adagrad":
            acc[r] += g[r] ** 2
            w[r] -= lr * g[r] / np.sqrt(acc[r] + eps)
        else:  # lion
            w[r] -= lr * np.sign(m[r] * b1 + g[r] * c1)
            m[r] = m[r] * b2 + g[r] * c2
    slots = {"adam": [m, v] + ([v_hat] if amsgrad else []), "adagrad": [acc], "lion": [m]}
    return [w] + slots[kind]


def apply_all(optimizer, variables, gradients):
    """Apply each step's gradients (a list per step) in one compiled function."""
    import tensorflow as tf

    @tf.function
    def step(grads):
        optimizer.apply(grads, variables)

    for grads in gradients:
        step(grads)
    return [np.array(v.numpy()) for v in variables]


def slices(ids, values, rows=ROWS):
    import tensorflow as tf
    return tf.IndexedSlices(tf.constant(values), tf.constant(ids), tf.constant([rows, DIM]))


CASES = {
    "LazyAdam": ("adam", {}),
    "LazyAdam amsgrad": ("adam", {"amsgrad": True}),
    "LazyAdam global_clipnorm": ("adam", {"clip": CLIP}),
    "LazyAdamW": ("adam", {"weight_decay": WD}),
    "LazyAdagrad": ("adagrad", {}),
    "LazyLion": ("lion", {}),
}


def make(name):
    from kerastrain import optimizers as o
    return {"LazyAdam": lambda: o.LazyAdam(LR),
            "LazyAdam amsgrad": lambda: o.LazyAdam(LR, amsgrad=True),
            "LazyAdam global_clipnorm": lambda: o.LazyAdam(LR, global_clipnorm=CLIP),
            "LazyAdamW": lambda: o.LazyAdamW(LR, weight_decay=WD),
            "LazyAdagrad": lambda: o.LazyAdagrad(LR),
            "LazyLion": lambda: o.LazyLion(LR)}[name]()


def test_lazy_optimizers_equal_a_numpy_reference_over_50_steps_with_repeated_and_missing_rows():
    import keras
    table = np.random.default_rng(1).normal(size=(ROWS, DIM)).astype("float32")
    steps = sparse_steps()
    assert any(len(set(ids)) < len(ids) for ids, _ in steps)   # duplicate ids occur
    for name, (kind, options) in CASES.items():
        variable = keras.Variable(table)
        optimizer = make(name)
        apply_all(optimizer, [variable], [[slices(ids, values)] for ids, values in steps])
        expected = reference(kind, table, steps, **options)
        got = [variable.numpy()] + [s.numpy() for s in optimizer.variables[2:]]
        assert len(got) == len(expected), name
        for g, e in zip(got, expected):
            np.testing.assert_allclose(g, e, rtol=0, atol=1e-6, err_msg=name)
        # Untouched rows and their slots were never written, not even decayed.
        np.testing.assert_array_equal(got[0][TOUCHED:], table[TOUCHED:], err_msg=name)
        assert int(optimizer.iterations.numpy()) == STEPS


def test_dense_variables_update_bit_for_bit_as_the_keras_optimizer():
    import keras
    import tensorflow as tf

    from kerastrain import optimizers
    rng = np.random.default_rng(2)
    kernel, bias = rng.normal(size=(6, DIM)).astype("float32"), np.zeros(DIM, "float32")
    table = rng.normal(size=(ROWS, DIM)).astype("float32")
    steps = [[rng.normal(size=(6, DIM)).astype("float32"), rng.normal(size=DIM).astype("float32"),
              slices(ids, values)] for ids, values in sparse_steps(seed=3)[:20]]
    pairs = [(optimizers.LazyAdam(LR), keras.optimizers.Adam(LR)),
             (optimizers.LazyAdam(LR, amsgrad=True), keras.optimizers.Adam(LR, amsgrad=True)),
             (optimizers.LazyAdamW(LR, weight_decay=WD),
              keras.optimizers.AdamW(LR, weight_decay=WD)),
             (optimizers.LazyAdagrad(LR), keras.optimizers.Adagrad(LR)),
             (optimizers.LazyLion(LR), keras.optimizers.Lion(LR))]
    # Keras gets the table's gradient dense: its Adagrad given rows with repeated ids
    # accumulates the sum of their squares, not the square of their sum (Keras 3.15).
    dense_steps = [[k, b, tf.convert_to_tensor(t)] for k, b, t in steps]
    for lazy, plain in pairs:
        runs = []
        for optimizer, gradients in ((lazy, steps), (plain, dense_steps)):
            variables = [keras.Variable(kernel), keras.Variable(bias), keras.Variable(table)]
            values = apply_all(optimizer, variables, gradients)
            runs.append((values, [s.numpy() for s in optimizer.variables[2:]]))
        (lazy_vars, lazy_slots), (plain_vars, plain_slots) = runs
        name = type(plain).__name__
        assert [s.shape for s in lazy_slots] == [s.shape for s in plain_slots]
        for a, b in zip(lazy_vars[:2], plain_vars[:2]):
            np.testing.assert_array_equal(a, b, err_msg=name)   # dense: bit for bit
        for a, b in zip(lazy_slots, plain_slots):
            if a.shape != table.shape:
                np.testing.assert_array_equal(a, b, err_msg=name)
        table_diff = np.abs(lazy_vars[2] - plain_vars[2]).max()
        if name == "Adagrad":
            assert table_diff <= 1e-6   # a zero gradient leaves an Adagrad row alone anyway
        else:
            assert table_diff > 1e-4, name   # Keras decays untouched rows: lazy differs


def embedding_model(optimizer):
    import keras
    model = keras.Sequential([keras.Input((4,), dtype="int32"),
                              keras.layers.Embedding(1000, 8, name="table"),
                              keras.layers.Flatten(), keras.layers.Dense(1)])
    model.compile(optimizer=optimizer(), loss="mse")
    return model


def ids_dataset_fn(ctx=None):
    """6 global batches of 16 examples, 4 ids each among the first 500 rows of 1000."""
    import tensorflow as tf
    rng = np.random.default_rng(4)
    x = rng.integers(0, 500, (96, 4)).astype("int32")
    y = ((x[:, :1] % 7) / 7.0).astype("float32")
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(16)


def state(trainer):
    import tensorflow as tf
    model = trainer.model
    return [np.asarray(tf.convert_to_tensor(v.value))
            for v in list(model.weights) + list(model.optimizer.variables)]


def max_diff(a, b):
    assert len(a) == len(b)
    return max(float(np.abs(x.astype("float64") - y.astype("float64")).max()) for x, y in zip(a, b))


def train(optimizer, strategy="one_device", steps=6, **kwargs):
    trainer = kt.Trainer(lambda: embedding_model(optimizer), ids_dataset_fn, strategy=strategy,
                         seed=1, verbose=0, **kwargs)
    trainer.fit(epochs=1, steps_per_epoch=steps)
    return trainer


def test_mirrored_lazy_adam_equals_one_device(two_cpus):
    import keras

    from kerastrain import optimizers
    lazy = lambda: optimizers.LazyAdamW(LR, weight_decay=WD)   # noqa: E731
    one_trainer = train(lazy)
    one = state(one_trainer)
    mirrored_trainer = train(lazy, {"name": "mirrored", **two_cpus})
    mirrored = state(mirrored_trainer)
    assert max_diff(one, mirrored) <= 1e-6
    for trainer in (one_trainer, mirrored_trainer):   # the table is read row by row
        assert "_kerastrain_call" in trainer.model.get_layer("table").__dict__
    # Gradients reached the optimizer as rows under mirrored too: dense AdamW differs.
    dense = state(train(lambda: keras.optimizers.AdamW(LR, weight_decay=WD)))
    assert max_diff(one, dense) > 1e-4


def test_checkpoints_of_adam_and_lazy_adam_restore_into_each_other(tmp_path):
    import keras

    from kerastrain import optimizers
    adam = lambda: keras.optimizers.Adam(LR)   # noqa: E731
    lazy = lambda: optimizers.LazyAdam(LR)     # noqa: E731
    first = train(adam, model_dir=str(tmp_path / "adam"))
    adam_checkpoint = str(tmp_path / "adam" / "checkpoints" / "ckpt-6")
    restored = train(lazy, checkpoint={"restore": adam_checkpoint},
                     model_dir=str(tmp_path / "lazy"))   # resumes at step 6: nothing to train
    assert restored.global_step == 6
    assert isinstance(restored.model.optimizer, optimizers.LazyAdam)
    assert max_diff(state(first), state(restored)) == 0.0
    restored.fit(epochs=1, steps_per_epoch=6)           # six lazy steps, then back into Adam
    back = train(adam, checkpoint={"restore": str(tmp_path / "lazy" / "checkpoints" / "ckpt-12")})
    assert back.global_step == 12 and type(back.model.optimizer) is keras.optimizers.Adam
    assert max_diff(state(restored), state(back)) == 0.0
    # A .keras file keeps the class, its options and its slots.
    path = str(tmp_path / "lazy.keras")
    restored.model.save(path)
    loaded = keras.models.load_model(path)
    assert type(loaded.optimizer) is optimizers.LazyAdam
    assert loaded.optimizer.get_config() == restored.model.optimizer.get_config()
    for a, b in zip(loaded.optimizer.variables, restored.model.optimizer.variables):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b.value))


def test_recipes_and_compile_name_lazy_optimizers(tmp_path):
    import keras

    from kerastrain import optimizers
    from kerastrain.cli import config
    from kerastrain.cli import recipes
    from kerastrain.cli import training
    text = (f"include: {helpers.REPO}/recipes/quickstart.yaml\n"
            "model:\n  compile:\n    optimizer: {name: lazy_adam, learning_rate: 0.002}\n")
    (tmp_path / "r.yaml").write_text(text)
    recipe, _ = recipes.load(str(tmp_path / "r.yaml"))
    built = training._optimizer(recipe.model.compile.optimizer)
    assert type(built) is optimizers.LazyAdam and built.learning_rate.numpy() == np.float32(0.002)
    assert type(keras.optimizers.get("lazy_adagrad")) is optimizers.LazyAdagrad
    (tmp_path / "bad.yaml").write_text(text.replace("lazy_adam,", "lazy_adan,"))
    with pytest.raises(config.RecipeError, match="did you mean 'lazy_adam'"):
        recipes.load(str(tmp_path / "bad.yaml"))


def test_read_rows_keeps_outputs_and_row_gradients():
    import tensorflow as tf

    from kerastrain import optimizers
    model = embedding_model(lambda: optimizers.LazyAdam(LR))
    x = np.random.default_rng(5).integers(0, 1000, (16, 4)).astype("int32")

    def forward():
        with tf.GradientTape() as tape:
            y = model(x)
        return y.numpy(), tape.gradient(y, model.get_layer("table").embeddings)

    y0, g0 = forward()
    assert optimizers.read_rows(model) == ["table"]
    assert optimizers.read_rows(model) == []   # once only
    y1, g1 = forward()
    np.testing.assert_array_equal(y0, y1)
    assert isinstance(g1, tf.IndexedSlices)
    np.testing.assert_array_equal(tf.convert_to_tensor(g0), tf.convert_to_tensor(g1))

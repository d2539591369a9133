"""A model that preprocesses its own data: keras-hub's tasks, whose `fit`, `evaluate` and
`predict` run `model.preprocessor` over every batch before the model sees it.

A keras-hub task (`BertTextClassifier(backbone=..., preprocessor=...)`, fed raw strings)
overrides those three methods to turn the data into a batched dataset and map its
`preprocess_samples` over it; kerastrain, which runs its own loops, does the same here, in
the data's pipeline, so the model sees what its own `fit` would give it. As keras-hub's
`fit`, arrays are batched in order (32 by default; its `fit` does not shuffle them).
"""

from __future__ import annotations

import keras
import tensorflow as tf

from kerastrain.data import inputs as data_lib


def of_model(model):
    """The model's `preprocess_samples` where it has a preprocessor that its own `fit`
    applies (keras-hub's `Task` API), else None."""
    preprocess = getattr(model, "preprocess_samples", None)
    if callable(preprocess) and getattr(model, "preprocessor", None) is not None:
        return preprocess
    return None


def mapped(data, preprocess, *, argument, batch_size=None):
    """`data` (any input form) as the same form, or a function returning a dataset of
    global batches, with `preprocess` mapped over each batch; None stays None.

    Raises:
        ValueError: `batch_size` beside a dataset, which batches itself (as keras-hub says).
    """
    if data is None:
        return None
    # Arrays alone are `x` (predict's, or inputs without targets).
    form = "numpy" if not callable(data) and data_lib.array_leaves(data) is not None \
        else data_lib.input_form(data, argument)

    def over(dataset):
        return dataset.map(lambda *batch: preprocess(*batch),
                           num_parallel_calls=tf.data.AUTOTUNE).prefetch(tf.data.AUTOTUNE)

    if form == "numpy":
        arrays = data if isinstance(data, tuple) else (data,)

        def batches():
            packed = keras.utils.pack_x_y_sample_weight(*arrays)
            return over(tf.data.Dataset.from_tensor_slices(packed).batch(
                batch_size or data_lib.DEFAULT_BATCH_SIZE))
        return batches
    if batch_size is not None:
        raise ValueError(
            f"`batch_size` applies to arrays; `{argument}` is a dataset, which batches itself "
            f"(the model's preprocessor runs over its batches). Received: batch_size="
            f"{batch_size!r} with {argument} of form {form!r}")
    if form == "dataset":
        return lambda: over(data)
    if form == "global_fn":
        return lambda: over(data())
    if form == "context_fn":
        return lambda ctx: over(data(ctx))
    return data  # Python batches: read as they are

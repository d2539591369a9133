"""`model.fit`'s data arguments (`y`, `sample_weight`, `class_weight`, `validation_*`, `shuffle`).

They are turned into the input forms kerastrain takes (see `kerastrain.data.inputs`), with
Keras's meaning: `validation_split` takes the *last* fraction of the arrays before
any shuffling, `validation_data` wins over `validation_split`, `class_weight` turns
each example's class into its weight, and `shuffle` applies to NumPy arrays (a
dataset is shuffled by its own pipeline). What cannot mean the same for a form of
input is an error that says why.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import warnings

import numpy as np

from kerastrain import _compat
from kerastrain.data import inputs as data_lib
from kerastrain._options import is_int, is_number

logger = logging.getLogger("kerastrain")


# model.fit's data arguments that `Trainer.fit` takes by keyword.
KERAS_FIT_DATA_ARGS = frozenset({"x", "sample_weight", "class_weight", "validation_data",
                                 "validation_split", "shuffle", "validation_batch_size"})


@dataclasses.dataclass(frozen=True)
class FitData:
    """What `fit` trains and validates on, in kerastrain's input forms."""
    train: object
    validation: object = None
    shuffle: bool = True  # NumPy training arrays are reshuffled every epoch
    validation_batch_size: int | None = None  # NumPy validation data; None: batch_size

    def validation_batch(self, batch_size):
        """The global batch of NumPy validation data (`validation_batch_size`, else
        `batch_size`); None for a validation dataset, which batches itself.

        Raises:
            ValueError: a `validation_batch_size` beside a validation dataset.
        """
        form = data_lib.input_form(self.validation, "validation_dataset_fn")
        if form == "numpy":
            return self.validation_batch_size or batch_size
        if self.validation_batch_size is not None:
            raise ValueError(
                "`validation_batch_size` applies to NumPy validation data (as in `model.fit`); a "
                "validation dataset batches itself. Remove it or batch the dataset. Received: "
                f"validation_batch_size={self.validation_batch_size!r} with validation data of "
                f"form {form!r}")
        return None


def of_fit_call(dataset_fn, y, validation_dataset_fn, keras_args, *, default) -> FitData:
    """`Trainer.fit`'s data arguments, Keras's names included (`default`: the Trainer's
    `dataset_fn`).

    Raises:
        TypeError: an argument `fit` does not take.
        ValueError: no training data, or one thing given under two names.
    """
    unknown = sorted(set(keras_args) - KERAS_FIT_DATA_ARGS)
    if unknown:
        raise TypeError(f"`fit` got unexpected argument(s) {unknown}. It takes model.fit's "
                        f"{sorted(KERAS_FIT_DATA_ARGS)} and its own arguments; see "
                        "`help(Trainer.fit)`.")
    keras_args = dict(keras_args)
    for keras_name, ours, value in (("x", "dataset_fn", dataset_fn), (
            "validation_data", "validation_dataset_fn", validation_dataset_fn)):
        if keras_args.get(keras_name) is not None and value is not None:
            raise ValueError(f"`{keras_name}` and `{ours}` name the same thing: pass one. "
                             f"Received: both")
    argument = "x" if keras_args.get("x") is not None else "dataset_fn"
    data = next((d for d in (dataset_fn, keras_args.pop("x", None), default) if d is not None),
                None)
    if data is None:
        raise ValueError("No training data: pass `dataset_fn` to `Trainer(...)` or to "
                         "`fit(...)`. Received: dataset_fn=None")
    validation = validation_dataset_fn if validation_dataset_fn is not None else \
        keras_args.pop("validation_data", None)
    return resolve(data, y, validation_data=validation, argument=argument, **keras_args)


def of_evaluate_call(dataset_fn, x, y, sample_weight, *, defaults):
    """`Trainer.evaluate`'s data: `dataset_fn` or Keras's `x` (NumPy `x` with `y` and
    `sample_weight`), else the first of `defaults` given.

    Raises:
        ValueError: both `x` and `dataset_fn`, or no data at all.
    """
    if x is not None and dataset_fn is not None:
        raise ValueError("`x` and `dataset_fn` name the same thing: pass one. Received: both")
    data = next((d for d in (dataset_fn, x, *defaults) if d is not None), None)
    if data is None:
        raise ValueError("No evaluation data: pass `dataset_fn`. Received: dataset_fn=None")
    if y is not None or sample_weight is not None or data_lib.array_leaves(data) is not None:
        data = resolve(data, y, sample_weight=sample_weight).train
    return data


def resolve(data, y=None, *, sample_weight=None, class_weight=None, validation_data=None,
            validation_split=None, shuffle=None, validation_batch_size=None,
            argument="dataset_fn") -> FitData:
    """`fit(x, y, ...)`'s data arguments as kerastrain input forms.

    `argument` is the name the user gave the data by (`dataset_fn` or `x`), for errors.

    Raises:
        ValueError: an argument that does not apply to this form of input, or a bad value.
    """
    if y is None and sample_weight is None and not isinstance(data, (tuple, list)) and \
            data_lib.array_leaves(data) is not None:
        data = (data,)  # fit(x): the inputs alone, for a model whose loss needs no targets
    if y is not None and data_lib.array_leaves(data) is not None:
        # fit(x, y): x is the model's inputs (an array, or a list/dict/tuple of them).
        data = (data, y) if sample_weight is None else (data, y, sample_weight)
        y = sample_weight = None
    form = data_lib.input_form(data, argument)
    _check_scalars(shuffle=shuffle, validation_batch_size=validation_batch_size)
    if form == "python" and class_weight is not None:
        # Weighed as a dataset; a PyDataset's batches are shuffled as `fit` shuffles them.
        data = data_lib.python_dataset(data, shuffle=shuffle is None or bool(shuffle),
                                       argument=argument)
        form, shuffle = "dataset", None
    if form != "numpy":
        for name, value in (("y", y), ("sample_weight", sample_weight),
                            ("validation_split", validation_split)):
            if value is not None:
                raise ValueError(
                    f"`{name}` applies to NumPy arrays `x`, as in `model.fit`: a dataset or a "
                    f"dataset_fn yields its own (x, y[, sample_weight]) batches. Put it in the "
                    f"dataset, or pass arrays. Received: {name} with {argument} of form {form!r}")
        if shuffle and not (form == "python" and _compat.is_py_dataset(data)):
            warnings.warn("`shuffle=True` is ignored for a dataset, a dataset_fn or a generator: "
                          "shuffle it in its own pipeline (`.shuffle(buffer_size)`), as with "
                          "`model.fit`.", stacklevel=3)
    else:
        data = _arrays(data, y, sample_weight)
    validation = validation_data
    if validation_split == 0.0 and not isinstance(validation_split, bool):
        validation_split = None  # model.fit's default: nothing held out
    if validation_split is not None:
        _check_split(validation_split)
        if validation is None:
            data, validation = _split(data, validation_split)
        else:  # as in Keras, validation_data wins: nothing is held out
            logger.info("validation_split=%s is not used: validation_data is given, and every "
                        "example trains (as in model.fit)", validation_split)
    if class_weight is not None:  # the training data only, as in model.fit
        data = _with_class_weight(data, form, class_weight)
    return FitData(data, validation, shuffle=True if shuffle is None else bool(shuffle),
                   validation_batch_size=validation_batch_size)


def _check_scalars(*, shuffle, validation_batch_size):
    from kerastrain._options import check_int
    if shuffle is not None and not isinstance(shuffle, (bool, int)):
        raise ValueError(
            "`shuffle` must be True or False: kerastrain reshuffles NumPy arrays example by "
            "example each epoch; Keras's shuffle='batch' (for HDF5 arrays) has no meaning here. "
            f"Pass True, or shuffle a dataset in its pipeline. Received: shuffle={shuffle!r}")
    check_int("validation_batch_size", validation_batch_size, minimum=1, optional=True)


def _arrays(data, y, sample_weight):
    """NumPy `(x, y[, sample_weight])` with a `sample_weight` given beside `(x, y)`."""
    if sample_weight is None:
        return data
    if len(data) != 2:
        raise ValueError("`sample_weight` was given twice: the data already holds "
                         "(x, y, sample_weight). Pass one. Received: both")
    return (*data, sample_weight)


def _with_class_weight(data, form, class_weight):
    if not isinstance(class_weight, dict) or not class_weight or not all(
            is_int(k) for k in class_weight) or not all(
            is_number(w) for w in class_weight.values()):
        raise ValueError("`class_weight` must be a non-empty dict {class index: weight (a "
                         "number)}, as in `model.fit`. Received: "
                         f"class_weight={class_weight!r}")
    if form == "numpy":
        if len(data) == 3:
            raise ValueError("You cannot give `class_weight` and `sample_weight` at the same "
                             "time (as in `model.fit`): fold the class weights into the sample "
                             "weights. Received: both")
        if len(data) == 1:
            raise ValueError("`class_weight` weighs examples by their class, read from the "
                             "targets: pass `y`. Received: class_weight with x alone")
        x, y = data
        if isinstance(y, (dict, list, tuple)):
            raise ValueError("`class_weight` is only supported for models with a single output "
                             f"(as in `model.fit`). Received: y of type {type(y).__name__}")
        return x, y, _compat.class_weight_to_sample_weights(y, class_weight)
    weigh = _compat.class_weight_map_fn(class_weight)
    if form == "dataset":
        return data_lib.keep_origin(data.map(weigh), data_lib.python_origin(data))
    if form == "global_fn":
        return lambda: data().map(weigh)
    return lambda ctx: data(ctx).map(weigh)  # a dataset_fn(ctx)


def _check_split(value):
    if not is_number(value, above=0) or not value < 1:
        raise ValueError("`validation_split` must be a float between 0 and 1 (exclusive), the "
                         f"fraction of the arrays held out. Received: validation_split={value!r}")


def _split(arrays, fraction):
    """Keras's split: the last `fraction` of the examples, before any shuffling."""
    leaves = data_lib.array_leaves(arrays)
    n = int(np.shape(leaves[0])[0])
    at = int(math.floor(n * (1.0 - fraction)))
    if at in (0, n):
        raise ValueError(f"The training data has {n} examples, too few to hold out "
                         f"validation_split={fraction}. Give more data or another fraction.")
    head = _map_arrays(arrays, lambda a: a[:at])
    tail = _map_arrays(arrays, lambda a: a[at:])
    logger.info("validation_split=%s: the last %d of %d examples are held out for validation",
                fraction, n - at, n)
    return head, tail


def _map_arrays(structure, fn):
    if isinstance(structure, dict):
        return {k: _map_arrays(v, fn) for k, v in structure.items()}
    if isinstance(structure, (list, tuple)):
        return type(structure)(_map_arrays(v, fn) for v in structure)
    return None if structure is None else fn(structure)

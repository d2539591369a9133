"""The Trainer's inputs: one `DistributedInput` kept per use, and the orders of NumPy data.

A later `fit` on the same data continues its passes; other data replaces it (a loop of
`fit((x, y))` calls holds one copy, not one per call), and evaluation never moves the
training data's position. NumPy training arrays given anew (each `fit(x, y)` call) draw
new example orders, as every `model.fit` call reshuffles.
"""

from __future__ import annotations

import collections

import numpy as np

from kerastrain.data import distributed
from kerastrain.data import inputs as data_lib
from kerastrain.data import preprocessing


# One fit's inputs: training and validation `DistributedInput`s (validation: None without).
FitInputs = collections.namedtuple("FitInputs", ["train", "validation"])


class TrainerInputs:
    """Every input of one Trainer, by use (argument, role, batch size, shuffle).

    Args:
        built: the `strategies.BuiltStrategy`.
        policy: the `policy.InputPolicy` of its kind (`kerastrain.loop.modes`).
        shard: the sharding policy (`sharding.check_policy`).
        seed: the Trainer's seed (None: orders drawn freshly).
        tuning: the `tuning.TuningOptions` (input options, in-step batches).
        service: the tf.data service (`service.Service`), or None.
        model: the user's model (a keras-hub task's preprocessor is applied to the data).
    """

    def __init__(self, built, *, policy, shard, seed, tuning, service, model=None):
        self.built, self.policy = built, policy
        # A keras-hub task's `preprocess_samples`, mapped over every input (`preprocessing`).
        self.preprocess = preprocessing.of_model(model)
        self._shard = shard
        self._seed = seed
        self._tuning = tuning
        self._service = service
        self._numpy_inputs = 0  # NumPy training inputs given so far (`order_seed`)
        self.inputs = {}       # use -> (data, its DistributedInput)
        self._contents = {}    # use -> `_content(data)` when it was made
        self.last_validation = None  # the validation data last given to `fit`

    def of_fit(self, data, batch_size=None):
        """The `FitInputs` of a fit's data (`fit_args.FitData`; `batch_size`: fit's, for
        NumPy data); the validation data is kept as `last_validation`, which `evaluate` reads
        by default."""
        train = self.get(data.train, "dataset_fn", "training", batch_size, shuffle=data.shuffle)
        validation = None
        if data.validation is not None:
            validation = self.get(data.validation, "validation_dataset_fn", "validation",
                                  data.validation_batch(batch_size))
            self.last_validation = data.validation
        return FitInputs(train, validation)

    def get(self, data, argument, role, batch_size=None, shuffle=True):
        """The `DistributedInput` of `data` for this use: the one kept, or a new one."""
        key, content = (argument, role, batch_size, shuffle), _content(data)
        if key not in self.inputs or self.inputs[key][0] is not data or \
                self._contents.get(key) != content:
            self._contents[key] = content
            source = data
            if self.preprocess is not None:
                source = preprocessing.mapped(data, self.preprocess, argument=argument,
                                              batch_size=batch_size)
                batch_size = None
            kind = self.policy.input_type(role, distributed.DistributedInput)
            self.inputs[key] = (data, kind(
                self.built, source, policy=self.policy, argument=argument, shard=self._shard,
                batch_size=batch_size, seed=self.order_seed(data, argument, role), role=role,
                shuffle=shuffle, input_options=self._tuning.input_options,
                in_step=self._tuning.in_step_batches, service=self._service))
        return self.inputs[key][1]

    def order_seed(self, data, argument, role):
        """The seed of new data's example orders: the k-th NumPy training input of this
        Trainer is shuffled by a seed drawn from (seed, k), so a rerun of the same script
        (resuming) meets the same orders in the same calls."""
        seed = data_lib.shuffle_seed(self._seed, self.policy)
        if seed is None or role != "training" or data_lib.input_form(data, argument) != "numpy":
            return seed
        k, self._numpy_inputs = self._numpy_inputs, self._numpy_inputs + 1
        return seed if k == 0 else int(
            np.random.SeedSequence([seed, k]).generate_state(1)[0] % 2 ** 31)


def _content(data):
    """A checksum of NumPy data's arrays (None for other forms): arrays changed in place
    between two calls are new data, which Keras reads anew at every call (kerastrain kept
    the copy it made of them first: an evaluation scored the old values)."""
    import zlib
    leaves = None if callable(data) else data_lib.array_leaves(data)
    if leaves is None or not data_lib.dense_arrays(data):  # ragged, sparse: kept by identity
        return None
    sums = []
    for leaf in leaves:
        array = np.asarray(leaf)
        raw = "\x00".join(map(str, array.ravel().tolist())).encode() \
            if array.dtype == object else np.ascontiguousarray(array).view(np.uint8).ravel()
        sums.append((array.shape, str(array.dtype), zlib.crc32(raw)))
    return tuple(sums)

"""Input under parameter servers: what holds of the training data, and datasets made too early.

The parameter-server kind of strategy (`kerastrain.loop.modes.ParameterServers`) hands
`check_made_after_connecting` to the data layer in its `data.policy.InputPolicy`; the data
layer words its plan with `account` where loops may train exact visits
(`kerastrain.distribute.ps.visits`).
"""

from __future__ import annotations

import tensorflow as tf


def account(sentence, *, exact, off, form, pipelines, infinite, unknown, empty):
    """What holds under parameter servers: exact visits, or why not (after the plan's
    `sentence`); `off`: shard='off' was asked for; `infinite`, `unknown`, `empty`: a
    pipeline probed is infinite, of unknown size, or empty."""
    if exact:
        if form == "context_fn":
            what = (f"dataset_fn(ctx) is called once per input pipeline ({pipelines} in "
                    "all); every worker reads every pipeline, taking their batches in turn")
        else:
            what = "every worker reads the whole data, in one device's order"
        what += ", and trains the positions the coordinator gives each loop: every batch "
        if infinite:
            return what + ("of the data's (infinite) stream once, in order (a shuffle in the "
                           "pipeline must be seeded)")
        if unknown:
            return what + ("once per pass of the data (its size is unknown: an epoch is "
                           "`steps_per_epoch` batches of the repeated data; a shuffle in the "
                           "pipeline must be seeded)")
        return what + "once per pass of the data (a shuffle in the pipeline must be seeded)"
    why = ("shard='off' asked for it, exact visits off" if off
           else "a pipeline is empty" if empty
           else "each worker splits its batches over several replicas")
    return (f"{sentence}; each worker reads its own shard ({why}): within an epoch "
            "examples may repeat or be skipped")


def check_made_after_connecting(dataset, argument):
    """A dataset made before the PS cluster connected lives on devices that are gone.

    Raises:
        ValueError: such a dataset, saying to pass a function that makes it instead.
    """
    try:
        dataset.with_options(tf.data.Options())
    except tf.errors.InvalidArgumentError as e:
        raise ValueError(
            f"The tf.data.Dataset given as `{argument}` was created before kerastrain connected "
            "to the parameter-server cluster, which replaces TensorFlow's devices, so it cannot "
            "be used any more. Pass a zero-argument function that returns the dataset instead "
            f"(e.g. `lambda: make_dataset()`), or create it after the Trainer. TensorFlow said: "
            f"{e.message.splitlines()[0]}") from None

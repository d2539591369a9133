"""The model's variables on the parameter servers: partitioned, built by kerastrain, reachable."""

from __future__ import annotations

import logging

import tensorflow as tf

from kerastrain import _compat
from kerastrain.step import models

logger = logging.getLogger("kerastrain")


class ServerPlacement(models.Placement):
    """Variables made on the parameter servers, possibly partitioned, and updated by workers
    at once (`models.Placement` says what each method does)."""

    # The optimizer is built by kerastrain (`build_optimizer`) without Keras's gradient
    # accumulators, on a user's object trained in place too.
    keras_accumulators_in_place = False

    def explained(self):
        # A layer failing on a partitioned variable gets advice.
        from kerastrain.distribute.ps import partitioning
        return partitioning.explain_failures()

    def check_placed(self, model):
        check_resources_placed(model)

    def holding_optimizer_build(self, optimizer):
        # Keras builds the optimizer at the end of a symbolic build; under parameter
        # servers kerastrain builds it (partitioned variables need partitioned slots),
        # so Keras's build waits.
        if optimizer is not None and not optimizer.built:
            return _compat.instance_override(optimizer, "build", lambda variables: None)
        return super().holding_optimizer_build(optimizer)

    def build_optimizer(self, model, optimizer):
        from kerastrain.distribute.ps import partitioning
        partitioned = partitioning.Partitioning(model)
        if partitioned:
            partitioned.check()
            partitioned.install()
            logger.info(partitioned.summary())
            partitioned.build_optimizers(optimizer, model.trainable_variables)
        else:
            super().build_optimizer(model, optimizer)
        # Keras's first EMA step copies the weights (momentum 0 at step 0), but workers' first
        # steps run at once: one reading the zero averages can write over another's copy,
        # leaving averages at ~1% of the weights. Starting them at the weights, no read can.
        for variable, average in _compat.moving_averages(optimizer):
            average.assign(variable)
        return partitioned or None


def check_resources_placed(model):
    """Fail fast on a variable or lookup table made before this process joined the cluster.

    It lives on `/job:localhost`, which no worker knows: workers answer "unknown device",
    which TensorFlow's ClusterCoordinator takes for a lost worker, so it would retry the
    step for ever (`cluster_coordinator._is_worker_failure`). A hang is the worst answer.

    Raises:
        ValueError: naming the variable or layer, and how to create it in the model function.
    """
    for v in model.variables:
        for part in getattr(v.value, "variables", [v.value]):
            if tf.DeviceSpec.from_string(part.device or "").job == "localhost":
                raise ValueError(
                    f"Variable {v.path!r} was created before kerastrain connected to the "
                    "parameter-server cluster, so no worker can reach it (a layer built or "
                    "adapted before the Trainer and used by the model function). Create every "
                    "layer inside the model function you pass to the Trainer.")
    for layer in _compat.lookup_layers(model):
        job = _compat.table_job(layer.lookup_table)
        if job == "localhost":
            raise ValueError(
                f"Layer {layer.name!r} ({type(layer).__name__}) holds a lookup table created "
                "before kerastrain connected to the parameter-server cluster, so no worker can "
                "reach it. Create the layer inside the model function, passing the vocabulary "
                "(e.g. `StringLookup(vocabulary=adapted.get_vocabulary("
                "include_special_tokens=False))`), or look tokens up in `dataset_fn`.")
        if job is not None:
            logger.warning("layer %r's lookup table was created outside the strategy's scope: "
                           "it stays on the coordinator and every step on every worker reads "
                           "it remotely. Create the layer inside the model function.", layer.name)

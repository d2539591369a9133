"""A model's own `train_step` run on parameter-server workers, its metrics counted exactly.

Under parameter servers a model's metric variables live on the ps, and workers
update them concurrently: Keras's metric variables (`on_read`) become caching
variables there and lose updates (measured, 2 workers: a `Sum` of the examples
counted 704 and 560 of 768 in two epochs). So kerastrain runs the model's step
in a `keras.StatelessScope` in which the metric variables start at zero: what
the step adds to them comes back as deltas, which the loop sums exactly like
kerastrain's own step (`kerastrain.step.metrics.MetricState`). Every other update the step makes
(weights, optimizer slots, batch statistics, seeds) is applied for real once the
step returns; inside the step, later reads see earlier updates, as they would.
"""

from __future__ import annotations

import keras


class RecordingScope(keras.StatelessScope):
    """A stateless scope that remembers which variables were updated in it.

    A variable it does not map reads its live value, as outside the scope; that includes
    Keras's weight regularizers, which ask the scope itself (a plain `StatelessScope`
    gives them None: "'NoneType' object has no attribute 'dtype'").
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.updated = {}
        self._reading = False

    def get_current_value(self, variable):
        value = super().get_current_value(variable)
        if value is not None or self._reading or \
                getattr(variable, "regularizer", None) is None:
            return value
        self._reading = True  # `.value` asks the scope again: None sends it to the variable
        try:
            return variable.value
        finally:
            self._reading = False

    def add_update(self, update):
        super().add_update(update)
        self.updated[id(update[0])] = update[0]

    def apply_updates_except(self, kept):
        """After the scope: apply for real every update made in it but those to `kept`
        (variables whose scope values the caller reads as deltas)."""
        kept = {id(v) for v in kept}
        for key, variable in self.updated.items():
            if key not in kept:
                variable.assign(self.get_current_value(variable))


def flat_logs(logs):
    """Nested dicts of logs merged into one, as `model.fit` reports them (a compiled
    metrics container's result is a dict of its metrics)."""
    flat = {}
    for key, value in sorted(logs.items()):
        if isinstance(value, dict):
            flat.update(flat_logs(value))
        else:
            flat[key] = value
    return flat


def run_with_metric_deltas(step_fn, data, metric_variables):
    """Run `step_fn(data)`; metric variables start at zero and are left untouched.

    Returns:
        (the step's logs, flat and read inside the scope; the metric variables'
        values after the step, i.e. what the step added).

    Raises:
        TypeError: the step did not return a dict.
    """
    import tensorflow as tf

    zeros = [tf.zeros(v.shape, v.dtype) for v in metric_variables]
    with RecordingScope(list(zip(metric_variables, zeros)), collect_losses=True) as scope:
        logs = step_fn(data)
        if not isinstance(logs, dict):
            raise TypeError("The model's `train_step` must return a dict of scalar logs, as "
                            f"Keras requires. Received: {type(logs).__name__}")
        # Read here: a log that is a metric's result reads the scope's values.
        logs = {k: tf.convert_to_tensor(v) for k, v in flat_logs(logs).items()}
        deltas = [scope.get_current_value(v) for v in metric_variables]
    scope.apply_updates_except(metric_variables)
    return logs, deltas


def check_optimizers_built(model):
    """Under parameter servers a worker's step cannot create variables: an optimizer the
    model keeps besides `model.optimizer` (a GAN's two) must be built in the model function.

    Raises:
        ValueError: naming the attribute and how to build it.
    """
    for name, value in sorted(vars(model).items()):
        if isinstance(value, keras.optimizers.Optimizer) and not value.built \
                and value is not model.optimizer:
            raise ValueError(
                f"The model's optimizer `{name}` ({type(value).__name__}) is not built. Under "
                "parameter servers a model's own `train_step` runs on workers, which cannot "
                "create its variables: build it in the model function (or in `compile`), e.g. "
                f"`self.{name}.build(self.discriminator.trainable_variables)` with the "
                "variables it updates. Received: strategy='ps'")

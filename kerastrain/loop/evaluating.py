"""Exact evaluation of the model a Trainer trains: `Trainer.evaluate` and fit's validation.

Every example counts once under every strategy (`state.TrainingState.evaluate`), and the
callbacks' test hooks run around it as around `model.evaluate` (`callbacks.evaluated`).
What `evaluate` reads by default is the last validation data given to `fit`, then the
training data.
"""

from __future__ import annotations

from kerastrain import _compat
from kerastrain._options import check_int
from kerastrain.data import fit_args
from kerastrain.loop import actions as actions_lib
from kerastrain.loop import callbacks as callbacks_lib
from kerastrain.loop import state as state_lib


class Evaluation:
    """Evaluates a `state.TrainingState`'s model on data the Trainer's `feeds.Feeds` make.

    Args:
        state: the Trainer's `state.TrainingState`.
        feeds: the Trainer's `feeds.Feeds`.
        beats: the Trainer's `stalls.Beats`: each evaluation loop is progress for the
            stall watch of the fit that runs, if any.
    """

    def __init__(self, state, feeds, beats):
        self._state, self._feeds, self._beats = state, feeds, beats
        self.last_validation = None  # the validation data last given to `fit`

    def validation(self, data, steps, batch_size, every):
        """The `actions.Validation` of `data.validation` (a `fit_args` resolution), every
        `every` epochs; None without validation data."""
        if data.validation is None:
            return None
        val_input = self._feeds.get(data.validation, "validation_dataset_fn", "validation",
                                    data.validation_batch(batch_size))
        self.last_validation = data.validation
        return actions_lib.Validation(lambda hooks: self._run(val_input, steps, hooks),
                                      every=every, model=self._state.model)

    def evaluate(self, dataset_fn, x, y, sample_weight, *, training_data, batch_size, steps,
                 return_dict, callbacks, verbose):
        """`Trainer.evaluate`'s logs (its arguments as given; `verbose` resolved)."""
        if not isinstance(return_dict, bool):
            raise TypeError(f"`return_dict` must be True or False. Received: {return_dict!r}")
        check_int("steps", steps, minimum=1, optional=True)
        dataset_fn = fit_args.of_evaluate_call(dataset_fn, x, y, sample_weight, defaults=(
            self.last_validation, training_data))
        eval_input = self._feeds.get(dataset_fn, "dataset_fn", "evaluation", batch_size)
        self._state.ensure_built(eval_input.element_spec, state_lib.EVALUATION_STEPS)
        model = self._state.model
        known = callbacks_lib.known_batches(eval_input.cardinality, steps)
        cbs = callbacks_lib.callback_list(callbacks_lib.check_callbacks(callbacks), model=model,
                                          history=False, verbose=verbose, epochs=1, steps=known)
        logs = callbacks_lib.evaluated(cbs, lambda hooks: self._run(eval_input, steps, hooks),
                                       model)
        return logs if return_dict else _compat.flatten_metrics_in_order(model, logs)

    def _run(self, eval_input, steps, hooks=None):
        return self._state.evaluate(eval_input, steps, beat=self._beats.beat, hooks=hooks)

"""Exact evaluation of the model a Trainer trains: `Trainer.evaluate`.

Every example counts once under every strategy (`training_state.TrainingState.evaluate`), and the
callbacks' test hooks run around it as around `model.evaluate` (`callbacks.evaluated`).
What `evaluate` reads by default is the last validation data given to `fit` (the Trainer's
`trainer_inputs.TrainerInputs` keep it), then the training data. Fit's validation is an
action of its controller (`actions.Validation`), evaluating through the same
`TrainingState.evaluate`.
"""

from __future__ import annotations

from kerastrain import _compat
from kerastrain._options import check_int
from kerastrain.data import fit_args
from kerastrain.loop import callbacks as callbacks_lib
from kerastrain.loop import training_state as state_lib


class Evaluation:
    """Evaluates a `training_state.TrainingState`'s model on the Trainer's inputs
    (`trainer_inputs.TrainerInputs`).

    Args:
        state: the Trainer's `training_state.TrainingState`.
        inputs: the Trainer's `trainer_inputs.TrainerInputs`.
        beats: the Trainer's `stalls.Beats`: each evaluation loop is progress for the
            stall watch of the fit that runs, if any.
    """

    def __init__(self, state, inputs, beats):
        self._state, self._inputs, self._beats = state, inputs, beats

    def evaluate(self, dataset_fn, x, y, sample_weight, *, training_data, batch_size, steps,
                 return_dict, callbacks, verbose):
        """`Trainer.evaluate`'s logs (its arguments as given; `verbose` resolved)."""
        if not isinstance(return_dict, bool):
            raise TypeError(f"`return_dict` must be True or False. Received: {return_dict!r}")
        check_int("steps", steps, minimum=1, optional=True)
        dataset_fn = fit_args.of_evaluate_call(dataset_fn, x, y, sample_weight, defaults=(
            self._inputs.last_validation, training_data))
        eval_input = self._inputs.get(dataset_fn, "dataset_fn", "evaluation", batch_size)
        self._state.ensure_built(eval_input.element_spec, state_lib.EVALUATION_STEPS)
        model = self._state.model
        known = callbacks_lib.known_batches(eval_input.cardinality, steps)
        cbs = callbacks_lib.callback_list(callbacks_lib.check_callbacks(callbacks), model=model,
                                          history=False, verbose=verbose, epochs=1, steps=known)
        logs = callbacks_lib.evaluated(cbs, lambda hooks: self._run(eval_input, steps, hooks),
                                       model)
        return logs if return_dict else _compat.flatten_metrics_in_order(model, logs)

    def _run(self, eval_input, steps, hooks=None):
        return self._state.evaluate(eval_input, steps, hooks, beat=self._beats.beat)

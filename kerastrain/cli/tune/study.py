"""The one module that talks to Optuna: the study in `sweep_dir/study.db`, its sampler and
pruner, asking for a trial's values, reporting epochs and telling how a trial ended.

Optuna is an optional extra (`pip install "kerastrain[tune]"`), imported only when a sweep
opens its study. Only the sweep process writes the study (the trials write their epochs to
files the sweep reads): one writer, so SQLite never sees two at once.
"""

from __future__ import annotations

import logging
import os
import statistics

logger = logging.getLogger("kerastrain")

STUDY_NAME = "kerastrain"


def _optuna():
    try:
        import optuna
    except ImportError:
        raise ImportError("`kerastrain tune` needs Optuna, an optional extra: pip install "
                          "'kerastrain[tune]' (or optuna)") from None
    optuna.logging.set_verbosity(optuna.logging.WARNING)  # the sweep prints its own lines
    return optuna


def require_optuna():
    """Raise the ImportError that says how to install Optuna, if it is missing."""
    _optuna()


def _sampler(options, seen):
    """Optuna's sampler for `sampler:`. A seeded sampler is seeded with `seed + trials the study
    holds`, so that a resumed sweep does not propose the first values again."""
    optuna = _optuna()
    seed = options.get("seed")
    seed = None if seed is None else seed + seen
    if options["name"] == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    return optuna.samplers.TPESampler(seed=seed, n_startup_trials=options.get(
        "startup_trials", 10), constant_liar=True)  # trials running at once differ


def _pruner(options):
    optuna = _optuna()
    if options["name"] == "median":
        # Steps are epochs counted from 1; Optuna prunes from step == n_warmup_steps on.
        return optuna.pruners.MedianPruner(n_startup_trials=options.get("startup_trials", 2),
                                           n_warmup_steps=options.get("warmup_epochs", 0) + 1)
    if options["name"] == "successive_halving":
        return optuna.pruners.SuccessiveHalvingPruner(
            min_resource=options.get("min_epochs", 1),
            reduction_factor=options.get("reduction_factor", 3))
    return optuna.pruners.NopPruner()


def _distribution(param):
    optuna = _optuna()
    if param.kind == "choice":
        return optuna.distributions.CategoricalDistribution(list(param.choices))
    if param.kind == "int":
        return optuna.distributions.IntDistribution(param.low, param.high, log=param.log,
                                                    step=param.step or 1)
    return optuna.distributions.FloatDistribution(param.low, param.high, log=param.log,
                                                  step=param.step)


class Study:
    """The sweep's Optuna study, kept in `sweep_dir/study.db` (resumable)."""

    def __init__(self, sweep_dir, space):
        optuna = _optuna()
        self.space = space
        self.path = os.path.join(sweep_dir, "study.db")
        storage = "sqlite:///" + os.path.abspath(self.path)
        logging.getLogger("alembic").setLevel(logging.WARNING)
        self._study = optuna.create_study(
            storage=storage, study_name=STUDY_NAME, direction=space.direction,
            load_if_exists=True, pruner=_pruner(space.pruner))
        seen = len(self._study.get_trials(deepcopy=False))
        self._study.sampler = _sampler(space.sampler, seen)
        if seen == 0:
            for values in space.first_trials:
                self._study.enqueue_trial(values)
        self._distributions = {p.key: _distribution(p) for p in space.params}
        self._live = {}   # number -> optuna.trial.Trial of a trial this process runs
        self._reported = {}   # number -> {epoch: value} reported to the study

    # -- what the study holds -------------------------------------------------------------

    def trials(self, *states):
        """FrozenTrials in these states ("COMPLETE", "PRUNED", "FAIL", "RUNNING", "WAITING");
        all without states."""
        optuna = _optuna()
        wanted = tuple(getattr(optuna.trial.TrialState, s) for s in states) or None
        return self._study.get_trials(deepcopy=False, states=wanted)

    def left(self) -> int:
        """Trials still to start: `trials` less those started (enqueued ones wait to be)."""
        return self.space.trials - len(self.trials("COMPLETE", "PRUNED", "FAIL", "RUNNING"))

    def best(self, n=5):
        """The best complete trials, best first."""
        done = [t for t in self.trials("COMPLETE") if t.value is not None]
        return sorted(done, key=lambda t: t.value, reverse=self.space.direction == "maximize")[:n]

    # -- one trial ------------------------------------------------------------------------

    def ask(self):
        """A new trial: (number, {key: value})."""
        trial = self._study.ask(self._distributions)
        self._live[trial.number], self._reported[trial.number] = trial, {}
        return trial.number, dict(trial.params)

    def adopt(self, frozen):
        """A RUNNING trial of a sweep that was killed, to go on with here: (number, values)."""
        optuna = _optuna()
        # Optuna (4.x, 5.0) keeps a FrozenTrial's storage id private, and a Trial object is
        # the only way to report to and prune a trial started by another process.
        self._live[frozen.number] = optuna.trial.Trial(self._study, frozen._trial_id)
        self._reported[frozen.number] = dict(frozen.intermediate_values)
        return frozen.number, dict(frozen.params)

    def set_directory(self, number, directory):
        """Where the trial runs (its folder: best.yaml and the table name it)."""
        self._live[number].set_user_attr("directory", directory)

    def report(self, number, epoch, value) -> bool:
        """Report an epoch's value; whether the pruner stops the trial here."""
        trial = self._live[number]
        if epoch not in self._reported[number]:   # a resumed trial may say an epoch again
            trial.report(value, epoch)
            self._reported[number][epoch] = value
        return trial.should_prune()

    def why_pruned(self, number, epoch) -> str:
        """The pruner's reason in words: Optuna's median pruner compares the trial's best value
        so far with the median of the completed trials' values at this epoch."""
        others = [t.intermediate_values[epoch] for t in self.trials("COMPLETE")
                  if epoch in t.intermediate_values]
        metric, maximize = self.space.metric, self.space.direction == "maximize"
        value = self._reported[number][epoch]
        best = (max if maximize else min)(self._reported[number].values())
        said = f"{metric} {value:.4g}" + (f" (best so far {best:.4g})" if best != value else "")
        if self.space.pruner["name"] == "median" and others:
            return (f"{said} {'below' if maximize else 'above'} the median "
                    f"{statistics.median(others):.4g} of {len(others)} completed "
                    f"trial{'s' if len(others) != 1 else ''} at that epoch")
        factor = self.space.pruner.get("reduction_factor", 3)
        return (f"{said}: not among the best 1/{factor} of the trials at that epoch "
                "(successive halving)")

    def tell(self, number, state, value=None):
        """End a trial: state "COMPLETE" (with its value), "PRUNED" or "FAIL"."""
        optuna = _optuna()
        self._reported.pop(number, None)
        self._study.tell(self._live.pop(number), value if state == "COMPLETE" else None,
                         state=getattr(optuna.trial.TrialState, state), skip_if_finished=True)

"""The sweep's outer loop: keep `parallel` trials running, answer each epoch, record each end.

One pass: start trials while a slot of cores is free (an interrupted trial first, then new
values from the study), read the epochs each running trial wrote, report them to the study and
answer go or prune, and when a trial's process ends, tell the study how it ended.
"""

from __future__ import annotations

import math
import os
import time

from kerastrain.cli.tune import records
from kerastrain.cli.tune import trials as trials_lib

POLL_SECONDS = 0.1   # between reads of the running trials' epoch files (a few small files)


class Loop:
    """Runs a sweep's trials (`Sweep.run` makes one; `run()` returns when none is left)."""

    def __init__(self, sweep, study, parent=None, ray=None):
        self.sweep, self.study, self.parent, self.space = sweep, study, parent, sweep.space
        self.ray = ray   # RayHosts with an actor per slot (`--ray`), or None: local processes
        self.slots = trials_lib.core_slots(self.space.parallel)
        self.free = list(range(len(self.slots)))
        self.running = {}   # number -> (TrialProcess, slot)
        self.stopping = None   # why no new trial starts
        self.error = None     # a mistake of the user's found by a trial: raised at the end

    def run(self):
        waiting = list(self.study.trials("RUNNING"))   # a sweep before was stopped under them
        try:
            while True:
                while self.free and self.stopping is None and (waiting or self.study.left() > 0):
                    if waiting:
                        self._start(*self.study.adopt(waiting.pop(0)), resumed=True)
                    else:
                        self._start(*self.study.ask(), resumed=False)
                if not self.running:
                    break
                time.sleep(POLL_SECONDS)
                for number in list(self.running):
                    self._poll(number)
        except KeyboardInterrupt:
            self._interrupted()
            raise
        if self.error is not None:
            raise self.error

    # -- a trial's life ----------------------------------------------------------------------

    def _start(self, number, values, resumed):
        directory = os.path.join(self.sweep.sweep_dir, f"trial-{number}")
        self.study.set_directory(number, directory)
        slot = self.free.pop(0)
        process = trials_lib.TrialProcess(
            number, values, directory, self.slots[slot],
            self.sweep.command(number, values, directory, self.parent),
            ray=None if self.ray is None else (self.ray, f"slot-{slot}"))
        pruned = process.pruned_before() if resumed else None
        if resumed:
            process.skip_decided()
        if pruned is not None:   # decided before the sweep stopped, not yet told
            self.free.insert(0, slot)
            self.study.tell(number, "PRUNED")
            self._record(process, "pruned")
            self.sweep.say(f"trial {number} was pruned at epoch {pruned} before the sweep "
                           "stopped: kept as pruned")
            return
        process.start()
        self.running[number] = (process, slot)
        names = records.short_names(list(values))
        shown = ", ".join(f"{names[k]}={records.shown(v)}" for k, v in values.items())
        where = (f"on core{'s' if len(process.cores) > 1 else ''} "
                 f"{','.join(map(str, process.cores))}" if self.ray is None else
                 f"in the Ray actor of slot {slot}")
        self.sweep.say(f"trial {number} {'resumed' if resumed else 'started'} {where}: "
                       f"{shown} ({directory})")

    def _poll(self, number):
        process, slot = self.running[number]
        for epoch, logs in process.new_epochs():
            self._epoch(process, epoch, logs)
        code = process.poll()
        if code is None:
            return
        for epoch, logs in process.new_epochs():   # written just before it ended
            self._epoch(process, epoch, logs)
        del self.running[number]
        self.free.append(slot)
        self._ended(process, code)

    def _epoch(self, process, epoch, logs):
        metric, number = self.space.metric, process.number
        records.write_config(self.sweep.sweep_dir, self.space, logs)
        if process.pruned_at is not None or process.failure:
            process.decide(epoch, True)   # a resumed trial past its verdict: stop it again
            return
        if metric not in logs:
            process.failure = f"no {metric!r} among its epoch metrics"
            self.error = ValueError(
                f"The objective metric {metric!r} is not among the epoch metrics trial "
                f"{number} reports. Received: {', '.join(sorted(logs)) or 'none'}. Set "
                f"objective.metric in {self.space.source} to one of them.")
            self.stopping = "the objective is not measured"
            process.decide(epoch, True)
            return
        value = logs[metric]
        last = epoch >= self.sweep.trial_epochs(process.values)
        prune = self.study.report(number, epoch, value) and not last
        process.decide(epoch, prune)
        if prune:
            self.sweep.say(f"trial {number} pruned at epoch {epoch}: "
                           f"{self.study.why_pruned(number, epoch)}")
        else:
            self.sweep.say(f"trial {number} epoch {epoch}: {metric} {value:.4g}")

    def _ended(self, process, code):
        number, metric = process.number, self.space.metric
        epochs = process.epochs()
        last = epochs.get(max(epochs)) if epochs else {}
        value = last.get(metric)
        failure = process.failure
        if failure is None and process.pruned_at is not None:
            self.study.tell(number, "PRUNED")
            self._record(process, "pruned", epochs)
            return
        if failure is None and code == 0 and value is not None and math.isfinite(value):
            self.study.tell(number, "COMPLETE", value)
            self._record(process, "complete", epochs)
            self.sweep.say(f"trial {number} done: {metric} {value:.4g} after {max(epochs)} "
                           f"epoch{'s' if max(epochs) != 1 else ''}, {process.seconds():.0f} s")
            if self.parent is not None:   # the parent run's curve: each trial's result
                self.parent.write_scalars(number, {metric: value})
            return
        failure = failure or (f"exit code {code}: {process.last_line()}" if code else
                              f"{metric} is {value}" if value is not None else
                              "it reported no epoch")
        self.study.tell(number, "FAIL")
        self._record(process, "failed", epochs)
        self.sweep.say(f"trial {number} failed ({failure}); its log: {process.log_path}")
        if self.stopping is None and not self.study.trials("COMPLETE"):
            self.stopping = "failed before any completed"
            self.sweep.say(f"kerastrain tune: stopping: trial {number} failed before any trial "
                           "completed, so the recipe may not train with these values at all; "
                           "no new trial starts (the others end as they run)")

    def _record(self, process, state, epochs=None):
        records.write_session(process.directory, process.values, state,
                              process.epochs() if epochs is None else epochs)

    def _interrupted(self):
        """Ctrl-C: each running trial stops as a run does on Ctrl-C (its checkpoint kept); the
        study keeps them running, and the same command resumes them."""
        for process, _ in self.running.values():
            process.stop()
        if self.running:
            self.sweep.say(f"kerastrain tune: interrupted; trial(s) "
                           f"{', '.join(map(str, sorted(self.running)))} resume from their "
                           "checkpoints when the same command runs again")

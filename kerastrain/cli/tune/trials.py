"""One trial's process: `kerastrain run RECIPE --set ...` in its own folder, pinned to its cores.

Each trial is a separate process (TensorFlow's thread pools and memory are its own), started
with the sweep's working directory, its output appended to `trial-N/trial.log`. Its CPU
affinity is its share of the sweep's cores (Linux: inherited from the thread that starts it),
and TensorFlow's and OpenMP's thread counts follow (TF_NUM_INTRAOP_THREADS...), so that two
trials do not fight over each core. A trial dies with the sweep (SIGKILL included) as a
launched task dies with `kerastrain launch`, so a restarted sweep never meets a live one.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

from kerastrain._lifetime import LAUNCHER_PID
from kerastrain.cli.tune import space

# The exchange with the trial's `report.Reporter`, in the trial's folder (report.py says why).
FOLDER, EPOCHS = "sweep", "epochs.jsonl"


def verdict_path(directory, epoch) -> str:
    return os.path.join(directory, FOLDER, f"verdict-{epoch}")


def core_slots(parallel, cores=None) -> list:
    """`parallel` tuples of cores: contiguous shares of this process's cores, or (more trials
    than cores) one core each, taken in turn."""
    if cores is None:
        cores = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else range(
            os.cpu_count() or 1)
    cores = sorted(cores)
    if parallel > len(cores):
        return [(cores[i % len(cores)],) for i in range(parallel)]
    return [tuple(cores[i * len(cores) // parallel:(i + 1) * len(cores) // parallel])
            for i in range(parallel)]


def _spawn(argv, cores, env, log):
    """Start `argv` on `cores` only: this thread takes the affinity for the fork (the child
    inherits it before TensorFlow sizes its pools), then takes its own back."""
    pin = hasattr(os, "sched_setaffinity")
    mine = os.sched_getaffinity(0) if pin else None
    if pin:
        os.sched_setaffinity(0, cores)
    try:
        return subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, env=env)
    finally:
        if pin:
            os.sched_setaffinity(0, mine)


class TrialProcess:
    """A trial's run: start it, read its epochs, answer them, see how it ended.

    Args:
        number: the Optuna trial number (its folder is `trial-<number>`).
        values: recipe key -> value.
        directory: the trial's folder, its `trainer.model_dir`.
        cores: the cores it runs on.
        argv: its command line (`kerastrain run ...`).
    """

    def __init__(self, number, values, directory, cores, argv, ray=None):
        self.number, self.values, self.directory = number, dict(values), directory
        self.cores, self.argv = tuple(cores), list(argv)
        self.ray = ray   # (RayHosts, the slot's actor name): the run is that actor's child
        self.pruned_at = None
        self.failure = None   # why the sweep ends it as failed, whatever its exit code
        self._process = self._log = None
        self._seen = set()
        self.started = None

    @property
    def log_path(self) -> str:
        return os.path.join(self.directory, "trial.log")

    def start(self):
        os.makedirs(os.path.join(self.directory, FOLDER), exist_ok=True)
        threads = str(len(self.cores))
        env = dict(os.environ, PYTHONUNBUFFERED="1", TF_NUM_INTRAOP_THREADS=threads,
                   TF_NUM_INTEROP_THREADS=threads, OMP_NUM_THREADS=threads,
                   **{LAUNCHER_PID: str(os.getpid())})
        env.pop("TF_CONFIG", None)   # a trial is a run of its own, never a task of a cluster
        self._log = open(self.log_path, "a")
        where = f"cores {list(self.cores)}" if self.ray is None else \
            f"Ray actor {self.ray[1]}, {threads} thread(s)"
        self._log.write(f"# kerastrain tune, {time.strftime('%Y-%m-%d %H:%M:%S')}, {where}: "
                        f"{subprocess.list2cmdline(self.argv)}\n")
        self._log.flush()
        self.started = time.monotonic()
        if self.ray is None:
            self._process = _spawn(self.argv, self.cores, env, self._log)
            return
        hosts, name = self.ray
        self._process = hosts.popen(name, self.argv, env=env)
        self._copier = threading.Thread(target=self._copy, daemon=True)
        self._copier.start()

    def _copy(self):
        """A Ray trial's output, as its actor hands it over, into its log."""
        for line in self._process.stdout:
            self._log.write(line)
            self._log.flush()

    def epochs(self) -> dict:
        """Epoch -> logs of every whole line the trial wrote (across its restarts)."""
        path = os.path.join(self.directory, FOLDER, EPOCHS)
        found = {}
        try:
            with open(path) as f:
                for line in f:
                    if line.endswith("\n"):   # a line still being written waits
                        entry = json.loads(line)
                        found[entry["epoch"]] = entry["logs"]
        except FileNotFoundError:
            pass
        return found

    def new_epochs(self) -> list:
        """(epoch, logs) of the epochs not seen yet, in order."""
        fresh = sorted((e, logs) for e, logs in self.epochs().items() if e not in self._seen)
        self._seen.update(e for e, _ in fresh)
        return fresh

    def decide(self, epoch, prune):
        """Answer the trial's wait at the end of `epoch` (written whole: rename)."""
        path = verdict_path(self.directory, epoch)
        with open(path + ".tmp", "w") as f:
            f.write("prune\n" if prune else "go\n")
        os.replace(path + ".tmp", path)
        if prune:
            self.pruned_at = epoch

    def skip_decided(self):
        """A resumed trial: the epochs a sweep before answered are not read again."""
        self._seen.update(e for e in self.epochs() if os.path.exists(
            verdict_path(self.directory, e)))

    def pruned_before(self):
        """The epoch a verdict of an earlier sweep pruned this trial at, or None."""
        for epoch in sorted(self.epochs()):
            try:
                with open(verdict_path(self.directory, epoch)) as f:
                    if f.read().strip() == "prune":
                        return epoch
            except FileNotFoundError:
                continue
        return None

    def poll(self):
        """The exit code once the process has ended (and its output is in its log), else None."""
        code = self._process.poll()
        if code is not None and self._log is not None:
            if self.ray is not None:
                self._copier.join(timeout=10)
            self._log.close()
            self._log = None
        return code

    def stop(self, timeout=30.0):
        """Ask the run to stop (SIGINT: as Ctrl-C, its checkpoint stays), then kill it."""
        if self._process is None or self._process.poll() is not None:
            return
        send = self._process.send_signal if self.ray is None else \
            self._process.signal_group   # through its actor
        send(signal.SIGINT)
        try:
            self._process.wait(timeout)
        except subprocess.TimeoutExpired:
            send(signal.SIGKILL)
            self._process.wait(timeout)
        self.poll()

    def seconds(self) -> float:
        return time.monotonic() - self.started

    def last_line(self) -> str:
        """The last line of its log that says something (the error, usually)."""
        try:
            with open(self.log_path, errors="replace") as f:
                lines = [line.strip() for line in f.readlines()[-40:] if line.strip()]
        except FileNotFoundError:
            return ""
        errors = [line for line in lines if "error" in line.lower()]
        return (errors or lines or [""])[-1][:400]


def command(recipe, sets, values, directory, callbacks, extra_sets=(), launch=None) -> list:
    """`python -m kerastrain.cli run RECIPE` with the user's `--set`s, then the trial's values,
    folder and reporter, as `--set`s (so the recipe's schema checks them as it checks any);
    with `launch` ({workers, ps, chief}), `kerastrain launch RECIPE --workers N ...` instead:
    a local cluster of processes per trial, all on the trial's cores."""
    reporter = {"name": "kerastrain.cli.tune.report:Reporter", "directory": directory}
    overrides = list(sets) + [space.override(k, v) for k, v in values.items()] + [
        space.override("trainer.model_dir", directory),
        space.override("callbacks", list(callbacks or []) + [reporter]), *extra_sets]
    argv = [sys.executable, "-m", "kerastrain.cli", "run", recipe]
    if launch is not None:
        argv[3:4] = ["launch"]
        argv += ["--workers", str(launch["workers"])] + (
            ["--ps", str(launch["ps"])] if launch["ps"] else []) + (
            ["--chief"] if launch["chief"] else [])
    for item in overrides:
        argv += ["--set", item]
    return argv

"""`kerastrain launch --fault`: a plan of faults applied to a running job (a rehearsal).

`freeze` stops a task's processes (SIGSTOP) for a while, `partition` cuts its host off the
network (`--network multihost`), `kill` ends it (SIGKILL); each at a time since the tasks
started or once the chief has a complete checkpoint of a step. The launcher's output says each
fault before any task's answer to it.
"""

from __future__ import annotations

import dataclasses
import os
import re
import signal
import threading
import time


@dataclasses.dataclass(frozen=True)
class Fault:
    """One scheduled fault: `freeze`/`partition` a task's host for `duration` seconds, or
    `kill` its process, once `at` seconds have passed since the tasks started or once the
    chief has a checkpoint of step `step` or later."""
    action: str
    task: str
    at: float | None
    step: int | None
    duration: float | None
    text: str


_FAULT = re.compile(r"^(freeze|partition|kill|remove|return)\s+([a-z_]+:\d+)\s+at\s+"
                    r"(?:(\d+(?:\.\d+)?)s|"
                    r"step\s+(\d+))(?:\s+for\s+(\d+(?:\.\d+)?)s)?$")
FAULT_FORM = ("'freeze TASK at Ns for Ns', 'partition TASK at Ns for Ns' or 'kill TASK at Ns' "
              "('at step N' instead of 'at Ns': once a checkpoint of step N or later is complete;"
              " with --workers MIN:MAX also 'remove worker:N at ...' and 'return worker:N at "
              "...': its host gone for good, and back)")
_NO_DURATION = ("kill", "remove", "return")


def parse_fault(text: str, tasks, multihost: bool, elastic_max: int | None = None) -> Fault:
    """A `--fault` value, checked against the job's tasks.

    Raises:
        ValueError: not of the form, an unknown task, or a partition without `--network
            multihost` (only there does a task have a link of its own to cut).
    """
    match = _FAULT.match(" ".join(str(text).split()))
    if not match:
        raise ValueError(f"`--fault` must read {FAULT_FORM}. Received: {text!r}")
    action, task, at, step, duration = match.groups()
    names = [t.name for t in tasks]
    if action in ("remove", "return"):   # a host of an elastic job's, by its worker's name
        if elastic_max is None:
            raise ValueError(f"`--fault {action}` changes an elastic job's hosts: it needs "
                             f"`--workers MIN:MAX`. Received: {text!r}")
        names = [f"worker:{i}" for i in range(elastic_max)]
    if task not in names:
        raise ValueError(f"`--fault` names {task!r}, which this job does not have; its tasks "
                         f"are {', '.join(names)}. Received: {text!r}")
    if (duration is None) != (action in _NO_DURATION):
        takes = "takes no" if action in _NO_DURATION else "needs a"
        raise ValueError(f"`--fault` {action} {takes} "
                         f"duration ('for Ns'); the form is {FAULT_FORM}. Received: {text!r}")
    if action == "partition" and not multihost:
        raise ValueError("`--fault partition` cuts a host's own link, which only `--network "
                         f"multihost` gives each task. Received: {text!r}")
    return Fault(action, task, None if at is None else float(at),
                 None if step is None else int(step),
                 None if duration is None else float(duration), " ".join(text.split()))


def latest_step(model_dir) -> int | None:
    """The step of the newest complete checkpoint in `model_dir` (None: none yet, or no
    model_dir): one the checkpoint state file names, which the chief writes once a save has
    returned. (Its `.index` file appears before: a fault at a step then landed inside the
    save, where TensorFlow's call to each worker, removing a function, blocks holding the
    GIL when a worker is frozen, CI 2026-11-27.)"""
    if not model_dir:
        return None
    try:
        with open(os.path.join(model_dir, "checkpoints", "checkpoint")) as f:
            named = f.read()
    except OSError:
        return None
    return max((int(step) for step in re.findall(r'ckpt-(\d+)"', named)), default=None)


class Faults:
    """Applies a fault plan while the job runs, from a thread of the launcher.

    Args:
        plan: the `Fault`s, in any order.
        tasks: the job's tasks (`tasks.Task`), whose `process` is the running one.
        say: the launcher's `say(text, act=None)`: `act()` and the line `text` with no task's
            line between them.
        hosts: what a `partition` cuts (`hosts.Hosts`), or None.
        model_dir: where a fault `at step N` looks for the chief's checkpoints.
    """

    def __init__(self, plan, *, tasks, say, hosts=None, model_dir=None, poll_secs=0.2,
                 elastic=None):
        self.tasks = tasks
        self.elastic = elastic   # takes `remove` and `return` (elastic.Elastic.request)
        self.say = say
        self.hosts = hosts
        self.pending = list(plan)
        self.model_dir = model_dir
        self.poll_secs = poll_secs
        self._ends = []           # (monotonic time, fault, process) to undo
        self._stop = threading.Event()
        self._thread = None
        self._started = None

    def __enter__(self):
        if self.pending:
            self._started = time.monotonic()
            self._thread = threading.Thread(target=self._run, name="kerastrain-faults",
                                            daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        for _, fault, process in self._ends:  # a job that ends first: hosts joined again
            self._undo(fault, process)
        self._ends = []
        return False

    def _task(self, name):
        return next((t for t in self.tasks if t.name == name), None)

    def _due(self, fault) -> bool:
        if fault.at is not None:
            return time.monotonic() - self._started >= fault.at
        step = latest_step(self.model_dir)
        return step is not None and step >= fault.step

    def _run(self):
        while not self._stop.wait(self.poll_secs):
            for fault in [f for f in self.pending if self._due(f)]:
                self.pending.remove(fault)
                self._apply(fault)
            now = time.monotonic()
            for end in [e for e in self._ends if e[0] <= now]:
                self._ends.remove(end)
                self._undo(end[1], end[2])
            if not self.pending and not self._ends:
                return

    def _apply(self, fault):
        if fault.action in ("remove", "return"):
            self.elastic.request(fault.action, fault.task, fault.text)
            return
        task = self._task(fault.task)
        process = task.process
        if fault.action != "partition" and (process is None or process.poll() is not None):
            self.say(f"fault: {fault.text}: {fault.task} is not running; skipped")
            return
        what = {"freeze": "froze", "partition": "cut off the network:", "kill": "killed"}
        text = f"fault: {what[fault.action]} {fault.task}" + (
            f" for {fault.duration:g} s" if fault.duration else "") + f" ({fault.text})"
        if fault.action == "partition":
            self._say(text, lambda: self.hosts.partition(task.host, True))
        else:
            self._say(text, lambda: signal_group(
                process, signal.SIGSTOP if fault.action == "freeze" else signal.SIGKILL), process)
        if fault.duration:
            self._ends.append((time.monotonic() + fault.duration, fault, process))

    def _undo(self, fault, process):
        if fault.action == "partition":
            host = self._task(fault.task).host
            self._say(f"fault: {fault.task} is on the network again",
                      lambda: self.hosts.partition(host, False))
        elif process.poll() is None:
            self._say(f"fault: {fault.task} runs again",
                      lambda: signal_group(process, signal.SIGCONT), process)

    def _say(self, text, act, process=None):
        """`act()`, then the line `text`, no task's line between them (`Launcher.say`). A Ray
        task is signalled through its actor, a remote call of up to 30 s that the launcher's
        output lock is not held for (every task's output would wait): its lines come through
        the actor, in no order to keep with the launcher's."""
        if hasattr(process, "signal_group"):
            act()
            self.say(text)
        else:
            self.say(text, act=act)


def signal_group(process, signum):
    """Send `signum` to the process group of a task (its children too)."""
    if hasattr(process, "signal_group"):   # a Ray task: its actor signals it on its node
        process.signal_group(signum)
        return
    try:
        os.killpg(process.pid, signum)
    except (ProcessLookupError, PermissionError):
        pass

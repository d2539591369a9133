"""`kerastrain launch --workers MIN:MAX`: a job that goes on at another size as workers come and go.

A spot cluster loses workers and gets them back in other numbers. The job has MAX worker
*slots* (hosts `worker-0` ... `worker-{MAX-1}`); a slot is available unless the fault plan
removed its host (`--fault "remove worker:3 at step 40"`, until `return worker:3 at ...`), its
worker failed past its restarts (lost for good), or a `--capacity-file` (one integer, read
every poll: how many workers the cluster can hold now) allows fewer. The job runs on the
available slots, up to MAX, as long as MIN holds:

- multi-worker mirrored: each size change restarts every task at the new size (a membership
  change is a restart, as torchrun's `--nnodes MIN:MAX`). A loss kills the job's workers and
  resumes from the last checkpoint; a grow first sends SIGTERM, so every worker saves the step
  it reached (`loop/preemption.py`) and none is repeated. The global batch is the recipe's at
  every size (each worker takes its share of it), so the steps and their examples are the
  same as at any other size.
- parameter servers: a lost worker is not restarted and the coordinator runs its steps on
  the others; a returned one is started again at its address (TensorFlow's coordinator takes a
  worker back there, but no worker at a new address: a ps job grows back to the size it
  started at, no further).

Below MIN the job stops with `BELOW_MIN` (69, EX_UNAVAILABLE) and says from which step a
rerun resumes. Each change is said in one line. Pure Python, no TensorFlow.
"""

from __future__ import annotations

import json
import os
import re
import signal
import threading
import time

from kerastrain.cli import faults as faults_lib
from kerastrain.cli import hosts as hosts_lib
from kerastrain.cli.outages import Outages
from kerastrain.io import locks

BELOW_MIN = 69      # EX_UNAVAILABLE: not enough workers to go on
RESIZE = -1000      # an attempt ended by the launcher to change the job's size (never a real code)
SAVE_SECS = 60.0    # for every worker to save the step it reached before a grow

_SPEC = re.compile(r"^\s*(\d+)\s*(?::\s*(\d+)\s*)?$")
# The chief's lines that say its training is in its last epoch, or over (a restart then would
# cut its export short, which a multi-worker rerun with nothing left to train does not redo).
_LAST_EPOCH = re.compile(r"^Epoch (\d+)/\1$|^kerastrain: (exported|done:|nothing left)")


def parse_workers(text) -> tuple[int, int]:
    """`--workers`: N (MIN = MAX = N) or MIN:MAX.

    Raises:
        ValueError: not of the form, MIN below 1, or MIN above MAX.
    """
    match = _SPEC.match(str(text))
    low, high = (int(match.group(1)), int(match.group(2) or match.group(1))) if match else (0, 0)
    if not match or low < 1 or low > high:
        raise ValueError("`--workers` must be N or MIN:MAX with 1 <= MIN <= MAX (an elastic "
                         f"job: at least MIN workers, at most MAX). Received: --workers {text}")
    return low, high


def slot_of(name: str) -> str:
    """The slot (host) a fault plan's `worker:3` names: `worker-3`."""
    job, index = name.split(":")
    return hosts_lib.host_name(job, int(index))


class Elastic:
    """The job's size: which slots are available, and what the launcher does when that changes.

    Args:
        low, high: MIN and MAX workers.
        build: `build(slots) -> tasks`: the job's tasks with one worker on each slot (new
            addresses; the other tasks as before).
        ps: a parameter-server job.
        capacity_file: a file holding how many workers the cluster can hold now, or None.
        model_dir: where the last checkpoint's step is read (`faults.latest_step`).
    """

    def __init__(self, low, high, *, build, ps=False, capacity_file=None, model_dir=None):
        self.low, self.high = low, high
        self.build = build
        self.ps = ps
        self.capacity_file = capacity_file
        self.model_dir = model_dir
        self.slots = [slot_of(f"worker:{i}") for i in range(high)]
        self.gone = {}         # slot -> why it is unavailable ("host worker-3 removed", ...)
        self.lost = set()      # slots lost for good (restarts used): never available again
        self._requests = []    # (action, slot, text) from the fault plan's thread
        self.finishing = False  # the chief said it is in its last epoch: no more grows
        self._lock = threading.Lock()

    # -- capacity ---------------------------------------------------------------------------

    def _file_capacity(self):
        if self.capacity_file is None:
            return self.high
        try:
            with open(self.capacity_file) as f:
                return max(0, int(f.read().strip()))
        except (OSError, ValueError):
            return self.high   # unreadable (being rewritten): no change

    def available(self) -> list:
        """The slots the job may run on now, in order, at most MAX."""
        free = [s for s in self.slots if s not in self.gone and s not in self.lost]
        return free[:min(self.high, self._file_capacity())]

    def why_fewer(self, slots) -> str:
        """Why the slots `slots` had are not all available now."""
        reasons = [self.gone.get(s) or ("lost for good" if s in self.lost else None)
                   for s in slots if s not in self.available()]
        reasons = [r for r in reasons if r]
        return "; ".join(dict.fromkeys(reasons)) or \
            f"capacity file {self.capacity_file} says {self._file_capacity()}"

    def request(self, action, name, text):
        """The fault plan's `remove`/`return` of worker `name` (applied at the next poll)."""
        with self._lock:
            self._requests.append((action, slot_of(name), text))

    def _apply_requests(self, launcher):
        with self._lock:
            requests, self._requests = self._requests, []
        for action, slot, text in requests:
            if action == "remove":
                self.gone[slot] = f"host {slot} removed"
                task = _on_slot(launcher.tasks, slot)
                launcher.say(f"fault: removed host {slot} for good ({text})", act=lambda: (
                    faults_lib.signal_group(task.process, signal.SIGKILL)
                    if task is not None and task.process is not None else None))
            else:
                self.gone.pop(slot, None)
                launcher.say(f"fault: host {slot} is back ({text})")

    # -- the first start --------------------------------------------------------------------

    def first_slots(self, say):
        """The slots the job starts on, or None (below MIN: said)."""
        slots = self.available()
        how = f" ({self.why_fewer(self.slots)})" if len(slots) < self.high else ""
        if len(slots) < self.low:
            say(f"elastic: {len(slots)} worker(s) available{how}, below the minimum "
                f"{self.low}: not starting (exit {BELOW_MIN})")
            return None
        say(f"elastic: {self.low} to {self.high} workers; starting with {len(slots)}{how}")
        return slots

    # -- while an attempt runs --------------------------------------------------------------

    def heard(self, line):
        """A line of the chief's (`_LAST_EPOCH`)."""
        if _LAST_EPOCH.match(line):
            self.finishing = True

    def poll(self, launcher):
        """Called by the launcher's attempt loop: RESIZE to end the attempt, BELOW_MIN to stop
        the job, or None."""
        self._apply_requests(launcher)
        if self.ps:
            return self._poll_ps(launcher)
        running = [t.slot for t in launcher.tasks if t.type == "worker"]
        wanted = self.available()
        if any(slot not in wanted for slot in running):     # one of its slots is gone
            for task in launcher.tasks:   # a peer lost: none can save; the checkpoint holds
                if task.type in ("worker", "chief") and task.process is not None:
                    faults_lib.signal_group(task.process, signal.SIGKILL)
            return RESIZE
        if len(wanted) > len(running) and self.finishing:
            if not self._said_finishing:
                launcher.say(f"capacity for {len(wanted)} worker(s) (max {self.high}), but the "
                             f"chief is in its last epoch: it ends at {len(running)}")
                self._said_finishing = True
        elif len(wanted) > len(running):                    # capacity came back
            launcher.say(f"capacity for {len(wanted)} worker(s) (max {self.high}): every "
                         "worker saves the step it reached, then the job restarts larger")
            self._save_and_stop(launcher)
            return RESIZE
        return None

    def _save_and_stop(self, launcher):
        training = [t for t in launcher.tasks if t.type in ("worker", "chief")
                    and t.process is not None and t.process.poll() is None]
        for task in training:
            faults_lib.signal_group(task.process, signal.SIGTERM)
        deadline = time.monotonic() + SAVE_SECS
        while time.monotonic() < deadline and any(t.process.poll() is None for t in training):
            time.sleep(0.1)

    def _poll_ps(self, launcher):
        wanted = self.available()
        for task in [t for t in launcher.tasks if t.type == "worker"]:
            if task.slot not in wanted and not task.out:
                if task.process.poll() is None:
                    faults_lib.signal_group(task.process, signal.SIGKILL)
                    task.process.wait()
                stop = self._ps_out(launcher, task, self.why_fewer([task.slot]))
                if stop is not None:
                    return stop
            elif task.slot in wanted and task.out and task.slot not in self.lost:
                task.out, task.restarts, task.late = False, 0, True
                launcher.start(task)
                launcher.say(f"{task.name} is back on {task.slot}; going on with "
                             f"{self._ps_size(launcher)} worker(s) (max {self.high})")
        return None

    def ps_worker_exited(self, launcher, task, restarts):
        """A ps worker's process ended: start it again, or go on without it (None), or stop
        the job (BELOW_MIN)."""
        if task.slot in self.available() and task.restarts < restarts:
            return "restart"
        if task.slot in self.available():
            self.lost.add(task.slot)
        why = "its restarts used" if task.slot in self.lost else self.why_fewer([task.slot])
        return self._ps_out(launcher, task, why)

    def _ps_out(self, launcher, task, why):
        task.out = True
        if launcher.outages is not None:
            launcher.outages.went_down(task, while_=f"while it was out ({why})")
        size, step = self._ps_size(launcher), faults_lib.latest_step(self.model_dir)
        if size < self.low:
            launcher.say(self._below(f"{task.name} lost ({why})", size, step))
            self.stopped = True
            return BELOW_MIN
        launcher.say(f"{task.name} lost for good ({why}); going on with {size} worker(s) "
                     f"(min {self.low}), no restart: the coordinator runs its steps on the "
                     f"others (last checkpoint: step {step})")
        return None

    @staticmethod
    def _ps_size(launcher):
        return len([t for t in launcher.tasks if t.type == "worker" and not t.out])

    def _below(self, what, size, step):
        return (f"{what}; {size} worker(s) left, below the minimum {self.low}: stopping the "
                f"job (exit {BELOW_MIN}); run it again when workers are back: it resumes from "
                f"step {step}")

    # -- between attempts (multi-worker) ----------------------------------------------------

    def after(self, launcher, code, exits, exhausted):
        """An attempt ended with `code` (RESIZE: the launcher ended it); `exits`: each task's
        exit code when it ended (None: still running). Returns "stop" (below MIN: said),
        "resized" (the tasks rebuilt at the size available: not one of --max-restarts) or
        "restart" (as without MIN:MAX)."""
        before = [t.slot for t in launcher.tasks if t.type == "worker"]
        if self.ps:   # the job restarts (a ps failed) on the slots available now
            if code == BELOW_MIN and self.stopped:
                return "stop"
            if self.available() != before and len(self.available()) >= self.low:
                self._rebuild(launcher, self.available())
                launcher.say(f"the job restarts with {len(self.available())} worker(s) (min "
                             f"{self.low}, max {self.high}): the slots available now")
            return "restart"
        counted = code != RESIZE and not self.gone.keys() - self._gone_before
        # Past its restarts, a worker that a signal ended (killed, its host lost) is lost for
        # good; one that exited with an error of its own fails the job, as without MIN:MAX.
        killed = [t for t in launcher.tasks if t.type == "worker" and (exits.get(t.name) or 0) < 0]
        if counted and exhausted and killed:
            for task in killed:
                self.lost.add(task.slot)
                self.gone.setdefault(task.slot, f"{task.name} ended by a signal after "
                                                f"--max-restarts {launcher.max_restarts}")
            counted = False
        slots, step = self.available(), faults_lib.latest_step(self.model_dir)
        self._gone_before = set(self.gone)
        if len(slots) < self.low:
            launcher.say(self._below(f"{len(before) - len(slots)} worker(s) lost "
                                     f"({self.why_fewer(before)})", len(slots), step))
            return "stop"
        if counted and slots == before:
            return "restart"
        if len(slots) < len(before):
            lost = [f"worker:{before.index(s)}" for s in before if s not in slots]
            launcher.say(f"{', '.join(lost)} lost for good ({self.why_fewer(before)}); going on "
                         f"with {len(slots)} worker(s) (min {self.low}) from step {step}")
        elif len(slots) > len(before):
            launcher.say(f"growing to {len(slots)} worker(s) (max {self.high}) from step {step}")
        self._clear_lock_of_the_gone(launcher)
        self._rebuild(launcher, slots)
        return "restart" if counted else "resized"

    def _rebuild(self, launcher, slots):
        """The job's tasks at a new size, in place (the fault plan reads the same list)."""
        launcher.tasks[:] = self.build(slots)
        self.finishing = False
        if launcher.outages is not None:
            launcher.outages = Outages(launcher.tasks, launcher.say, ips=launcher.outages.ips)

    def _clear_lock_of_the_gone(self, launcher):
        """The model_dir lock names the chief's host and pid; a chief that moves to another
        host (its own removed) is refused a record from a host it cannot check
        (`io/locks.py`). The launcher can: a record naming a task it started, on that task's
        host, whose process it saw end, is stale, and removed (one line says so)."""
        path = os.path.join(self.model_dir, locks.NAME) if self.model_dir else None
        try:
            with open(path) as f:
                record = json.loads(f.read())
        except (TypeError, OSError, ValueError):
            return
        for task in launcher.tasks:
            if task.process is not None and task.process.pid == record.get("pid") and \
                    task.host == record.get("host") and task.process.poll() is not None:
                os.remove(path)
                launcher.say(f"removed the model_dir lock left by {task.name} (pid "
                             f"{task.process.pid} on host {task.host}, which has ended)")
                return

    _gone_before = frozenset()
    _said_finishing = False
    stopped = False


def _on_slot(tasks, slot):
    return next((t for t in tasks if t.type == "worker" and t.slot == slot), None)

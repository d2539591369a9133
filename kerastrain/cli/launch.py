"""`kerastrain launch`'s supervision: a job's tasks run as child processes until it is over.

The launcher starts every task (`kerastrain.cli.tasks`), prefixes each one's output
(`[worker:1] ...`), restarts a parameter-server worker that dies (the coordinator retries its
steps and the worker rejoins), restarts the whole job after any other failure while
`--max-restarts` allows (training resumes from the last checkpoint), names the tasks that
stalled or that the kernel says are frozen, and stops every process it started when the job
ends, fails, or is interrupted.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
import time

from kerastrain._lifetime import LAUNCHER_PID
from kerastrain.cli import elastic as elastic_lib
from kerastrain.cli import faults as faults_lib
from kerastrain.cli import frozen
from kerastrain.cli.outages import Outages
from kerastrain.cli.interrupts import Interrupts
from kerastrain.cli.tasks import chief_of
from kerastrain.loop import stalls
from kerastrain.loop.ps import liveness
from kerastrain.distribute import network as network_lib

WORKER_RESTARTS = 3        # per parameter-server worker and job attempt
GRACE_SECS = 20.0          # for the other tasks to stop by themselves once the chief is done
KILL_AFTER_SECS = 5.0      # SIGTERM, then SIGKILL
CHIEF_NOTICE_SECS = 90.0   # for the chief to report a lost parameter server itself

# What faulthandler.dump_traceback_later writes first (the stall watch's backstop).
_BACKSTOP = re.compile(r"^Timeout \(\d+:\d\d:\d\d\)!$")
# The lines a coordinator writes naming stuck workers (`liveness`, `stalls.StallWatch`).
_STUCK = liveness.STUCK


class Launcher:
    """Runs one job's tasks as child processes and decides when it is over."""

    def __init__(self, tasks, *, out=None, env=None, max_restarts=0, poll_secs=0.2,
                 interrupts=None, hosts=None, faults=(), model_dir=None, verbose=False,
                 elastic=None):
        self.tasks = tasks
        self.hosts = hosts          # a hosts.Hosts: each task a host of its own
        self.faults = list(faults)
        self.elastic = elastic      # an elastic.Elastic: `--workers MIN:MAX`
        self.model_dir = model_dir
        self.interrupts = interrupts
        self.out = out or sys.stdout
        self.env = dict(os.environ if env is None else env)
        if verbose:  # everything every task's TensorFlow says, as it says it
            self.env["TF_CPP_MIN_LOG_LEVEL"] = "0"
            self.env.pop("KERASTRAIN_TF_CPP_MIN_LOG_LEVEL", None)
        elif env is None and not _tf_log_level_set_by_user():
            # Set by `import kerastrain` in this process, not by the user: each task's
            # command line then holds TensorFlow's start-up lines back itself.
            self.env.pop("TF_CPP_MIN_LOG_LEVEL", None)
        self.max_restarts = max_restarts
        self.poll_secs = poll_secs
        self.parameter_servers = any(t.type == "ps" for t in tasks)
        # TensorFlow's gRPC errors about a worker that died: one line each outage.
        self.outages = None if verbose else Outages(
            tasks, self.say, ips=hosts.addresses if hosts is not None else None)
        self._lock = threading.Lock()
        self._threads = []
        self._ended_by = None  # the task whose exit ended the last attempt, if not the chief
        self.exits = {}        # each task's exit code as the last attempt ended (None: running)

    # -- processes ---------------------------------------------------------------------

    def say(self, text, act=None):
        """Print `[launch] text`; `act()` first, under the same lock, so that no task's answer
        to the act (the chief's account of a killed ps) comes before the line that says it."""
        with self._lock:
            if act is not None:
                act()
            print(f"[launch] {text}", file=self.out, flush=True)

    def _pump(self, task, stream):
        sifted = self.outages is not None and task.type in ("chief", "worker")
        for line in iter(stream.readline, ""):
            if task.type == "chief" and self.parameter_servers:
                self._restart_stuck(line)
            if self.elastic is not None and task is chief_of(self.tasks):
                self.elastic.heard(line.rstrip("\n"))
            if _BACKSTOP.match(line):
                task.backstop = True
            self._write(task, self.outages.feed(task.name, line.rstrip("\n")) if sifted
                        else [line.rstrip("\n")])
            if self.outages is not None and task.type == "worker" and self.parameter_servers:
                self.outages.heard(task, line)
        if sifted:
            self._write(task, self.outages.flush(task.name))
        stream.close()

    def _write(self, task, lines):
        if lines:
            with self._lock:
                self.out.write("".join(f"[{task.name}] {line}\n" for line in lines))
                self.out.flush()

    def start(self, task):
        env = dict(self.env, TF_CONFIG=task.tf_config, PYTHONUNBUFFERED="1",
                   **{LAUNCHER_PID: str(os.getpid())})
        rehearsal = self.hosts is not None and self.hosts.vanish_with_task
        if rehearsal:
            env[network_lib.REHEARSAL_HOST] = task.host
        # Its own session: a Ctrl-C in the terminal reaches the launcher only, which
        # then stops every task, and a task's children go with it.
        how = dict(env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                   bufsize=1, start_new_session=True)
        with self._deferred():
            if self.hosts is not None:
                task.process = self.hosts.popen(task.host, task.command, **how)
                where = (f" on host {task.host}" if rehearsal else " in a Ray actor on") + \
                    f" ({self.hosts.addresses[task.host]})"
            else:
                task.process = subprocess.Popen(task.command, **how)
                where = ""
            self.say(f"started {task.name} (pid {task.process.pid}){where}")
        thread = threading.Thread(target=self._pump, args=(task, task.process.stdout),
                                  daemon=True)
        task.pump = thread
        thread.start()
        self._threads.append(thread)

    def task(self, name):
        """The task named `name` ("worker:1"), or None."""
        return next((t for t in self.tasks if t.name == name), None)

    def _restart_stuck(self, line):
        """The coordinator names workers that answer no request (`stalls.StallWatch`): end
        them, so that their steps run elsewhere; the attempt's loop restarts them."""
        match = _STUCK.search(line)
        if not match:
            return
        for name in match.group(1).split(", "):
            task = self.task(name)
            if task is not None and task.process is not None and task.process.poll() is None:
                self.say(f"{name} answers the chief no request: ending it (pid "
                         f"{task.process.pid}) to restart it")
                faults_lib.signal_group(task.process, signal.SIGKILL)

    def _deferred(self):
        return self.interrupts.deferred() if self.interrupts else contextlib.nullcontext()

    def stop_all(self, reason=""):
        """SIGTERM every live task's process group, SIGKILL what is left after a grace period."""
        live = [t for t in self.tasks if t.process is not None and t.process.poll() is None]
        if live and reason:
            self.say(f"stopping {', '.join(t.name for t in live)}: {reason}")
        for task in live:
            # A stopped (frozen) task cannot act on SIGTERM until it runs again, and then it
            # would save with peers that are gone: it gets SIGKILL at once.
            signum = signal.SIGKILL if frozen.stopped(task.process) else signal.SIGTERM
            faults_lib.signal_group(task.process, signum)
        deadline = time.monotonic() + KILL_AFTER_SECS
        for task in live:
            try:
                task.process.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                faults_lib.signal_group(task.process, signal.SIGKILL)
                task.process.wait()
        for thread in self._threads:
            thread.join(timeout=2)
        self._threads = []

    # -- one attempt ---------------------------------------------------------------------

    def run_once(self, on_started=None) -> int:
        """Start every task and wait for the job's end; return the chief's exit code."""
        self._ended_by = None
        for task in self.tasks:
            task.restarts, task.backstop, task.late = 0, False, False
            self.start(task)
        if on_started is not None:
            on_started()
        chief = chief_of(self.tasks)
        try:
            code = self._attempt(chief)
            # Before the others are stopped: which tasks had ended, and how.
            self.exits = {t.name: t.process.poll() for t in self.tasks if t.process}
            if code == elastic_lib.RESIZE:
                return code
            if code and chief.pump is not None:
                chief.pump.join(timeout=2)  # its last lines read (faulthandler's among them)
            frozen_note = frozen.note(self.tasks) if code else ""  # before the others stop
            if self.outages is not None:
                self.outages.at_end(f"{chief.name} exited")
            if code == stalls.STALLED:
                self.say(f"a task stalled (exit {code}): no training progress within its "
                         "stall_timeout" + frozen_note)
            elif any(t.backstop for t in self.tasks):
                names = ", ".join(t.name for t in self.tasks if t.backstop)
                self.say(f"a task stalled (exit {code}, from faulthandler's backstop in {names}: "
                         "a call blocked while holding Python's GIL, so the stall watch could "
                         "not act; its stacks are above)" + frozen_note)
            elif frozen_note:
                self.say(f"the job failed (exit {code})" + frozen_note)
            return code
        finally:
            self.stop_all()
            if self.outages is not None:  # blocks the others printed as they stopped
                self.outages.at_end(f"{chief.name} exited")

    def _attempt(self, chief):
        while True:
            resized = self.elastic.poll(self) if self.elastic is not None else None
            if resized is not None:
                return resized
            if self.outages is not None:
                self.outages.tick()
            code = chief.process.poll()
            if code is not None:
                if code == 0:  # a failed chief's peers are stopped at once (run_once)
                    self._wait_for_the_rest(chief)
                return code
            for task in self.tasks:
                if task is chief or task.out or task.process.poll() is None:
                    continue
                failed = self._on_exit(task)
                if failed is not None:
                    return failed
            time.sleep(self.poll_secs)

    def _on_exit(self, task):
        """A task other than the chief exited. Returns an exit code to end the attempt."""
        code = task.process.returncode
        if task.type == "evaluator":
            return None  # side-car: the job goes on without it
        if self.elastic is not None and self.parameter_servers and task.type == "worker":
            verdict = self.elastic.ps_worker_exited(self, task, WORKER_RESTARTS)
            if verdict != "restart":
                return verdict   # left out (None), or below MIN
        # Back at its address, a tf.data service worker lets the dispatcher's jobs end (its
        # splits are lost); a ps worker takes steps again (the coordinator retried its own).
        if (task.type == "data_worker" or self.parameter_servers and task.type == "worker") \
                and task.restarts < WORKER_RESTARTS:
            task.restarts += 1
            if self.outages is not None and task.type == "worker":
                self.outages.went_down(task, restarting=True)
            self.say(f"{task.name} exited with {_describe(code)}; restarting it "
                     f"({task.restarts}/{WORKER_RESTARTS})")
            task.late = True
            self.start(task)
            return None
        if code == 0 and not self.parameter_servers:
            return None  # a synchronous worker that finished: the chief will too
        self.say(f"{task.name} exited with {_describe(code)}; the job cannot go on without it")
        chief = chief_of(self.tasks)
        if task.type == "ps":
            # The chief notices and says what it lost, with where to resume; give it time.
            try:
                chief.process.wait(timeout=CHIEF_NOTICE_SECS)
            except subprocess.TimeoutExpired:
                pass
            if chief.process.returncode not in (None, 0):
                return chief.process.returncode
            if chief.process.returncode is None:
                self.say(f"{chief.name} did not stop by itself within {CHIEF_NOTICE_SECS:.0f} s "
                         f"of losing {task.name}: stopping the job")
        self._ended_by = task.name  # the attempt's exit code is this task's, not the chief's
        return code if code else 1

    def _wait_for_the_rest(self, chief):
        """After the chief: servers stop by themselves once it is gone (kerastrain.distribute.cluster.serve).

        On hosts of their own (multihost) a finished chief's host vanishes with it, which a
        server cannot tell from a partition and waits out: the launcher, which saw the chief
        succeed, stops the parameter-server job's servers itself (just after this).
        """
        servers = ("worker", "ps") if self.hosts is not None and self.hosts.vanish_with_task \
            and self.parameter_servers else ()
        deadline = time.monotonic() + GRACE_SECS
        while time.monotonic() < deadline:
            # The evaluator too: it evaluates the last checkpoint, then sees the chief gone.
            # tf.data service servers serve until stopped (just after this).
            # A worker started again late may never have seen the chief it watches for: it
            # holds nothing, and is stopped with the servers.
            if all(t.process.poll() is not None for t in self.tasks
                   if not t.type.startswith("data_") and t.type not in servers
                   and not t.late):
                return
            time.sleep(self.poll_secs)
        self.say(f"{chief.name} finished; tasks still running after {GRACE_SECS:.0f} s are "
                 "stopped")

    # -- the job --------------------------------------------------------------------------

    def run(self) -> int:
        """Run the job, restarting it while `max_restarts` allows; the exit code.

        SIGINT (Ctrl-C) or SIGTERM at any moment stops every task and returns 128 + the
        signal's number (130 for Ctrl-C).
        """
        own = self.interrupts is None
        self.interrupts = (self.interrupts or Interrupts().__enter__()).watch()
        attempt, started = 0, False
        faults = faults_lib.Faults(self.faults, tasks=self.tasks, say=self.say, hosts=self.hosts,
                                   model_dir=self.model_dir, elastic=self.elastic)
        try:
            while True:
                # The fault plan's clock starts once the first attempt's tasks have.
                code = self.run_once(on_started=None if started else faults.__enter__)
                started = True
                if code == 0:
                    self.say(f"job finished: {chief_of(self.tasks).name} exited with 0")
                    return 0
                verdict = "restart" if self.elastic is None else self.elastic.after(
                    self, code, self.exits, attempt >= self.max_restarts)
                if verdict == "stop":
                    return elastic_lib.BELOW_MIN
                if verdict == "resized":
                    continue
                if attempt >= self.max_restarts:
                    self.say(f"job failed: {self._ended_by or chief_of(self.tasks).name} "
                             "exited with "
                             f"{_describe(code)}" + (f" after {attempt} restart(s)"
                                                     if attempt else ""))
                    return code
                attempt += 1
                self.say(f"job failed ({_describe(code)}); restarting every task "
                         f"({attempt}/{self.max_restarts}): training resumes from the last "
                         "checkpoint")
        except KeyboardInterrupt:
            self.say("interrupted: stopping every task")
            self.stop_all()
            return self.interrupts.exit_code
        finally:
            faults.__exit__(None, None, None)
            if own:
                self.interrupts.__exit__(None, None, None)
                self.interrupts = None


def _tf_log_level_set_by_user():
    import kerastrain
    return kerastrain._TF_LOG_LEVEL_SET_BY_USER


def _describe(code):
    if code is not None and code < 0:
        try:
            return f"signal {signal.Signals(-code).name}"
        except ValueError:
            return f"signal {-code}"
    return f"code {code}"

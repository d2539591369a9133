"""Frozen parameter-server workers: one that answers no request is named within seconds.

TensorFlow's `ClusterCoordinator` runs a failed worker's steps again on the others and takes
the worker back at its address, but a worker that hangs (stopped by SIGSTOP, a paused VM, a
host cut off the network) fails nothing: its loop waits for ever, and so does every result
fetched after it. The stall watch (`kerastrain.loop.stalls`) ends such a job only at its
bound, 5 minutes or more under `stall_timeout="auto"`.

While a coordinator trains, a process it starts (`WorkerWatch`, running `Liveness`) asks every
worker's server for its status (`tensorflow.WorkerService/GetStatus`, an empty request its gRPC
threads answer at once, so a worker busy with a long step answers as an idle one does: steps
of 26 s on both cores, answers within 23 ms, measured 2026-11-28; no step time enters the
bound) every second, each request with a deadline. A worker whose requests all miss their deadline
for `frozen_worker_timeout` seconds (a strategy option, 30 by default) is named in one line,
once until it answers again. A refused connection is an answer (its host is up; the worker
is gone or restarting, which the coordinator handles). The line says who ends it: `kerastrain
launch` (and `--ray`) reads it and kills the task, whose loop then fails and runs on the
other workers, and starts it again; on Kubernetes the pod's liveness probe does; elsewhere
nobody, and the line says so.

TensorFlow's own error blocks about that worker that follow on the coordinator's Python
logger ("Worker /job:worker/replica:0/task:1 failed with UnavailableError ... Additional
GRPC error information") are dropped: the line has said what happened. Its C++ lines
("Failed to register function remotely ...") are written by TensorFlow to the process's
stderr directly, past any filter of this process.
"""

from __future__ import annotations

import json
import logging
import os
import re
import select
import subprocess
import sys
import threading
import time

from kerastrain._lifetime import LAUNCHER_PID

DEFAULT_SECS = 30.0  # the `ps` strategy option `frozen_worker_timeout`'s default
ASK_EVERY = 1.0      # seconds between two status requests to one worker
ASK_WAIT = 5.0       # a request's deadline
QUIET_AFTER = 60.0   # TensorFlow's lines about a named worker dropped this long after it answers

# A coordinator's lines that name workers answering no request, read by `kerastrain launch`
# (which ends them): this module's, and the stall watch's (`stalls.StallWatch`).
STUCK = re.compile(r"kerastrain: (?:stalled: .* waits on )?((?:worker:\d+)(?:, worker:\d+)*),? "
                   r"(?:which answer|answered nothing for)")

HEARTBEAT = "KERASTRAIN_HEARTBEAT"  # set in exported Kubernetes jobs (`stalls.start_heartbeat`)


def who_restarts(environ=None) -> tuple[bool, str]:
    """What ends a frozen worker of this job, so that its loop runs elsewhere: (at once?,
    in words)."""
    environ = os.environ if environ is None else environ
    if environ.get(LAUNCHER_PID):
        return True, "kerastrain launch ends it and starts it again"
    if environ.get(HEARTBEAT):
        # Its heartbeat file is stale after 60 s; 3 failed probes 30 s apart (`manifests`).
        return False, ("its pod's liveness probe ends it and Kubernetes starts it again "
                       "(within about 150 s of the freeze)")
    return False, ("nothing here can end it: end its process (or host) and start it again; "
                   "until then its loop waits")


class Liveness:
    """While active, names the workers that answer no request for `timeout` seconds (in
    the process `WorkerWatch` starts: `main`).

    Args:
        workers: `{"worker:i": "host:port"}` (TF_CONFIG's workers).
        timeout: seconds a worker may answer nothing; None: a watch that does nothing.
        out: where the line goes (stderr): it is read by `kerastrain launch`, whatever the
            user did to logging.
        ask: `(name, address, done)`: send one status request, call `done(answered)` when it
            ends, within `wait` seconds (tests pass their own; by default gRPC, `GrpcAsk`).
        clock: `time.monotonic`, or a test's.
        environ: where `who_restarts` looks (os.environ).
        events: where `named NAME` and `back NAME` lines go, for the coordinator's filter
            of TensorFlow's lines (`WorkerWatch`), or None.
    """

    def __init__(self, workers, timeout=DEFAULT_SECS, *, out=None, ask=None,
                 clock=time.monotonic, environ=None, wait=ASK_WAIT, events=None):
        self.workers = dict(workers)
        self.timeout = timeout
        self.wait = wait  # a request's deadline
        self._out = out
        self._ask = ask
        self._clock = clock
        self._environ = environ
        self._lock = threading.Lock()
        self._ok = {}          # name -> when the newest request it answered was sent
        self._missed = {}      # name -> when the newest request it missed was sent
        self._named = {}       # name -> when it was named (until it answers again)
        self._events = events
        self._done = threading.Event()
        self._thread = None

    @property
    def active(self) -> bool:
        return bool(self.timeout and self.workers)

    def __enter__(self):
        if not self.active:
            return self
        if self._ask is None:
            self._ask = GrpcAsk(self.wait)
        now = self._clock()
        self._ok = {name: now for name in self.workers}   # as if each had just answered
        self._missed = {}
        self._done.clear()
        self._thread = threading.Thread(target=self._run, name="kerastrain-liveness",
                                        daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc):
        if self._thread is not None:
            self._done.set()
            self._thread.join(timeout=5)
            self._thread = None
            close = getattr(self._ask, "close", None)
            if close is not None:
                close()
        return False

    def _run(self):
        while not self._done.wait(ASK_EVERY):
            self.ask_all()
            self.check(self._clock())

    def ask_all(self):
        """One status request to every worker."""
        for name, address in self.workers.items():
            sent = self._clock()
            self._ask(name, address, lambda answered, name=name, sent=sent:
                      self.heard(name, answered, sent))

    def heard(self, name, answered, sent):
        """A request sent at `sent` ended: answered (or refused), or past its deadline.

        Silence is counted from the newest answered request's sending to the newest missed
        deadline: only requests that were sent and missed count, so a thread of this
        process kept from running (TensorFlow holding the GIL) makes no worker look silent.
        """
        with self._lock:
            if answered:
                self._ok[name] = max(self._ok[name], sent)
            else:
                self._missed[name] = max(self._missed.get(name, sent), sent)

    def silence(self, name) -> float:
        """Seconds `name` has answered nothing, as its missed requests tell."""
        missed = self._missed.get(name)
        if missed is None or missed <= self._ok[name]:
            return 0.0
        return missed + self.wait - self._ok[name]

    def check(self, now) -> list[str]:
        """Name the workers silent for `timeout` s (once until they answer); their names."""
        named, back, silent = [], [], 0.0
        with self._lock:
            for name in self.workers:
                since = self._named.get(name)
                if since is not None:
                    if self._ok[name] > since:   # back (restarted, or thawed)
                        del self._named[name]
                        back.append(name)
                    continue
                if self.silence(name) >= self.timeout:
                    self._named[name] = now
                    named.append(name)
                    silent = max(silent, self.silence(name))
            others = [n for n in self.workers if n not in self._named]
        if named:
            self._say(self._out or sys.stderr, self.line(named, silent, others))
        for word, names in (("named", named), ("back", back)):
            for name in names:
                if self._events is not None:
                    self._say(self._events, f"{word} {name}")
        return named

    def line(self, named, silent, others) -> str:
        # Its loop moves once it is ended (its connection breaks), not when it is named.
        at_once, who = who_restarts(self._environ)
        on = ", ".join(others) if len(others) <= 3 else f"the {len(others)} other workers"
        where = ("no other worker answers: training waits for one" if not others else
                 f"its steps now run on {on}" if at_once else
                 f"its steps run on {on} once it is ended")
        return (f"kerastrain: {', '.join(named)} answered nothing for {silent:.0f} s (frozen?): "
                f"{where}; {who} (frozen_worker_timeout={self.timeout:g})")

    @staticmethod
    def _say(out, line):
        try:
            out.write(line + "\n")
            out.flush()
        except (OSError, ValueError):
            pass


class WorkerWatch:
    """While active, a process of its own watches the workers (`Liveness`), and TensorFlow's
    Python lines about a worker it named are dropped here.

    A process, not a thread: TensorFlow registers each new function with every worker
    while holding the GIL (`TFE_ContextAddFunction`), and that call waits for ever on a
    frozen worker (seen: a freeze while the first loops were traced); no thread of this
    process could then run, nor say anything. The watcher writes its line to this process's
    stderr, which it shares, and ends when this process does (its stdin closes, or its parent
    changes).

    Args:
        workers: `{"worker:i": "host:port"}`; none: a watch that does nothing.
        timeout: `frozen_worker_timeout`; None: a watch that does nothing.
    """

    def __init__(self, workers, timeout=DEFAULT_SECS, *, clock=time.monotonic):
        self.workers = dict(workers)
        self.timeout = timeout
        self._clock = clock
        self._lock = threading.Lock()
        self._quiet = {}       # name -> until when TensorFlow's lines about it are dropped
        self._filter = _DropLinesAbout(self)
        self._process = None
        self._reader = None

    @property
    def active(self) -> bool:
        return bool(self.timeout and self.workers)

    def __enter__(self):
        if not self.active:
            return self
        # A short bound gets a shorter deadline, or the first miss alone would outlast it.
        job = json.dumps({"workers": self.workers, "timeout": self.timeout,
                          "wait": min(ASK_WAIT, self.timeout / 3), "parent": os.getpid()})
        # This kerastrain, wherever it was imported from (a checkout, an install).
        package = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        path = os.pathsep.join(p for p in (package, os.environ.get("PYTHONPATH")) if p)
        self._process = subprocess.Popen(
            [sys.executable, "-m", "kerastrain.loop.ps.liveness", job], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, text=True, env=dict(os.environ, PYTHONPATH=path))
        self._reader = threading.Thread(target=self._read, args=(self._process.stdout,),
                                        name="kerastrain-liveness", daemon=True)
        self._reader.start()
        logging.getLogger("tensorflow").addFilter(self._filter)
        return self

    def __exit__(self, *exc):
        if self._process is not None:
            logging.getLogger("tensorflow").removeFilter(self._filter)
            self._process.stdin.close()   # it ends when its stdin does
            try:
                self._process.wait(5)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
            self._reader.join(timeout=5)
            self._process = None
        return False

    def _read(self, stream):
        for line in stream:
            self.event(line.strip())
        stream.close()

    def event(self, line, now=None):
        """`named NAME`: drop TensorFlow's lines about it; `back NAME`: a minute more."""
        word, _, name = line.partition(" ")
        now = self._clock() if now is None else now
        with self._lock:
            if word == "named":
                self._quiet[name] = float("inf")
            elif word == "back":
                self._quiet[name] = now + QUIET_AFTER

    def quiet_about(self, text, now=None) -> bool:
        """Whether `text` (a TensorFlow log record) is about a worker named frozen lately."""
        now = self._clock() if now is None else now
        with self._lock:
            names = [n for n, until in self._quiet.items() if now <= until]
        return any(_mentions(text, name, self.workers[name]) for name in names)


def _mentions(text, name, address) -> bool:
    index = name.split(":")[1]
    return f"/job:worker/replica:0/task:{index}" in text or (
        f"/job:worker/task:{index}" in text) or address in text


class _DropLinesAbout(logging.Filter):
    """Drops TensorFlow's Python log records about workers a `WorkerWatch` saw named."""

    def __init__(self, watch):
        super().__init__()
        self.watch = watch

    def filter(self, record):
        try:
            return not self.watch.quiet_about(record.getMessage())
        except Exception:  # a record that cannot be formatted is TensorFlow's to report
            return True


class GrpcAsk:
    """Status requests over gRPC, one channel per worker kept open (a partitioned host's
    requests then wait on the open connection, not on a new one that fails at once).

    Through grpcio (a TensorFlow dependency), not TensorFlow: TensorFlow's eager calls to a
    remote device hold the GIL while they wait (`stalls.unanswering_workers`)."""

    def __init__(self, wait=ASK_WAIT):
        import grpc
        self._grpc = grpc
        self.wait = wait
        self._calls = {}

    def __call__(self, name, address, done):
        call = self._calls.get(address)
        if call is None:
            channel = self._grpc.insecure_channel(address)
            call = self._calls[address] = (
                channel, channel.unary_unary("/tensorflow.WorkerService/GetStatus"))
        future = call[1].future(b"", timeout=self.wait)
        future.add_done_callback(lambda f: done(self.answered(f)))

    def answered(self, future) -> bool:
        """Anything but a missed deadline: an answer, or an error from a host that is up."""
        try:
            error = future.exception()
        except self._grpc.FutureCancelledError:  # the watch closed its channels
            return True
        return error is None or error.code() != self._grpc.StatusCode.DEADLINE_EXCEEDED

    def close(self):
        for channel, _ in self._calls.values():
            channel.close()
        self._calls = {}


def main(argv=None):
    """The watcher process: `python -m kerastrain.loop.ps.liveness JOB` (`WorkerWatch`)."""
    job = json.loads((argv or sys.argv)[1])
    watch = Liveness(job["workers"], job["timeout"], out=sys.stderr, events=sys.stdout,
                     wait=job["wait"])
    parent = job["parent"]   # not its getppid() now: the parent may be gone already
    with watch:
        # Until the coordinator closes stdin, or ends: a process it forked (a data loader)
        # may hold stdin open after it, so the parent's death counts too.
        while os.getppid() == parent:
            ready, _, _ = select.select([sys.stdin], [], [], 1.0)
            if ready and not sys.stdin.readline():
                return


if __name__ == "__main__":
    main()

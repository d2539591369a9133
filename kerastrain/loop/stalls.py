"""A task that stops making progress ends, loudly, instead of hanging.

A frozen or partitioned peer, a lost parameter server or a deadlock leaves the other tasks
waiting for ever: in a collective (multi-worker mirrored), in a `join` of the coordinator
(parameter servers), in an input pipeline. TensorFlow offers no bound for most of these. While
`fit` trains, a thread of each task watches its progress: every compiled loop that returns
(training, and validation's), and the end of the actions after it (checkpoint, callbacks), is
a beat. When no beat comes
within the bound, the task writes one line saying who stalled and for how long, then every
thread's Python stack (`faulthandler`), and exits with `STALLED` (75, EX_TEMPFAIL: try
again). Should the blocked call hold the GIL, so that the thread cannot run, faulthandler's own
watchdog (a C thread; re-armed at every beat) dumps the stacks and exits 30 s after the bound.
Checkpoints are whole files (written by rename), so none is damaged; `kerastrain launch
--max-restarts N` restarts the job and it resumes from the last one.

The bound: before the first loop returns (tracing, compiling), at least 10 minutes. Then
`stall_timeout` seconds when given; with `"auto"` (which watches only multi-worker mirrored and
parameter-server training: a process alone has no peer to wait for), the larger of 5 minutes
and 20
times the longest gap between beats seen so far, and, until a loop has been measured without its
tracing, the larger of 10 minutes and 20 times the first (tracing, compiling, a first collective
that waits for every task to start).
"""

from __future__ import annotations

import contextlib
import faulthandler
import logging
import os
import sys
import threading
import time


logger = logging.getLogger("kerastrain")

STALLED = 75  # EX_TEMPFAIL: the job may succeed when run again
FLOOR_SECS = 300.0
FACTOR = 20.0
FIRST_SECS = 600.0
BACKSTOP_SECS = 30.0  # after the bound: faulthandler's own exit, if this thread cannot act
PROBE_SECS = 10.0     # for a peer to answer a request, once a stall is seen
CONNECT_SECS = 1800.0  # for every task of a TF_CONFIG cluster to answer while connecting


class LostPeer(RuntimeError):
    """A worker of a multi-worker mirrored job stopped answering (`driver.lost_peer`)."""


def check(stall_timeout):
    """`"auto"`, None (off) or a positive number of seconds (as a float)."""
    from kerastrain._options import TrainerConfig, check_arguments
    check_arguments(TrainerConfig, stall_timeout=stall_timeout)
    return stall_timeout if stall_timeout in (None, "auto") else float(stall_timeout)


def task_name() -> str:
    from kerastrain.distribute import cluster
    config = cluster.read_tf_config()
    return "this process" if config is None else f"{config.task_type}:{config.task_index}"


class StallWatch:
    """While active, ends this process if `beat()` is not called within the bound.

    Args:
        timeout: `"auto"`, seconds, or None (a watch that does nothing).
        what: what the task is doing, for the line (e.g. "training under
            multi_worker_mirrored").
        exit: called with the exit code once the line and the stacks are written
            (`os._exit`; tests pass their own).
        probe: for a coordinator (parameter servers), a function returning the names of the
            peers that answer no request (`unanswering_workers`). Called once a stall is
            seen: when it names some, they are said to be stuck, in a line `kerastrain
            launch` acts on by restarting them (the coordinator then runs their steps on
            the others), and the watch waits one more bound before it ends this process.
    """

    def __init__(self, timeout="auto", what="training", exit=os._exit, out=None, probe=None,
                 floor=None):
        self.timeout = timeout
        self.floor = floor  # the bound is at least this, beats or not (`connecting`)
        self.what = what
        self._exit = exit
        self._probe = probe
        self._probed = False
        self._out = out
        self._last = None
        self._longest = self._first = 0.0
        self._beats = 0
        self._done = threading.Event()
        self._thread = None

    def bound(self) -> float:
        if self.floor is not None:  # a watch over one long wait (connecting)
            return max(self.floor, 0.0 if self.timeout == "auto" else self.timeout)
        if not self._beats:  # tracing and compiling the first loop is not a stall
            return max(FIRST_SECS, 0.0 if self.timeout == "auto" else self.timeout)
        if self.timeout != "auto":
            return self.timeout
        if self._beats < 2:  # no loop measured without its tracing yet
            return max(FIRST_SECS, FACTOR * self._first)
        return max(FLOOR_SECS, FACTOR * self._longest)

    def _arm_backstop(self):
        # A thread needs the GIL to act, and a C call blocked on a peer may hold it: the
        # interpreter's own watchdog (a C thread) dumps the stacks and exits anyway, later.
        if self.timeout is not None and self._exit is os._exit:
            faulthandler.dump_traceback_later(self.bound() + BACKSTOP_SECS, exit=True,
                                              file=self._out or sys.stderr)

    def beat(self):
        self._beat()
        self._arm_backstop()

    def _beat(self):
        self._probed = False
        now = time.monotonic()
        gap = now - self._last
        if self._beats:
            self._longest = max(self._longest, gap)
        else:
            self._first = gap  # the first loop, with its tracing and compiling
        self._last = now
        self._beats += 1

    def __enter__(self):
        self._last = time.monotonic()
        if self.timeout is None:
            return self
        self._done.clear()
        self._thread = threading.Thread(target=self._watch, name="kerastrain-stall",
                                        daemon=True)
        self._thread.start()
        self._arm_backstop()
        return self

    def __exit__(self, *exc):
        if self._thread is not None:
            if self._exit is os._exit:
                faulthandler.cancel_dump_traceback_later()
            self._done.set()
            self._thread.join(timeout=5)
            self._thread = None
        return False

    def _watch(self):
        while not self._done.wait(min(5.0, self.bound() / 10)):
            quiet = time.monotonic() - self._last
            if quiet > self.bound():
                if self._probe is not None and not self._probed and self._stuck_peers(quiet):
                    continue
                self._stalled(quiet)
                return

    def _stuck_peers(self, quiet) -> bool:
        """Name the peers that answer no request; True when some do (one more bound)."""
        self._probed = True
        stuck = self._probe()
        if not stuck:
            return False
        self._last = time.monotonic()  # a bound for them to be restarted and steps to move on
        self._say(f"kerastrain: stalled: {task_name()} made no progress {self.what} for "
                  f"{quiet:.0f} s and waits on {', '.join(stuck)}, which answer(s) no request "
                  f"(asked for {PROBE_SECS:.0f} s): frozen, partitioned or deadlocked. Restart "
                  "it: its steps then run on the other workers (kerastrain launch does so; on "
                  "Kubernetes, its liveness probe). Training ends as stalled if it still "
                  f"makes no progress within {self.bound():.0f} s.")
        return True

    def _say(self, line):
        out = self._out or sys.stderr
        try:
            out.write(line + "\n")
            out.flush()
        except (OSError, ValueError):
            pass

    def _stalled(self, quiet):
        out = self._out or sys.stderr
        how = (f"the larger of {self.floor:.0f} s and stall_timeout, while connecting"
               if self.floor is not None else
               "before the first loop returned" if not self._beats else
               "set by stall_timeout" if self.timeout != "auto" else
               "stall_timeout='auto', before a loop was measured" if self._beats < 2 else
               f"stall_timeout='auto': the larger of {FLOOR_SECS:.0f} s and {FACTOR:.0f} x the "
               f"slowest loop so far, {self._longest:.1f} s")
        line = (f"kerastrain: stalled: {task_name()} made no progress {self.what} for "
                f"{quiet:.0f} s (bound {self.bound():.0f} s, {how}): a peer may be frozen, "
                "partitioned or gone, or this process is deadlocked. Its Python stacks follow; "
                f"its checkpoints are intact. Exiting with {STALLED} (stalled); `kerastrain "
                "launch --max-restarts N` restarts the job from the last checkpoint.")
        self._say(line)
        try:
            faulthandler.dump_traceback(file=out, all_threads=True)
            out.flush()
        except (OSError, ValueError):
            pass
        self._exit(STALLED)


class Beats:
    """Where a Trainer's loops say they made progress: the `StallWatch` of the fit that runs.

    One per Trainer, handed when they are made to what runs loops: a fit's epochs, whose
    watch takes the beats while they run (`to`), and the evaluation, whose loops beat
    (validation inside a fit; `evaluate` called from a callback). None of them reaches into
    another for the watch that runs.

    Attributes:
        beat: the running watch's `beat`, or None (no fit runs: nobody to tell).
    """

    def __init__(self):
        self.beat = None

    def __call__(self):
        """A beat to the watch running now, if any (what an evaluation made before the watch
        began calls, e.g. fit's validation, whose action is made before the epochs' watch)."""
        if self.beat is not None:
            self.beat()

    @contextlib.contextmanager
    def to(self, watch):
        """While the block runs, beats go to `watch`."""
        before, self.beat = self.beat, watch.beat
        try:
            yield watch
        finally:
            self.beat = before


def connecting(stall_timeout, in_cluster: bool):
    """A watch over connecting to a `TF_CONFIG` cluster, which TensorFlow waits for without
    end: a task frozen before the job starts would hang every other one. The bound is the
    larger of 30 minutes (image pulls and slow schedulers start tasks late) and
    `stall_timeout`; nothing without a cluster or with `stall_timeout=None`."""
    if not in_cluster or stall_timeout is None:
        return StallWatch(None)
    return StallWatch(stall_timeout, what="connecting to the cluster", floor=CONNECT_SECS)


def unanswering_workers(addresses, wait: float = PROBE_SECS) -> list[str]:
    """The workers (`{name: "host:port"}`) whose server does not answer a status request
    within `wait` seconds: a frozen, partitioned or deadlocked host. A busy worker answers
    (its server has threads for requests); one that refuses the connection or fails the
    request is not named (gone or restarting: the coordinator already handles it).

    The request goes through gRPC (which TensorFlow itself depends on) on a channel of its
    own, not through TensorFlow: TensorFlow's eager calls to a remote device hold the GIL
    while they wait, so a request to a frozen host that way would block every thread here.
    The request is `tensorflow.WorkerService/GetStatus` with an empty message (a valid one);
    its answer is not read, only whether it comes.
    """
    try:
        import grpc
    except ImportError:
        return []
    channels = {name: grpc.insecure_channel(address) for name, address in addresses.items()}
    try:  # every request at once: one deadline however many hosts are frozen
        asked = {name: channel.unary_unary("/tensorflow.WorkerService/GetStatus").future(
            b"", timeout=wait) for name, channel in channels.items()}
        return [name for name, answer in asked.items()
                if answer.exception() is not None
                and answer.exception().code() == grpc.StatusCode.DEADLINE_EXCEEDED]
    finally:
        for channel in channels.values():
            channel.close()


def cluster_workers() -> dict:
    """`{"worker:i": "host:port"}` of TF_CONFIG's workers ({} without TF_CONFIG)."""
    from kerastrain.distribute import cluster
    config = cluster.read_tf_config()
    if config is None:
        return {}
    return {f"worker:{i}": address
            for i, address in enumerate(config.cluster.get("worker", []))}


def start_heartbeat(path, every=10.0):
    """Touch `path` every `every` seconds from a daemon thread, for a liveness probe (an
    exported Kubernetes job sets KERASTRAIN_HEARTBEAT): a frozen process stops touching it.
    Nothing without a path."""
    if not path:
        return None

    def touch():
        while True:
            try:
                with open(path, "a"):
                    os.utime(path)
            except OSError:
                pass
            time.sleep(every)

    thread = threading.Thread(target=touch, name="kerastrain-heartbeat", daemon=True)
    thread.start()
    return thread

"""A worker that died: TensorFlow's gRPC errors about it, told in one line of the launcher's.

While a ps worker is down, the coordinator (the chief) prints a block of TensorFlow's gRPC
errors for every call it tries there ("Failed to register function remotely ... Connection
refused", "Additional GRPC error information from remote target ...", "ERROR:tensorflow:
Worker ... failed with UnavailableError"), dozens a second, and goes on with the other
workers; a multi-worker task prints a few ("Aborting RingReduce ...") before kerastrain's own
line says it lost a worker. The launcher, which knows the worker died, holds back the blocks
that name it and says once it is back (or the attempt ended) what happened:

    [launch] worker:1 (pid 123) was unreachable for 2.1 s while it restarted; its steps ran
    on worker:0 (38 lines of TensorFlow's gRPC errors about it on chief:0 held back;
    `kerastrain launch -v` shows them)

A block naming a worker that is alive (a partition, a frozen host) is passed on as it is:
only what the line says is held back. Pure Python, no TensorFlow.
"""

from __future__ import annotations

import dataclasses
import json
import re
import time

# The first line of a block: TensorFlow's C++ error lines, and the coordinator's own.
_HEADER = re.compile(r"^(?:[EW]\d{4} [\d:.]+ +\d+ \S+\.cc:\d+\] |ERROR:tensorflow:)")
# Its continuation lines, as TensorFlow's gRPC layer and the coordinator write them.
_CONTINUATION = re.compile(
    r"^(?:Additional GRPC error information from remote target |:\w+:Error received from peer"
    r"|This could happen if the remote target has been disconnected|It is treated as a "
    r"transient connectivity failure|This derived error is ignored and not reported"
    # TensorFlow's coordination service: "... are unhealthy (stopped sending heartbeats):",
    # then each task's name on a line, then what it makes of it.
    r"|/job:\w+/replica:\d+/task:\d+$|The tasks have crashed\."
    # The context a status carries: the graph node (`\t [[{{node while/...}}]]`), the task
    # an error came from (`From /job:ps/replica:0/task:0:`), the eager op.
    r"|\s+\[\[\{\{(?:function_)?node |From /job:\w+/replica:\d+/task:\d+:$|\[Op:"
    r"|Encountered when executing an operation using EagerExecutor)")
_TASK_PATH = re.compile(r"/job:(worker)(?:/replica:\d+)?/task:(\d+)")
_ADDRESS = re.compile(r"(?:ipv[46]:)?([\w.-]+:\d+)\b")
# A header naming no worker that the next line may name ("Aborting RingReduce with
# UNAVAILABLE: ...", then "Additional GRPC error information from remote target /job:...").
_UNNAMED = re.compile(r"UNAVAILABLE|Socket closed|Connection reset|Connection refused")
_SERVING = re.compile(r"kerastrain: serving (worker:\d+) on port")
_PASSED = object()   # `Outages._holding`'s mark of a block that passes on (its worker is up)
DECIDE_SECS = 1.0   # how long a block naming a live worker waits for the launcher to see it die
# After a worker is back the chief's channel to it may still be backing off, and its errors go
# on for a while: an outage is said once its worker is back and they stopped for this long.
QUIET_SECS = 3.0


@dataclasses.dataclass
class Outage:
    """One worker's time away: from its death (as first seen) to its `serving` line."""
    task: str
    pid: int
    since: float
    restarting: bool = False   # a ps worker the launcher restarts (else: the job stops)
    while_: str = "while it restarted"   # what it was doing meanwhile, for the line
    lines: int = 0
    sources: set = dataclasses.field(default_factory=set)   # the tasks whose lines were held
    back: float | None = None   # when its worker served again
    others: list = dataclasses.field(default_factory=list)   # the workers up as it went down
    last: float = 0.0           # when a line about it was last held


class Outages:
    """Holds the chief's gRPC error blocks about restarting ps workers; says each outage once.

    Args:
        tasks: the job's tasks (`tasks.Task`); their `process` is read to tell a dead worker
            from a live one.
        say: the launcher's `say(text)`.
        clock: the time, in seconds (tests pass their own).
    """

    def __init__(self, tasks, say, clock=time.monotonic, ips=None):
        self.tasks = {t.name: t for t in tasks}
        self.say = say
        self.clock = clock
        self.ips = ips
        self.open = {}        # worker name -> its Outage, until it serves again
        self._holding = {}    # task name -> the Outage whose block it is printing, if held
        self._live = {}       # worker name -> the pid found alive after a block named it
        self._pending = {}    # task name -> a header line waiting for its next line
        self._by_address = {}  # "host:port" (and "ip:port", "127.0.0.1:port") -> task name
        for task in tasks:
            cluster = json.loads(task.tf_config).get("cluster", {}) if task.tf_config else {}
            if task.index < len(cluster.get(task.type, ())):
                host, port = cluster[task.type][task.index].rsplit(":", 1)
                for name in (host, (ips or {}).get(host), "127.0.0.1" if host == "localhost"
                             else None):
                    if name:
                        self._by_address[f"{name}:{port}"] = task.name

    def went_down(self, task, restarting=False, while_=None):
        """`task` exited (`restarting`: a ps worker the launcher restarts; `while_`: "while
        its host was removed", for an elastic job's)."""
        if task.name in self.open and self.open[task.name].back is not None:
            self._say_back(self.open.pop(task.name))   # back, and gone again
        if task.name not in self.open:
            away = {o.task for o in self.open.values() if o.back is None}
            self.open[task.name] = Outage(task.name, task.process.pid, self.clock(), others=[
                t.name for t in self.tasks.values() if t.type == "worker" and t is not task
                and t.name not in away and t.process is not None and t.process.poll() is None])
        outage = self.open[task.name]
        outage.restarting = outage.restarting or restarting
        outage.while_ = while_ or outage.while_

    def feed(self, source, line) -> list:
        """The lines of task `source` to print now, given its next `line` (the others are
        held, counted in an outage). A gRPC error header that names no worker waits for the
        next line, which may name one (`flush` at the end of the stream)."""
        pending = self._pending.pop(source, None)
        if pending is not None:
            outage = self._outage_named(line) if _CONTINUATION.match(line) else None
            if outage is not None:
                self._hold(source, outage, 1)
                return [] if self._passes(source, line) is False else [line]
            return [pending] + self.feed(source, line)
        if _HEADER.match(line) and _UNNAMED.search(line) and not self._names(line):
            self._pending[source] = line
            return []
        return [line] if self._passes(source, line) else []

    def flush(self, source) -> list:
        """What `feed` still holds of `source`'s lines at the end of its output."""
        pending = self._pending.pop(source, None)
        return [pending] if pending is not None else []

    def _hold(self, source, outage, lines):
        outage.last = self.clock()
        outage.lines += lines
        outage.sources.add(source)
        self._holding[source] = outage

    def _passes(self, source, line) -> bool:
        holding = self._holding.get(source)
        continuation = _CONTINUATION.match(line)
        if continuation and holding is _PASSED:   # a block about a live worker: whole
            return True
        if continuation and holding is not None:
            holding.lines += 1
            return False
        if not continuation:
            self._holding.pop(source, None)
            if not _HEADER.match(line):
                return True
        # A header, or a block's line after a line of no block: held if it names a dead worker.
        outage = self._outage_named(line)
        if outage is None:
            if not continuation:
                self._holding[source] = _PASSED
            return True
        self._hold(source, outage, 1)
        return False

    def _names(self, line) -> set:
        named = {f"{m.group(1)}:{m.group(2)}" for m in _TASK_PATH.finditer(line)}
        return named | {self._by_address[m.group(1)] for m in _ADDRESS.finditer(line)
                        if m.group(1) in self._by_address}

    def _outage_named(self, line):
        """The outage of the worker `line` names, if that worker is down (waiting up to
        `DECIDE_SECS` for a dying one: the chief hears of a death before the launcher)."""
        for name in sorted(n for n in self._names(line) if n.startswith("worker:")):
            if name in self.open:
                return self.open[name]
            task = self.tasks.get(name)
            if task is None or task.process is None:
                continue
            if self._live.get(name) != task.process.pid:  # not yet seen alive after a block
                deadline = time.monotonic() + DECIDE_SECS   # real time: a real wait
                while task.process.poll() is None and time.monotonic() < deadline:
                    time.sleep(0.05)
            if task.process.poll() is None:
                self._live[name] = task.process.pid
            else:
                self.went_down(task)
                return self.open[name]
        return None

    def heard(self, task, line):
        """A line of `task`'s: a restarted worker's `serving` line ends its outage."""
        match = _SERVING.search(line)
        outage = self.open.get(match.group(1)) if match else None
        if outage is None or task.process is None or task.process.pid == outage.pid:
            return
        outage.back = self.clock()

    def tick(self):
        """Called every poll: say the outages whose worker is back and whose errors stopped."""
        now = self.clock()
        for outage in [o for o in self.open.values() if o.back is not None
                       and now - max(o.back, o.last) >= QUIET_SECS]:
            self._say_back(self.open.pop(outage.task))

    def _say_back(self, outage):
        self.say(self._line(outage, f"was unreachable for {outage.back - outage.since:.1f} s "
                                    f"{outage.while_}"))

    def at_end(self, ended):
        """The attempt is over (`ended`: "chief:0 exited"): open outages said as they stand."""
        for outage in list(self.open.values()):
            if outage.back is not None:
                self._say_back(outage)
            elif outage.restarting:
                away = self.clock() - outage.since
                self.say(self._line(outage, f"was still restarting ({away:.1f} s) when {ended}"))
            elif outage.lines:
                self.say(f"{outage.task} (pid {outage.pid}) exited:{self._held(outage)}")
        self.open.clear()
        self._holding.clear()
        self._pending.clear()

    def _line(self, outage, what):
        # The workers up as it went down, but those that went down while it was away.
        away = {o.task for o in self.open.values() if o.since > outage.since}
        others = [name for name in outage.others if name not in away]
        ran = f"its steps ran on {', '.join(others)}" if others else \
            "no other worker was up: the chief waited for it"
        return f"{outage.task} (pid {outage.pid}) {what}; {ran}" + (
            f" ({self._held(outage).strip()})" if outage.lines else "")

    @staticmethod
    def _held(outage):
        return (f" {outage.lines} line(s) of TensorFlow's gRPC errors about it on "
                f"{', '.join(sorted(outage.sources))} held back; `kerastrain launch -v` shows "
                "them")

"""A parameter-server worker that answers no request is named within seconds
(`kerastrain.loop.ps.liveness`); the job on real processes is in tests/cli/test_clusters.py."""

import contextlib
import io
import logging
import socket
import threading
import time
from concurrent import futures

import grpc
import pytest

from kerastrain.cli import launch
from kerastrain.loop.ps import liveness

WORKERS = {"worker:0": "127.0.0.1:1000", "worker:1": "127.0.0.1:1001"}


def _watch(timeout=30.0, environ=None):
    out = io.StringIO()
    watch = liveness.Liveness(WORKERS, timeout, out=out, ask=lambda *a: None, clock=lambda: 0.0,
                              environ=environ or {"KERASTRAIN_LAUNCHER_PID": "1"}, wait=5.0,
                              events=io.StringIO())
    watch._ok = {name: 0.0 for name in WORKERS}   # as `__enter__` starts it, at time 0
    return watch, out


def _second(watch, t, *, frozen=("worker:1",)):
    """One request to each worker sent at `t`: the frozen ones miss it, the others answer."""
    for name in WORKERS:
        watch.heard(name, name not in frozen, t)


def test_a_silent_worker_is_named_once_at_the_bound_in_one_line_until_it_answers_again():
    watch, out = _watch()
    for t in range(0, 25):
        _second(watch, float(t))
        assert watch.check(t + 5.0) == [], t   # 5 s: the request's deadline
    _second(watch, 25.0)  # its deadline passes at 30 s: 30 s without an answer
    assert watch.check(30.0) == ["worker:1"]
    assert out.getvalue() == (
        "kerastrain: worker:1 answered nothing for 30 s (frozen?): its steps now run on "
        "worker:0; kerastrain launch ends it and starts it again (frozen_worker_timeout=30)\n")
    assert liveness.STUCK.search(out.getvalue()).group(1) == "worker:1"
    for t in range(26, 40):
        _second(watch, float(t))
        assert watch.check(t + 5.0) == []   # said once
    _second(watch, 41.0, frozen=())   # restarted: it answers
    assert watch.check(46.0) == []
    for t in range(42, 73):
        _second(watch, float(t))
    assert watch.check(77.0) == ["worker:1"]   # frozen again: named again
    assert out.getvalue().count("answered nothing") == 2


def test_a_slow_or_refusing_worker_and_a_starved_watch_name_nobody():
    """Any answer within the deadline counts, however slow; a refused connection is an
    answer (the worker is gone or restarting: the coordinator handles that). A watch whose
    thread could not run for a minute (TensorFlow holding the GIL) sent nothing, so nothing
    missed: only requests sent and missed make silence."""
    watch, out = _watch(timeout=10.0)
    for t in range(0, 60):
        watch.heard("worker:0", True, float(t))     # answers (the asker says how late)
        watch.heard("worker:1", True, float(t))     # "Connection refused"
        assert watch.check(t + 5.0) == []
    assert watch.check(130.0) == []   # nothing sent from 60 s to 130 s
    _second(watch, 130.0, frozen=())
    assert watch.check(135.0) == [] and out.getvalue() == ""


def test_the_line_says_who_restarts_the_worker_and_when_no_other_is_left():
    watch, _ = _watch(environ={"KERASTRAIN_HEARTBEAT": "/tmp/alive"})
    assert watch.line(["worker:1"], 31, ["worker:0"]).endswith(
        "its steps run on worker:0 once it is ended; its pod's liveness probe ends it and "
        "Kubernetes starts it again (within about 150 s of the freeze) "
        "(frozen_worker_timeout=30)")
    alone, _ = _watch(environ={"X": "1"})
    line = alone.line(["worker:0", "worker:1"], 30, [])
    assert line.startswith("kerastrain: worker:0, worker:1 answered nothing for 30 s (frozen?): "
                           "no other worker answers: training waits for one; nothing here can "
                           "end it: end its process (or host) and start it again")
    assert liveness.STUCK.search(line).group(1) == "worker:0, worker:1"
    many = alone.line(["worker:7"], 30, [f"worker:{i}" for i in range(7)])
    assert "its steps run on the 7 other workers once it is ended;" in many


def test_launch_reads_both_lines_that_name_stuck_workers():
    stalled = ("kerastrain: stalled: chief:0 made no progress training under ps for 21 s and "
               "waits on worker:1, worker:2, which answer(s) no request (asked for 10 s)")
    assert launch._STUCK.search(stalled).group(1) == "worker:1, worker:2"
    assert launch._STUCK.search("[chief:0] kerastrain: worker:3 answered nothing for 30 s "
                                "(frozen?): ...").group(1) == "worker:3"
    assert not launch._STUCK.search("kerastrain: worker:1 exited with code 0")


def test_tensorflows_lines_about_the_named_worker_are_dropped_and_others_kept():
    """The watcher process says `named worker:1`, then `back worker:1`; the coordinator
    drops TensorFlow's records about worker:1 until a minute after it is back."""
    watch, _ = _watch(timeout=10.0)
    for t in range(0, 6):
        _second(watch, float(t))
    assert watch.check(10.0) == ["worker:1"]
    _second(watch, 20.0, frozen=())
    watch.check(20.0)
    assert watch._events.getvalue() == "named worker:1\nback worker:1\n"
    coordinator = liveness.WorkerWatch(WORKERS, 10.0)
    about_1 = ("Worker /job:worker/replica:0/task:1 failed with UnavailableError():recvmsg:"
               "Connection reset by peer\nAdditional GRPC error information from remote target "
               "/job:worker/replica:0/task:1 while calling /tensorflow.eager.EagerService/Enqueue")
    assert not coordinator.quiet_about(about_1, now=10.0)
    coordinator.event("named worker:1", now=10.0)
    assert coordinator.quiet_about(about_1, now=11.0)
    assert coordinator.quiet_about("failed to connect to all addresses; last error: UNKNOWN: "
                                   "ipv4:127.0.0.1:1001: Connection refused", now=11.0)
    assert not coordinator.quiet_about("Worker /job:worker/replica:0/task:0 failed", now=11.0)
    coordinator.event("back worker:1", now=20.0)   # a minute more
    assert coordinator.quiet_about(about_1, now=20.0 + liveness.QUIET_AFTER)
    assert not coordinator.quiet_about(about_1, now=21.0 + liveness.QUIET_AFTER)
    # Through the `tensorflow` logger.
    records = []
    handler = logging.Handler()
    handler.emit = records.append
    tf_logger = logging.getLogger("tensorflow")
    tf_logger.addHandler(handler)
    tf_logger.addFilter(coordinator._filter)
    try:
        coordinator.event("named worker:1")
        tf_logger.error("Worker %s failed with %r", "/job:worker/replica:0/task:1", "x")
        tf_logger.error("Worker %s failed with %r", "/job:worker/replica:0/task:0", "x")
    finally:
        tf_logger.removeFilter(coordinator._filter)
        tf_logger.removeHandler(handler)
    assert [r.getMessage() for r in records] == [
        "Worker /job:worker/replica:0/task:0 failed with 'x'"]


def test_off_or_without_workers_the_watch_starts_nothing():
    before = threading.active_count()
    for watch in (liveness.WorkerWatch(WORKERS, None), liveness.WorkerWatch({}, 30.0)):
        with watch:
            assert not watch.active and watch._process is None
    assert threading.active_count() == before


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_grpc_requests_a_stopped_server_misses_and_a_closed_port_refuses():
    """The real asker: a server whose handler hangs (as a stopped process's would) misses
    the deadline; a port nobody listens on refuses, which is an answer; an answering server
    answers. Then the watch over them, at a bound of 1.5 s, names only the hanging one."""
    hang, answer = threading.Event(), threading.Event()

    def status(request, context):
        if not answer.is_set():
            hang.wait(10)
        return b""

    server = grpc.server(futures.ThreadPoolExecutor(4))
    server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(
        "tensorflow.WorkerService", {"GetStatus": grpc.unary_unary_rpc_method_handler(
            status, request_deserializer=None, response_serializer=None)})])
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    ask = liveness.GrpcAsk(wait=0.5)
    try:
        results = {}
        done = threading.Event()

        def record(name):
            def got(answered):
                results[name] = answered
                if len(results) == 2:
                    done.set()
            return got
        ask("hanging", f"127.0.0.1:{port}", record("hanging"))
        ask("closed", f"127.0.0.1:{_free_port()}", record("closed"))
        assert done.wait(10), results
        assert results == {"hanging": False, "closed": True}
        out = io.StringIO()
        watch = liveness.Liveness({"worker:0": f"127.0.0.1:{port}",
                                   "worker:1": f"127.0.0.1:{_free_port()}"}, 1.5, out=out,
                                  environ={}, wait=0.5)
        with watch:
            deadline = time.monotonic() + 20
            while "answered nothing" not in out.getvalue() and time.monotonic() < deadline:
                time.sleep(0.1)
        assert out.getvalue().startswith("kerastrain: worker:0 answered nothing for "), \
            out.getvalue()
        assert "its steps run on worker:1 once it is ended" in out.getvalue()
    finally:
        hang.set()
        answer.set()
        ask.close()
        server.stop(0)


def test_the_watcher_process_says_the_line_on_this_processs_stderr_and_ends_with_it(tmp_path):
    """A coordinator whose threads are all blocked (TensorFlow holding the GIL) still gets
    the line: the watcher is a process of its own, writing to the stderr they share. A
    listener that never answers stands for a stopped worker."""
    import subprocess
    import sys
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)   # connections complete in the kernel; nothing is ever read
    address = f"127.0.0.1:{silent.getsockname()[1]}"
    code = ("import sys, time\n"
            "from kerastrain.loop.ps import liveness\n"
            f"with liveness.WorkerWatch({{'worker:0': '127.0.0.1:1', 'worker:1': {address!r}}}, "
            "2.0) as w:\n"
            "    time.sleep(8)\n"
            "print('quiet', w.quiet_about('/job:worker/replica:0/task:1'), flush=True)\n")
    try:
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              timeout=60, env={**__import__("os").environ,
                                               "KERASTRAIN_LAUNCHER_PID": "1"})
    finally:
        silent.close()
    assert done.returncode == 0, done.stderr
    assert done.stderr.count("answered nothing") == 1, done.stderr
    assert done.stderr.startswith("kerastrain: worker:1 answered nothing for "), done.stderr
    assert "its steps now run on worker:0; kerastrain launch ends it" in done.stderr
    assert done.stdout == "quiet True\n"


def test_the_option_is_checked_and_the_ps_mode_watches_tf_configs_workers(monkeypatch):
    """`frozen_worker_timeout`, a `ps` strategy option: seconds > 0 or null, refused with the
    value received; the parameter-server mode watches TF_CONFIG's workers with it (30 s when
    unset), the other kinds nothing."""
    import json
    import types

    from kerastrain.distribute import strategies
    from kerastrain.loop import modes

    for bad in (0, -1, "30", True, float("inf")):
        with pytest.raises(ValueError) as raised:
            strategies.normalize({"name": "ps", "frozen_worker_timeout": bad})
        assert str(raised.value) == (
            "Strategy option `frozen_worker_timeout` must be a number of seconds > 0, or null "
            f"(never). Received: frozen_worker_timeout={bad!r}")
    assert strategies.normalize({"name": "ps", "frozen_worker_timeout": None})[1] == {
        "frozen_worker_timeout": None}
    monkeypatch.setenv("TF_CONFIG", json.dumps({
        "cluster": {"chief": ["127.0.0.1:1"], "worker": ["127.0.0.1:2", "127.0.0.1:3"],
                    "ps": ["127.0.0.1:4"]}, "task": {"type": "chief", "index": 0}}))
    for options, timeout in (({}, 30.0), ({"frozen_worker_timeout": 12}, 12), (
            {"frozen_worker_timeout": None}, None)):
        watch = modes.ParameterServers(types.SimpleNamespace(options=options)).worker_watch()
        assert (watch.workers, watch.timeout) == (
            {"worker:0": "127.0.0.1:2", "worker:1": "127.0.0.1:3"}, timeout)
    assert isinstance(modes.Synchronous(None).worker_watch(), contextlib.nullcontext)


def test_the_watcher_ends_with_its_coordinator_even_when_a_fork_holds_its_stdin():
    """The coordinator killed with SIGKILL while a process it forked lives on (holding the
    watcher's stdin open): the watcher sees its parent change and ends within seconds."""
    import os
    import signal
    import subprocess
    import sys
    code = ("import os, sys, time\n"
            "from kerastrain.loop.ps import liveness\n"
            "w = liveness.WorkerWatch({'worker:0': '127.0.0.1:1'}, 30.0).__enter__()\n"
            "if os.fork() == 0:\n"
            "    time.sleep(30); os._exit(0)\n"
            "print(w._process.pid, flush=True)\n"   # once the fork holds the pipe
            "time.sleep(60)\n")
    coordinator = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                                   text=True, start_new_session=True)
    try:
        watcher = int(coordinator.stdout.readline())
        coordinator.kill()
        coordinator.wait()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                os.kill(watcher, 0)
            except ProcessLookupError:
                break
            with open(f"/proc/{watcher}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    break
            time.sleep(0.1)
        else:
            raise AssertionError("the watcher outlived its coordinator by 10 s")
    finally:
        os.killpg(coordinator.pid, signal.SIGKILL)

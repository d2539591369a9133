"""`kerastrain launch --ray`: each task of the job in a Ray actor, on whichever node Ray picks.

Ray is a place to run, not a strategy: the job is the one `kerastrain launch` runs (the same
`kerastrain run RECIPE` per task, the same `TF_CONFIG`s, the same supervision: a parameter-server
worker restarted, a synchronous job restarted from its checkpoint). What Ray adds is where the
processes live. One actor per task finds its node's address and a free port there (the
`TF_CONFIG`s are built from them), then starts the task's command as its own child in a session
of its own and hands its output back line by line; the launcher prefixes it (`[worker:1] ...`)
and signals the task through its actor.

Without an address the launcher starts a Ray cluster of its own in its private network
namespace (`kerastrain launch`'s default): Ray's services and TensorFlow's servers are then
reachable from nothing outside it. `--ray ADDRESS` joins a running cluster (`auto`, or
`host:port`), which needs `--network host`; every node must then find the recipe, its modules
and the model_dir at the same paths (a shared file system or image, as for `kerastrain export`).
Ray is an optional extra (`pip install "kerastrain[ray]"`) imported only here.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import threading
import time

POLL_SECS = 0.1   # how often a task's new output and exit are fetched from its actor


def _ray():
    try:
        import ray
    except ImportError:
        raise ImportError("`kerastrain launch --ray` needs Ray, an optional extra: pip install "
                          "'kerastrain[ray]'") from None
    return ray


# Ray's start-up lines that say nothing about a cluster started here: in a namespace with
# loopback only it cannot reach 8.8.8.8 to find its address (it is given 127.0.0.1), and
# token authentication is on by default (a cluster only this launcher can reach keeps it).
_RAY_STARTUP_NOISE = re.compile(r".*(network_util\.cc:\d+: Failed to determine local IP"
                                r"|Token authentication is enabled for this Ray cluster)")


def _quietly(start):
    """Run `start` with Ray's start-up lines on stderr held back; the others printed after."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as capture:
        os.dup2(capture.fileno(), 2)
        try:
            return start()
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            capture.seek(0)
            for line in capture.read().decode("utf-8", "replace").splitlines():
                if not _RAY_STARTUP_NOISE.match(line):
                    print(line, file=sys.stderr)


class _TaskActor:
    """Runs on a Ray node: one task's process, its output kept until fetched."""

    def __init__(self):
        self.process = None
        self.lines = []
        self.reader = None
        self.lock = threading.Lock()

    def node(self):
        import ray
        return ray.util.get_node_ip_address(), os.getpid()

    def free_port(self, host):
        from kerastrain.distribute.cluster import free_port
        return free_port(host)

    def start(self, command, env, unset, cwd):
        from kerastrain._lifetime import LAUNCHER_PID
        # The task ends with this actor (`_lifetime.die_with_launcher`), which ends with the job.
        full = {**{k: v for k, v in os.environ.items() if k not in unset}, **env,
                LAUNCHER_PID: str(os.getpid())}
        command = [sys.executable, *command[1:]]   # this node's Python, where it may differ
        self.lines = []
        self.process = subprocess.Popen(
            command, env=full, cwd=cwd if cwd and os.path.isdir(cwd) else None,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1,
            start_new_session=True)
        self.reader = threading.Thread(target=self._read, args=(self.process.stdout,),
                                       daemon=True)
        self.reader.start()
        return self.process.pid

    def _read(self, stream):
        for line in iter(stream.readline, ""):
            with self.lock:
                self.lines.append(line)
        stream.close()

    def fetch(self):
        """(new output lines, the exit code once the process ended and its output is read)."""
        code = self.process.poll()
        if code is not None:
            self.reader.join(timeout=5)
        with self.lock:
            lines, self.lines = self.lines, []
        return lines, code

    def signal(self, signum):
        try:
            os.killpg(self.process.pid, signum)
        except (ProcessLookupError, PermissionError):
            pass

    def state(self):
        from kerastrain.cli import frozen
        return frozen.state(self.process.pid)


class RayProcess:
    """A `subprocess.Popen` look-alike for a task whose process is its actor's child: what
    the launcher asks of a process (`poll`, `wait`, `stdout`, signals) goes through the actor."""

    def __init__(self, actor, pid, text=True):
        import io
        self._actor = actor
        self.pid = pid
        self.returncode = None
        read, self._write = os.pipe()
        self.stdout = io.open(read, "r", buffering=1) if text else io.open(read, "rb")
        self._pump = threading.Thread(target=self._follow, daemon=True)
        self._pump.start()

    def _follow(self):
        ray = _ray()
        try:
            while True:
                try:
                    lines, code = ray.get(self._actor.fetch.remote())
                except Exception as error:   # the actor or its node is gone
                    lines, code = [f"kerastrain: ray: lost the task's actor: "
                                   f"{type(error).__name__}: {str(error).splitlines()[0]}\n"], 1
                for line in lines:
                    os.write(self._write, line.encode())
                if code is not None:
                    self.returncode = code
                    return
                time.sleep(POLL_SECS)
        finally:
            os.close(self._write)

    def poll(self):
        return self.returncode

    def wait(self, timeout=None):
        self._pump.join(timeout)
        if self._pump.is_alive():
            raise subprocess.TimeoutExpired("ray task", timeout)
        return self.returncode

    def signal_group(self, signum):
        if self.returncode is None:
            try:
                _ray().get(self._actor.signal.remote(signum), timeout=30)
            except Exception:
                pass   # its actor is gone, and the process with it

    def state(self):
        try:
            return _ray().get(self._actor.state.remote(), timeout=10)
        except Exception:
            return None


class RayHosts:
    """One actor per task name; `popen` starts a task's command in its actor.

    Args:
        names: the tasks' host names (`tasks.Task.host`).
        address: a running Ray cluster's address, or None to start one here.
    """

    vanish_with_task = False   # a node outlives the task it ran (unlike a rehearsal's hosts)

    def __init__(self, names, address=None):
        ray = _ray() if address else _quietly(_ray)   # the first look for an address
        self._started_here = not ray.is_initialized()
        if self._started_here:
            if address is None:
                # In the launcher's private namespace, where loopback is all there is: no
                # usage report to send.
                os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
                _quietly(lambda: ray.init(
                    _node_ip_address="127.0.0.1", include_dashboard=False,
                    logging_level="WARNING", log_to_driver=False, configure_logging=False))
            else:
                ray.init(address=address, logging_level="WARNING", log_to_driver=False,
                         configure_logging=False)
        actor = ray.remote(_TaskActor)

        def place():
            # num_cpus=0: an actor only starts and watches its task, and TensorFlow takes
            # the node's cores; SPREAD puts tasks on different nodes where there are several.
            self.actors = {name: actor.options(num_cpus=0, scheduling_strategy="SPREAD")
                           .remote() for name in names}
            return ray.get([a.node.remote() for a in self.actors.values()])

        nodes = place() if address else _quietly(place)
        self.addresses = {name: node[0] for name, node in zip(self.actors, nodes)}

    def free_address(self, name):
        """`ip:port` free on the node of task `name`, for its `TF_CONFIG`."""
        ip = self.addresses[name]
        return f"{ip}:{_ray().get(self.actors[name].free_port.remote(ip))}"

    def popen(self, name, command, *, env, **_):
        """Start `command` in the actor of `name`; only what the launcher changed in `env`
        from its own environment goes along (a node keeps its own PATH and the like): set,
        and unset (TF_CPP_MIN_LOG_LEVEL, so the task holds TensorFlow's start-up back)."""
        changed = {k: v for k, v in env.items() if os.environ.get(k) != v}
        unset = [k for k in os.environ if k not in env]
        pid = _ray().get(self.actors[name].start.remote(command, changed, unset, os.getcwd()))
        return RayProcess(self.actors[name], pid)

    def close(self):
        ray = _ray()
        for actor in self.actors.values():
            try:
                ray.kill(actor)
            except Exception:
                pass
        if self._started_here:
            ray.shutdown()

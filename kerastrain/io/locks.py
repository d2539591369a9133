"""One live run per model_dir: a kernel lock on a local disk, a renewed lease on other file systems.

Local path (`_KernelLock`): `fcntl.flock` on `model_dir/.kerastrain.lock`. The kernel
gives it to one open file at a time and drops it when the process dies, however
it dies, so a crashed run never blocks the next one and two runs taking over a
stale file cannot both win. The file's text (host, pid, start time) only
names the holder in messages; an empty or garbled one is ignored, with a warning.

URL (`_Lease`): object stores have no exclusive create and no lock that dies with a
process. The file holds a lease record (owner id, host, pid, renewal time); a
thread of the owner renews it every `ttl/4` seconds. A new run waits while the
record is being renewed, and takes it over once it was not renewed for `ttl`
seconds. After writing its record it reads it back a moment later, so of two runs
starting together the later writer wins and the other is refused. Limits (in
docs/checkpoints.md): clocks must agree to within a few seconds, and a run that
cannot renew for `ttl` seconds (a network partition) loses the lease; it notices
at its next renewal and refuses to write checkpoints from then on.

Within one process, Trainers on the same *local* model_dir share the process's
kernel lock (as before: a notebook that builds a new Trainer keeps working);
on a URL the lease belongs to one Trainer until `close()`.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
import uuid

from kerastrain.io import files

try:
    import fcntl
except ImportError:  # Windows: no flock; model_dir locks are not supported there
    fcntl = None

logger = logging.getLogger("kerastrain")

NAME = ".kerastrain.lock"

_PROCESS = threading.RLock()  # one acquire or release at a time in this process
_KERNEL_HELD = {}  # real path -> [fd, number of Trainers sharing it]
_LEASES = {}  # owner id -> live _Lease of this process


class ModelDirInUse(RuntimeError):
    """Another live run holds the model_dir."""


def _me(owner=None):
    record = {"host": socket.gethostname(), "pid": os.getpid(), "since": time.time()}
    if owner:
        record["owner"] = owner
    return record


def _parse(text):
    """(record, problem): a record dict, or None and why the text is not one."""
    if text is None:
        return None, None
    if not text.strip():
        return None, "empty"
    try:
        record = json.loads(text)
    except ValueError:
        return None, f"not a lock record ({text[:40]!r})"
    if not isinstance(record, dict):
        return None, f"not a lock record ({text[:40]!r})"
    return record, None


def _when(seconds):
    try:
        return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(seconds)))
    except (TypeError, ValueError, OverflowError):
        return "?"


def _in_use(model_dir, other, detail="", advice=""):
    owner = f"owner {other['owner']}, " if other.get("owner") else ""
    return ModelDirInUse(
        f"model_dir {model_dir!r} is in use by another run ({owner}host {other.get('host')!r}, "
        f"pid {other.get('pid')!r}, since {_when(other.get('since', 0))}{detail}). Two runs "
        "writing one model_dir would overwrite each other's checkpoints. Use another model_dir, "
        f"wait for that run to end{advice}.")


def pid_alive(pid: int) -> bool:
    """Whether process `pid` of this host exists (another user's counts as alive)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class ModelDirLock:
    """`model_dir/.kerastrain.lock`: one live run per model_dir (see the module docstring).

    Args:
        model_dir: a local path (kernel lock) or a URL (lease).
        ttl: URL leases only: seconds without renewal after which another run may
            take the lease over.
        clock, sleep: URL leases only: the time source and the wait (tests pass fakes).
    """

    NAME = NAME

    def __init__(self, model_dir: str, *, ttl: float | None = None, clock=time.time,
                 sleep=time.sleep):
        self.model_dir = model_dir
        self.path = files.join(model_dir, NAME)
        if files.is_url(model_dir):
            self._impl = _Lease(self.path, model_dir, ttl=ttl, clock=clock, sleep=sleep)
        else:
            self._impl = _KernelLock(self.path, model_dir)

    @property
    def held(self) -> bool:
        return self._impl.held

    @property
    def kind(self) -> str:
        """How the lock works here, in a few words (for the account at start)."""
        return self._impl.kind

    def acquire(self):
        """Take the lock, or raise `ModelDirInUse` naming the holder."""
        self._impl.acquire()
        return self

    def release(self):
        """Give it back (idempotent; also done at exit)."""
        self._impl.release()

    def check(self):
        """Raise `ModelDirInUse` if this run lost its lease (URLs); nothing otherwise."""
        self._impl.check()


class _KernelLock:
    kind = "kernel lock (flock), released when the process ends"

    def __init__(self, path, model_dir):
        self.path = path
        self.model_dir = model_dir
        self.held = False

    def acquire(self):
        if fcntl is None:
            raise ModelDirInUse("model_dir locks need fcntl.flock (Linux, macOS); not on this OS")
        if self.held:
            return
        directory = os.path.dirname(self.path)
        with files.disk_full_guard("the model_dir lock", self.path):
            os.makedirs(directory, exist_ok=True)
        key = os.path.realpath(self.path)
        with _PROCESS:
            if key in _KERNEL_HELD:
                _KERNEL_HELD[key][1] += 1  # another Trainer of this process: one run
            else:
                _KERNEL_HELD[key] = [self._take(), 1]
            self.held = True

    def _take(self):
        me = _me()
        for _ in range(20):
            try:  # made here: its emptiness is ours, not a stale run's
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC,
                             0o644)
                created = True
            except FileExistsError:
                try:
                    fd = os.open(self.path, os.O_RDWR | os.O_CLOEXEC)
                except FileNotFoundError:  # its holder removed it meanwhile: try again
                    continue
                created = False
            try:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    other, _ = _parse(_read_fd(fd))
                    raise _in_use(self.model_dir, other or {}) from None
                # The holder before us may have removed the file between our open and
                # our flock; then we locked an orphan, and the path is another file.
                try:
                    current = os.stat(self.path)
                except FileNotFoundError:
                    current = None
                mine = os.fstat(fd)
                if current is None or (current.st_ino, current.st_dev) != (mine.st_ino,
                                                                           mine.st_dev):
                    os.close(fd)
                    continue
                if not created:
                    self._judge(_read_fd(fd), me)
                data = json.dumps(me).encode()
                with files.disk_full_guard("the model_dir lock", self.path,
                                           "free space and run again"):
                    os.ftruncate(fd, 0)
                    os.pwrite(fd, data, 0)
                    os.fsync(fd)
                return fd
            except BaseException:
                os.close(fd)
                raise
        raise ModelDirInUse(f"could not take the lock {self.path!r}; another run keeps taking it")

    def _judge(self, text, me):
        """We hold the kernel lock; decide what the record left in the file means."""
        other, problem = _parse(text)
        if problem:
            logger.warning("model_dir lock %s was %s (left by a start that failed, e.g. on a "
                           "full disk); no process holds it, so this run takes it over",
                           self.path, problem)
            return
        if other is None:
            return
        host, pid = other.get("host"), other.get("pid")
        if host == me["host"] and isinstance(pid, int) and pid != me["pid"] and pid_alive(pid):
            # A live process named in a file nobody has flocked: a run of a kerastrain
            # that took the lock by creating the file only. Do not run beside it.
            raise _in_use(self.model_dir, other,
                          advice=f", or, if it is certainly dead, remove {self.path!r}")
        if host != me["host"]:
            # On a network file system flock may be local to each host (`nolock`
            # mounts), so a record from another host cannot be proven stale.
            raise _in_use(self.model_dir, other, detail=", on another host, which this host "
                          "cannot check", advice=f", or, if it is certainly dead, remove "
                          f"{self.path!r}")
        logger.warning("model_dir lock %s was left by process %s, which is gone; taking it over",
                       self.path, pid)

    def release(self):
        if not self.held:
            return
        self.held = False
        key = os.path.realpath(self.path)
        with _PROCESS:
            entry = _KERNEL_HELD.get(key)
            if entry is None:
                return
            entry[1] -= 1
            if entry[1] > 0:
                return
            del _KERNEL_HELD[key]
            fd = entry[0]
            try:
                # Removed while still locked: a run that opened the old file meanwhile
                # sees, after its flock, that the path is no longer that file.
                current = os.stat(self.path)
                mine = os.fstat(fd)
                if (current.st_ino, current.st_dev) == (mine.st_ino, mine.st_dev):
                    os.unlink(self.path)
            except FileNotFoundError:
                pass
            finally:
                os.close(fd)

    def check(self):
        pass


def _read_fd(fd):
    chunks = []
    offset = 0
    while True:
        chunk = os.pread(fd, 65536, offset)
        if not chunk:
            break
        chunks.append(chunk)
        offset += len(chunk)
    return b"".join(chunks).decode("utf-8", "replace")


class _Lease:
    TTL = 60.0      # seconds without renewal before another run may take over
    SETTLE = 1.0    # seconds between writing the record and reading it back

    def __init__(self, path, model_dir, *, ttl=None, clock=time.time, sleep=time.sleep):
        self.path = path
        self.model_dir = model_dir
        self.ttl = float(ttl or self.TTL)
        self.clock = clock
        self.sleep = sleep
        self.owner = uuid.uuid4().hex[:12]
        self.held = False
        self.lost = None  # the record that replaced ours, once seen
        self._stop = threading.Event()
        self._thread = None
        self._since = None

    @property
    def kind(self):
        return (f"lease, renewed every {self.ttl / 4:.0f} s, taken over {self.ttl:.0f} s after "
                "its owner stops renewing")

    def _record(self):
        return {**_me(self.owner), "since": self._since, "renewed": self.clock(),
                "ttl": self.ttl}

    def _read(self):
        return _parse(files.read_text(self.path))

    def _write(self):
        with files.disk_full_guard("the model_dir lease", self.path):
            files.write_text(self.path, json.dumps(self._record()))

    def acquire(self):
        if self.held:
            return
        with _PROCESS:
            self._wait_for_a_free_lease()
            self._since = self.clock()
            files.makedirs(self.model_dir)
            self._write()
            if files.scheme(self.path) != "ram":
                # Two runs that both found the lease free both wrote; the later write
                # stands. ram:// is private to this process, which `_PROCESS` serializes.
                self.sleep(self.SETTLE)
                other, _ = self._read()
                if not other or other.get("owner") != self.owner:
                    raise _in_use(self.model_dir, other or {},
                                  detail=", which took the lease as this run did")
            self.held = True
            _LEASES[self.owner] = self
        self._thread = threading.Thread(target=self._renew_loop, daemon=True,
                                        name=f"kerastrain-lease-{self.owner}")
        self._thread.start()

    def _wait_for_a_free_lease(self):
        """Return once the lease is free or expired; raise while another owner renews it."""
        first = None
        while True:
            other, problem = self._read()
            if problem:
                logger.warning("model_dir lease %s was %s; no run can be renewing it, so this "
                               "run takes it", self.path, problem)
                return
            if other is None or other.get("owner") == self.owner:
                return
            if other.get("owner") in _LEASES:
                raise _in_use(self.model_dir, other, detail=", a Trainer in this process",
                              advice=", or call close() on that Trainer")
            now = self.clock()
            renewed = _number(other.get("renewed"))
            ttl = _number(other.get("ttl")) or self.ttl
            left = renewed + ttl - now
            if left <= 0:
                logger.warning("model_dir lease %s of owner %s (host %s, pid %s) expired %.0f s "
                               "ago; taking it over", self.path, other.get("owner"),
                               other.get("host"), other.get("pid"), -left)
                return
            if first is None:
                first = renewed
                logger.info("model_dir %s: waiting up to %.0f s for the lease of owner %s "
                            "(host %s, pid %s) to be renewed or to expire", self.model_dir,
                            left, other.get("owner"), other.get("host"), other.get("pid"))
            elif renewed != first:
                raise _in_use(self.model_dir, other, detail=", renewing its lease")
            self.sleep(min(left, ttl / 8) + 0.01)

    def _renew_loop(self):
        while not self._stop.wait(self.ttl / 4):
            self.renew()

    def renew(self):
        """Renew the lease if it is still ours; otherwise remember who took it."""
        if not self.held or self.lost is not None:
            return
        try:
            other, _ = self._read()
            if other is not None and other.get("owner") not in (None, self.owner):
                self.lost = other
                logger.error("model_dir lease %s was taken over by owner %s (host %s, pid %s); "
                             "this run writes no more checkpoints there", self.path,
                             other.get("owner"), other.get("host"), other.get("pid"))
                return
            self._write()
        except Exception as e:  # a transient storage error: try again next period
            logger.warning("could not renew the model_dir lease %s: %s", self.path,
                           str(e).splitlines()[0][:200] if str(e) else type(e).__name__)

    def check(self):
        if self.lost is not None:
            raise _in_use(self.model_dir, self.lost, detail=", which took over this run's "
                          "lease while it could not renew it")

    def release(self):
        if not self.held:
            return
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)
        with _PROCESS:
            self.held = False
            _LEASES.pop(self.owner, None)
            if self.lost is None:
                try:
                    other, _ = self._read()
                    if other is not None and other.get("owner") == self.owner:
                        files.remove(self.path)
                except Exception as e:  # at exit, on a storage error: it expires anyway
                    logger.warning("could not remove the model_dir lease %s (%s); it expires "
                                   "in %.0f s", self.path, type(e).__name__, self.ttl)


def check(path: str):
    """Raise `ModelDirInUse` if `path` lies in a model_dir whose lease this process has lost."""
    for lease in list(_LEASES.values()):
        if lease.lost is not None and (path == lease.model_dir
                                       or path.startswith(lease.model_dir + "/")):
            lease.check()


def _number(value):
    try:
        return float(value)
    except (TypeError, ValueError):
        return 0.0

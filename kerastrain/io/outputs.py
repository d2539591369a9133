"""The one place that decides whether this task keeps what it writes (chief) or writes nothing."""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import re
import shutil
import tempfile

from kerastrain.io import files
from kerastrain.io import locks

logger = logging.getLogger("kerastrain")

SCRATCH_PREFIX = "kerastrain-nonchief-"
_SCRATCH = re.compile(r"^kerastrain-nonchief-(\d+)-[^-]+$")  # with its process's pid


def normalize_model_dir(model_dir) -> str | None:
    """A URL as given, a local path absolute; an unusable file system is a ValueError now."""
    return files.normalize_model_dir(model_dir)


def new_scratch() -> str:
    """A new scratch directory named for this process (`kerastrain-nonchief-<pid>-…` in the
    temp dir), after removing those of processes that are gone: a worker killed during a
    save leaves its part of the checkpoint there, one model's worth per kill."""
    root = tempfile.gettempdir()
    try:
        names = os.listdir(root)
    except OSError:
        names = []
    for name in names:
        match = _SCRATCH.match(name)
        if match and not locks.pid_alive(int(match.group(1))):
            shutil.rmtree(os.path.join(root, name), ignore_errors=True)
    return tempfile.mkdtemp(prefix=f"{SCRATCH_PREFIX}{os.getpid()}-")


_PROCESS_SCRATCH = []  # this process's scratch directory, once made (`process_scratch`)


def process_scratch() -> str:
    """This process's scratch directory for the files it writes and no one keeps (made on
    first use, removed at exit)."""
    if not _PROCESS_SCRATCH:
        _PROCESS_SCRATCH.append(new_scratch())
        atexit.register(shutil.rmtree, _PROCESS_SCRATCH[0], True)
    return _PROCESS_SCRATCH[0]


@contextlib.contextmanager
def scratch_dir():
    """A temporary directory for a non-chief task's part of a collective save, then removed.

    Under multi-worker mirrored every worker must take part in a save or an export
    (reading on-read variables is collective); only the chief keeps the files.
    """
    path = new_scratch()
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


class Outputs:
    """This task's part of the chief rule (see the module docstring) for one `model_dir`.

    Paths under `model_dir` are the chief's; None for every other task or without a
    model_dir. Every task asks; only the chief gets a directory, so no two workers ever
    write the same file (tensorflow#38635, #31252). Everything goes through
    `kerastrain.io.files`, so `model_dir` may be a local path or a URL (gs://, ram://).

    Args:
        model_dir: normalized (`normalize_model_dir`), or None: nowhere.
        is_chief: whether this task is the chief (`BuiltStrategy.is_chief`); nothing but
            this class asks it.
    """

    def __init__(self, model_dir: str | None, is_chief: bool):
        self.model_dir = model_dir
        self._is_chief = is_chief
        self.lock = None

    def at(self, model_dir: str | None) -> Outputs:
        """The same task's rule for another `model_dir` (a `BackupAndRestore`'s backup_dir)."""
        return Outputs(model_dir, self._is_chief)

    @property
    def enabled(self) -> bool:
        """Whether this task keeps files under `model_dir` (the chief, with a model_dir)."""
        return self.model_dir is not None and self._is_chief

    @property
    def speaks(self) -> bool:
        """Whether this task talks to the user: its progress bars on `verbose="auto"`, the
        command line's last line. Every task computes the same logs; one says them."""
        return self._is_chief

    def say(self, text: str):
        """Print `text` where this task speaks (the chief); elsewhere nothing."""
        if self.speaks:
            print(text, flush=True)

    def writers(self, writers) -> list:
        """The metric writers this task writes to: `writers` on the chief (with or without a
        model_dir: the user's own writers write elsewhere), none on other tasks."""
        return list(writers) if self._is_chief else []

    def place(self, path):
        """Where a path a user's callback writes goes (`ModelCheckpoint`'s `filepath`...): on
        the chief, as given, a relative one under `model_dir` (the working directory without
        one); on other tasks, into this process's scratch directory, removed at exit. The
        parent directory is made. Anything but a str is returned as it is."""
        if not isinstance(path, str):
            return path  # Keras says what it takes
        if not self._is_chief:
            path = os.path.join(process_scratch(), path.replace("://", "/").lstrip("/"))
        elif self.model_dir is not None and not (files.is_url(path) or os.path.isabs(path)):
            path = files.join(self.model_dir, path)
        parent = os.path.dirname(path)
        if parent:
            files.makedirs(parent)
        return path

    def claim(self, tidy=None):
        """On the chief: take the model_dir lock, tidy what a killed run left, say where state goes.

        `tidy(model_dir)` removes what killed writes left (`checkpoints.tidy`).

        Returns the lock (released by `Trainer.close()` or at exit), or None on
        other tasks and without a model_dir.

        Raises:
            kerastrain.io.locks.ModelDirInUse: another live run holds the model_dir.
        """
        if not self.enabled:
            return None
        from kerastrain.io import locks
        self.lock = locks.ModelDirLock(self.model_dir).acquire()
        atexit.register(self.lock.release)
        # Only the lock holder may remove temporaries: nobody else is writing them now.
        if tidy is not None:
            tidy(self.model_dir)
        logger.info("model_dir: %s (%s; lock: %s)", self.model_dir,
                    files.describe(self.model_dir), self.lock.kind)
        return self.lock

    def path(self, *parts: str) -> str | None:
        """`model_dir/parts...` on the chief (nothing created); None elsewhere."""
        if not self.enabled:
            return None
        return files.join(self.model_dir, *parts)

    def dir(self, *parts: str) -> str | None:
        path = self.path(*parts)
        if path is not None:
            with files.disk_full_guard("a directory", path):
                files.makedirs(path)
        return path

    def write_text(self, name: str, text: str) -> str | None:
        """Write `model_dir/name` on the chief (atomically); elsewhere nothing. Returns the path.

        A different file already there is kept as `name` with a `.previous-N` suffix
        (N counting up), so a rerun with changed settings never erases the record
        of the earlier one.
        """
        directory = self.dir()
        if directory is None:
            return None
        path = files.join(directory, name)
        old = files.read_text(path)
        if old == text:
            return path
        with files.disk_full_guard(name, path, "the earlier files are intact"):
            if old is not None:
                n = 1
                while files.exists(f"{path}.previous-{n}"):
                    n += 1
                files.rename(path, f"{path}.previous-{n}")
            return self._write(path, text)

    def replace_text(self, name: str, text: str) -> str | None:
        """Write `model_dir/name` on the chief, replacing it whole (never half-written)."""
        directory = self.dir()
        if directory is None:
            return None
        path = files.join(directory, name)
        with files.disk_full_guard(name, path, f"the earlier {name} is intact"):
            return self._write(path, text)

    def _write(self, path, text):
        from kerastrain.io import locks
        locks.check(path)
        return files.write_text(path, text)

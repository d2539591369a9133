"""Files under `model_dir` through TensorFlow's file systems: local paths, gs://, ram://, and more.

Every file kerastrain reads or writes under `model_dir` goes through these helpers
(`tf.io.gfile`) or through a TensorFlow or Keras API that does the same (checkpoints,
summary writers, SavedModel, `.keras` files). A local path is made absolute; a URL
is kept as given. TensorFlow is imported on first use, so that recipe checks and
the model_dir lock of a local path run without it.
"""

from __future__ import annotations

import contextlib
import errno
import os
import posixpath
import re
import shutil
import uuid

# Which file system a path names is told below the layers, where the option checks (a
# recipe's `model_dir`) read it too; `files.scheme` and `files.is_url` are the same functions.
from kerastrain._schemes import is_url, scheme, scheme_advice

# Where renaming a directory is one atomic step. Object stores (gs://, s3://) rename
# object by object (copy, then delete), so a reader can see half of a renamed directory;
# TensorFlow's ram:// (a flat map of names) renames a directory's own entry, not its files.
_ATOMIC_RENAME = ("", "hdfs", "viewfs")

TMP_INFIX = ".kerastrain-tmp-"  # `name` + this + hex: a file being written beside `name`


class DiskFull(OSError):
    """No space left where kerastrain was writing. The message is one line, naming what and where.

    What was written before stays intact: checkpoints are written beside and
    renamed by TensorFlow, exports beside and renamed by kerastrain.
    """

    def __init__(self, message):
        super().__init__(errno.ENOSPC, message)

    def __str__(self):
        return self.strerror


# -- paths -------------------------------------------------------------------------------

def join(path: str, *parts: str) -> str:
    # URLs always use '/', whatever the local OS does.
    return posixpath.join(path, *parts) if is_url(path) else os.path.join(path, *parts)


def unsupported_scheme(path: str, *, ask_tensorflow: bool = True) -> str | None:
    """One line saying why `path`'s file system cannot be used here, or None when it can."""
    advice = scheme_advice(path, ask_tensorflow=ask_tensorflow)
    if advice is None:
        return None
    return (f"`model_dir` is on a '{scheme(path)}://' file system, which TensorFlow does not "
            f"implement here: {advice}. Received: model_dir={path!r}")


def normalize_model_dir(model_dir) -> str | None:
    """`model_dir` as kerastrain keeps it: a URL as given, a local path absolute.

    Local paths are absolute because TensorFlow's checkpoint state file records
    paths as given and reads relative ones back relative to the checkpoint
    directory, not the working directory. `file://` URLs are local paths.

    Raises:
        ValueError: a file system TensorFlow does not implement (`s3://` without
            tensorflow-io): said now rather than after an hour of training.
    """
    if model_dir is None:
        return None
    try:
        path = os.fspath(model_dir)
    except TypeError:
        raise TypeError("`model_dir` must be a path, a URL or None. "
                        f"Received: model_dir={model_dir!r}") from None
    if isinstance(path, bytes):
        path = os.fsdecode(path)
    if scheme(path) == "file":
        path = path[len("file://"):]
    if is_url(path):
        if not path.split("://", 1)[1].strip("/"):
            raise ValueError("`model_dir` must name a bucket or directory after the scheme. "
                             f"Received: model_dir={path!r}")
        problem = unsupported_scheme(path)
        if problem:
            raise ValueError(problem)
        return path.rstrip("/")
    return os.path.abspath(os.path.expanduser(path))


def renames_atomically(path: str) -> bool:
    """Whether renaming a directory under `path` is one atomic step (see docs/checkpoints.md)."""
    return scheme(path) in _ATOMIC_RENAME


def describe(path: str) -> str:
    """What the file system of `path` guarantees, for the one-line account at start."""
    name = scheme(path)
    if not name:
        return "local file system: writes land whole (written beside, then renamed)"
    if name == "ram":
        return ("TensorFlow's in-memory file system (this process only, gone at exit), used "
                "like an object store: each file lands whole, the export is marked complete last")
    if renames_atomically(path):
        return f"{name}:// file system: writes land whole (written beside, then renamed)"
    return (f"{name}:// object store: each file lands whole, a directory does not, so the "
            "export is marked complete last")


# -- tf.io.gfile, with the few operations kerastrain needs --------------------------------

def _gfile():
    import tensorflow as tf
    return tf.io.gfile


def exists(path: str) -> bool:
    gfile = _gfile()
    if not gfile.exists(path):
        return False
    if scheme(path) != "ram":
        return True
    # TensorFlow's ram:// says "exists" for any string prefix of a stored name
    # ("export" when only "export.kerastrain-partial-..." is there): ask the parent.
    parent, name = path.rstrip("/").rsplit("/", 1)
    return name in listdir(parent)


def isdir(path: str) -> bool:
    return _gfile().isdir(path)


def makedirs(path: str) -> str:
    _gfile().makedirs(path)
    return path


def listdir(path: str) -> list[str]:
    """Entry names in `path` ([] when it does not exist); directories without a trailing '/'."""
    gfile = _gfile()
    if not gfile.isdir(path):
        return []
    return sorted(name.rstrip("/") for name in gfile.listdir(path))


def remove(path: str) -> None:
    """Remove a file or a directory tree; nothing if it is not there."""
    gfile = _gfile()
    if gfile.isdir(path):
        gfile.rmtree(path)
    elif gfile.exists(path):
        gfile.remove(path)


def rename(source: str, target: str, *, overwrite: bool = False) -> None:
    _gfile().rename(source, target, overwrite=overwrite)


def read_text(path: str) -> str | None:
    """The file's text, or None if it does not exist."""
    gfile = _gfile()
    import tensorflow as tf
    try:
        with gfile.GFile(path, "r") as f:
            return f.read()
    except tf.errors.NotFoundError:
        return None


def write_text(path: str, text: str) -> str:
    """Write `path` so that a reader sees the old file or the whole new one, never a part.

    Written beside (`path` + TMP_INFIX + hex), then renamed over `path`. On object
    stores the rename is a copy of one object, which lands whole too.
    """
    temp = f"{path}{TMP_INFIX}{uuid.uuid4().hex[:12]}"
    gfile = _gfile()
    try:
        with gfile.GFile(temp, "w") as f:
            f.write(text)
        gfile.rename(temp, path, overwrite=True)
    except BaseException:
        with contextlib.suppress(Exception):
            if gfile.exists(temp):
                gfile.remove(temp)
        raise
    return path


def is_own_temporary(name: str) -> bool:
    """A file `write_text` was writing when its process died (safe to remove at start)."""
    return re.search(re.escape(TMP_INFIX) + r"[0-9a-f]{12}$", name) is not None


# -- a full disk, said in one line ----------------------------------------------------------

_FULL = ("No space left on device", "Disk quota exceeded")


def _is_disk_full(error: BaseException) -> bool:
    if isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT):
        return True
    # TensorFlow's C++ file systems report ENOSPC as an OpError (ResourceExhaustedError
    # on POSIX) whose message carries strerror; memory exhaustion has other words.
    return type(error).__module__.startswith("tensorflow") and any(
        text in str(error) for text in _FULL)


def free_space(path: str) -> str:
    """'12.0 KiB free of 4.0 MiB' for a local path; 'free space unknown' on other file systems."""
    if is_url(path):
        return "free space unknown"
    probe = path
    while probe and not os.path.exists(probe):
        parent = os.path.dirname(probe)
        if parent == probe:
            break
        probe = parent
    try:
        usage = shutil.disk_usage(probe)
    except OSError:
        return "free space unknown"
    return f"{_size(usage.free)} free of {_size(usage.total)}"


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


@contextlib.contextmanager
def disk_full_guard(what: str, path: str, after: str = ""):
    """Turn "no space left" from any layer (Python, TensorFlow, Keras) into one `DiskFull` line.

    Args:
        what: what was being written ("the checkpoint of step 12").
        path: where (a file or directory under model_dir).
        after: what holds now and what to do, appended to the message.
    """
    try:
        yield
    except DiskFull:
        raise
    except Exception as e:
        if not _is_disk_full(e):
            raise
        message = f"disk full: could not write {what} to {path} ({free_space(path)})"
        raise DiskFull(message + (f"; {after}" if after else "")) from None

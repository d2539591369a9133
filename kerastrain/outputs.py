"""The one place that decides whether this task keeps what it writes (chief) or writes nothing."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile

SCRATCH_PREFIX = "kerastrain-nonchief-"


@contextlib.contextmanager
def scratch_dir():
    """A temporary directory for a non-chief task's part of a collective save, then removed.

    Under multi-worker mirrored every worker must take part in a save or an export
    (reading on-read variables is collective); only the chief keeps the files.
    """
    path = tempfile.mkdtemp(prefix=SCRATCH_PREFIX)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


class Outputs:
    """Paths under `model_dir` for the chief; None for every other task or without a model_dir.

    Every task asks; only the chief gets a directory, so no two workers ever
    write the same file (tensorflow#38635, #31252).
    """

    def __init__(self, model_dir: str | None, is_chief: bool):
        self.model_dir = model_dir
        self.is_chief = is_chief

    @property
    def enabled(self) -> bool:
        return self.model_dir is not None and self.is_chief

    def dir(self, *parts: str) -> str | None:
        if not self.enabled:
            return None
        path = os.path.join(self.model_dir, *parts)
        os.makedirs(path, exist_ok=True)
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
        path = os.path.join(directory, name)
        if os.path.exists(path):
            with open(path, encoding="utf-8") as f:
                if f.read() == text:
                    return path
            n = 1
            while os.path.exists(f"{path}.previous-{n}"):
                n += 1
            os.replace(path, f"{path}.previous-{n}")
        with open(path + ".tmp", "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(path + ".tmp", path)
        return path

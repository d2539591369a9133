"""SIGTERM: finish the current step, save at exactly that step, exit with a documented code."""

from __future__ import annotations

import logging
import os
import select
import signal
import threading

logger = logging.getLogger("kerastrain")

EXIT_CODE = 143  # 128 + SIGTERM: what orchestrators expect from a terminated process


class Preempted(SystemExit):
    """Raised by `fit` after a SIGTERM, once the checkpoint at the step reached is written.

    It is a `SystemExit` with code 143, so an uncaught one ends the process cleanly
    (no traceback) with the code an orchestrator reads as "terminated, restart me".
    """

    def __init__(self, step: int, path: str | None):
        super().__init__(EXIT_CODE)
        self.step = step
        self.path = path

    def __str__(self):
        return (f"preempted (SIGTERM) at step {self.step}; checkpoint: {self.path}; "
                f"exit code {EXIT_CODE}")


class SigtermWatch:
    """While active, a SIGTERM sets `requested` and flips `stop_variable` at once.

    Python runs signal handlers only when the main thread returns to the
    interpreter, which a compiled loop of many steps delays. The C-level handler
    writes the signal number to a wakeup fd; a thread reading it flips a variable
    that the compiled loop checks before each step, so the loop stops after the
    step in progress.
    """

    def __init__(self, stop_variable=None):
        self.stop_variable = stop_variable
        self.requested = False
        self._previous = None
        self._previous_fd = None
        self._thread = None
        self._pipe = None

    def _on_signal(self, signum, frame):
        self.requested = True

    def __enter__(self):
        if threading.current_thread() is not threading.main_thread():
            return self  # signals go to the main thread only; nothing to watch from here
        self._previous = signal.signal(signal.SIGTERM, self._on_signal)
        r, w = os.pipe()
        os.set_blocking(w, False)
        self._pipe = (r, w)
        self._previous_fd = signal.set_wakeup_fd(w, warn_on_full_buffer=False)
        self._thread = threading.Thread(target=self._watch, name="kerastrain-sigterm",
                                        daemon=True)
        self._thread.start()
        return self

    def _watch(self):
        r = self._pipe[0]
        while True:
            select.select([r], [], [])
            data = os.read(r, 64)
            if not data or b"\xff" in data:
                return  # closed by __exit__
            if signal.SIGTERM in data:
                self.requested = True
                if self.stop_variable is not None:
                    self.stop_variable.assign(True)

    def __exit__(self, *exc):
        if self._thread is None:
            return False
        signal.set_wakeup_fd(self._previous_fd)
        signal.signal(signal.SIGTERM, self._previous)
        os.write(self._pipe[1], b"\xff")
        self._thread.join(timeout=5)
        for fd in self._pipe:
            os.close(fd)
        self._thread = None
        return False

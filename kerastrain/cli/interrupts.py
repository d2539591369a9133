"""Ctrl-C and SIGTERM for `kerastrain launch`: one `KeyboardInterrupt` in the main thread.

CPython runs a Python signal handler only in the main thread, between two bytecodes. A signal
that the kernel hands to another thread (any thread may take a signal sent to the process:
NumPy's OpenBLAS pool, gRPC's threads), or that lands just before the main thread enters a
blocking call (the handler's flag is set, then `time.sleep`, a socket read or a lock wait
starts), is seen only when that call returns: a recipe module sleeping or downloading in its
import would keep the launcher deaf for minutes. So the signal also wakes a watcher thread
(CPython's wakeup fd), which sends it again to the main thread itself until the handler has run:
a blocking call there then fails with EINTR and the handler runs at once. The watcher starts
when `watch()` is called: `kerastrain launch` first moves into its network namespace, which
Linux allows only while the process has one thread (where the kernel cannot hand the signal to
another; the window before a blocking call stays, for the little that runs until then).
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading

# How long the main thread has to run the handler before the watcher sends the signal to it.
_GRACE_SECS = 0.2


class Interrupts:
    """SIGINT and SIGTERM become one `KeyboardInterrupt` in the main thread, from `__enter__` on.

    Installed explicitly, not inherited: a shell starts a background job (`cmd &`, CI runners,
    `nohup`) with SIGINT ignored, and Python keeps an ignored SIGINT ignored, so a launcher
    relying on Python's default would not hear Ctrl-C at all and would train on to the end.
    Only the first signal raises: a second Ctrl-C must not cut short the stopping of the tasks
    that the first one asked for (`Launcher.stop_all` kills what is left after a few seconds).
    Inside `deferred()` the signal is only noted, and raised when the block ends, so a task
    is never half started (forked but not yet known to the launcher).
    Enter it in the main thread (Python installs signal handlers only there).
    """

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self):
        self.signum = None
        self._deferring = 0
        self._pending = False
        self._previous = {}
        self._handled = threading.Event()
        self._sending = threading.Lock()  # held by the watcher while it checks and sends
        self._wakeup = None       # (read end, write end) of the wakeup pipe
        self._previous_wakeup = -1
        self._watcher = None

    def __enter__(self):
        self._previous = {s: signal.getsignal(s) for s in self.SIGNALS}
        for s in self.SIGNALS:
            signal.signal(s, self._on_signal)
        read, write = os.pipe()
        os.set_blocking(write, False)  # as CPython requires of a wakeup fd
        self._wakeup = (read, write)
        self._previous_wakeup = signal.set_wakeup_fd(write, warn_on_full_buffer=False)
        return self

    def watch(self) -> Interrupts:
        """Start the watcher thread (once): after `isolation.isolate`, which Linux allows only to
        a process of one thread. A signal that came before waits in the pipe for it."""
        if self._watcher is None:
            self._watcher = threading.Thread(
                target=self._watch, args=(self._wakeup[0], threading.main_thread().ident),
                name="kerastrain-interrupts", daemon=True)
            self._watcher.start()
        return self

    def __exit__(self, *exc):
        with self._sending:          # no send after this, so none reaches a restored handler
            self._handled.set()
        for signum, handler in self._previous.items():
            signal.signal(signum, handler if handler is not None else signal.SIG_DFL)
        signal.set_wakeup_fd(self._previous_wakeup)
        os.close(self._wakeup[1])    # a watcher reading the pipe reads its end
        if self._watcher is None:
            os.close(self._wakeup[0])
        return False

    def _watch(self, read, main_thread):
        # Reads until `__exit__` closes the write end; sends while the handler has not run.
        try:
            while data := os.read(read, 64):
                sent = [s for s in self.SIGNALS if s in data]
                while sent and not self._handled.wait(_GRACE_SECS):
                    with self._sending:
                        if not self._handled.is_set():
                            signal.pthread_kill(main_thread, sent[0])
        finally:
            os.close(read)

    def _on_signal(self, signum, frame):
        if self.signum is not None:
            return
        self.signum = signum
        self._handled.set()
        if self._deferring:
            self._pending = True
        else:
            raise KeyboardInterrupt

    @contextlib.contextmanager
    def deferred(self):
        self._deferring += 1
        try:
            yield
        finally:
            self._deferring -= 1
        if self._pending and not self._deferring:
            self._pending = False
            raise KeyboardInterrupt

    @property
    def exit_code(self) -> int:
        """128 + the signal's number, as a shell reports a job stopped by it (130: Ctrl-C)."""
        return 128 + int(self.signum or signal.SIGINT)

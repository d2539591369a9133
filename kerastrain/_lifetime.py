"""A launched task's lifetime: it ends with the `kerastrain launch` that started it.

Standard library only: every task's entry point (`kerastrain run`, a ps or tf.data service
server, a user's script under `kerastrain launch`) calls `die_with_launcher()` first thing.
"""

from __future__ import annotations

import os
import signal
import sys

LAUNCHER_PID = "KERASTRAIN_LAUNCHER_PID"   # set by the launcher in each task's environment


def die_with_launcher():
    """In a task `kerastrain launch` started: end when the launcher ends, however it ends.

    A launcher killed with SIGKILL (an OOM killer, a CI timeout) cannot stop its tasks, and
    each runs in a session of its own: a hung one would live on, holding memory and ports.
    Linux sends a process a signal of its choice when its parent dies (PR_SET_PDEATHSIG):
    SIGKILL, since a hung task ignores SIGTERM. Checkpoints are written whole, so at most the
    steps since the last one are lost, as with any kill. Nothing happens outside Linux or
    outside a launched task.
    """
    launcher = os.environ.get(LAUNCHER_PID)
    if not launcher or not sys.platform.startswith("linux"):
        return
    import ctypes
    import ctypes.util
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    pr_set_pdeathsig = 1
    libc.prctl(pr_set_pdeathsig, int(signal.SIGKILL))
    if os.getppid() != int(launcher):  # it died before the request above: too late to be told
        os._exit(137)

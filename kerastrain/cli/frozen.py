"""Frozen tasks: what the kernel says of a task's process (stopped, or in an uninterruptible wait).

A task stopped by SIGSTOP or a paused VM, or blocked in the kernel, looks to its peers like a
task that hangs; the launcher reads the kernel's own word for it, here or (a Ray task) on its
node, to name it after a failure and to kill it at once when the job stops.
"""

from __future__ import annotations


def state(pid):
    """The kernel's one-letter state of a process (R, S, D, T...), or None (gone, not Linux)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def state_of(process):
    """`state` of a task's process, here or (a Ray task) on its node."""
    return process.state() if hasattr(process, "state") else state(process.pid)


def stopped(process) -> bool:
    """Stopped (SIGSTOP, a paused VM): it cannot act on a signal until it runs again."""
    return state_of(process) in ("T", "t")


def note(tasks) -> str:
    """Which tasks the kernel says are stopped (SIGSTOP, a paused VM) or in an uninterruptible
    wait, read before they are stopped: on a cluster a peer the launcher cannot see."""
    found = []
    for task in tasks:
        if task.process is None:
            continue
        kernel_state = state_of(task.process)
        if kernel_state in ("T", "t", "D"):
            how = "stopped" if kernel_state in ("T", "t") else "in an uninterruptible wait"
            found.append(f"{task.name} ({how}, pid {task.process.pid})")
    return "; frozen here: " + ", ".join(found) if found else ""

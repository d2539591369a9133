"""What this host lets the process use: its cores. Standard library only.

Below the layers, so that the devices line (`kerastrain._logging`) and the input pipelines'
pools (`kerastrain.data.pipelines`) count the same cores.
"""

from __future__ import annotations

import os


def usable_cores() -> int:
    """The CPUs this process may run on: its affinity mask (`taskset`, cgroup cpusets), as
    TensorFlow sizes its own pools, where `os.cpu_count()` counts the whole machine."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):  # no affinity on this platform (macOS)
        return os.cpu_count() or 1

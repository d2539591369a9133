"""A `kerastrain.cli.launch.Launcher` over stand-in tasks (plain Python, no TensorFlow), for
signal tests: `python _launch_stub.py MODE MARKER_DIR`.

Each task prints `up`, then `training`, then sleeps (at most 120 s). MODE:
- `starting`: SIGINT arrives while the first task is being started (between its fork and
  the launcher knowing it);
- `training`: nothing special; the test sends SIGINT once every task says `training`;
- `restart`: worker:1 fails in the first attempt (`--max-restarts 1`); the test sends SIGINT
  when the launcher says it restarts.
"""

import os
import signal
import subprocess
import sys

from kerastrain.cli import launch
from kerastrain.cli.tasks import Task

mode, marker_dir = sys.argv[1], sys.argv[2]
TASK = """
import os, sys, time
from kerastrain._lifetime import die_with_launcher
die_with_launcher()  # as `kerastrain run` does first thing
print("up", flush=True)
if sys.argv[1] == "fail-once" and not os.path.exists(sys.argv[2]):
    open(sys.argv[2], "w").close()
    sys.exit(3)
print("training", flush=True)
time.sleep(120)
"""


def task(job, index, behaviour="run"):
    marker = os.path.join(marker_dir, f"{job}{index}")
    return Task(job, index, "{}", [sys.executable, "-c", TASK, behaviour, marker])


tasks = [task("worker", 0), task("worker", 1, "fail-once" if mode == "restart" else "run"),
         task("worker", 2)]

if mode == "starting":
    real_popen = subprocess.Popen

    def popen_then_interrupt(*args, **kwargs):
        process = real_popen(*args, **kwargs)
        if not os.path.exists(os.path.join(marker_dir, "interrupted")):
            open(os.path.join(marker_dir, "interrupted"), "w").close()
            os.kill(os.getpid(), signal.SIGINT)  # lands before `task.process` is assigned
        return process

    launch.subprocess.Popen = popen_then_interrupt

sys.exit(launch.Launcher(tasks, max_restarts=1 if mode == "restart" else 0).run())

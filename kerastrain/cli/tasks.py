"""The tasks of a `kerastrain launch` job: each one's address, command line and `TF_CONFIG`.

Every training task runs the same command (`kerastrain run RECIPE --set ...`, or a user's
script) with its own `TF_CONFIG`; the recipe decides the strategy and each task's role follows
from `TF_CONFIG`. A tf.data service's dispatcher and workers are tasks of the job too.
`--dry-run` prints what each task would run and starts nothing.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import threading

from kerastrain.cli import hosts as hosts_lib
from kerastrain.distribute.cluster import free_port
from kerastrain._options import is_int


@dataclasses.dataclass
class Task:
    """One task of the job: its place in the cluster and its command line; the fields after
    `command` are the launcher's account of its process (`launch.Launcher`)."""
    type: str
    index: int
    tf_config: str
    command: list
    process: subprocess.Popen | None = None
    restarts: int = 0
    backstop: bool = False  # its output had faulthandler's "Timeout (...)!": a blocked stall
    pump: threading.Thread | None = None  # copies its output
    slot: str | None = None   # an elastic job's worker: the slot (host) it runs on
    out: bool = False         # an elastic ps worker left out (lost, or its host removed)
    late: bool = False        # a ps worker started again during the attempt

    @property
    def name(self) -> str:
        return f"{self.type}:{self.index}"

    @property
    def host(self) -> str:
        """Its host name in a multihost rehearsal (an elastic job's worker: its slot's)."""
        return self.slot or hosts_lib.host_name(self.type, self.index)


def cluster_spec(workers: int, ps: int = 0, chief: bool = False, evaluator: bool = False,
                 host: str = "127.0.0.1", multihost: bool = False, hosts=None) -> dict:
    """A cluster of free loopback ports, or with `multihost` of host names, each with the
    same port of its own address, or with `hosts` (Ray's) a free port on each task's node.
    Parameter-server clusters always get a chief."""
    if not is_int(workers, 1):
        raise ValueError(f"`--workers` must be an int >= 1. Received: {workers!r}")
    if not is_int(ps, 0):
        raise ValueError(f"`--ps` must be an int >= 0. Received: {ps!r}")
    def address(job, index):
        if multihost:
            return f"{hosts_lib.host_name(job, index)}:{hosts_lib.PORT}"
        if hosts is not None:
            return hosts.free_address(hosts_lib.host_name(job, index))
        return f"{host}:{free_port(host)}"

    counts = {"chief": int(bool(chief or ps)), "worker": workers, "ps": ps,
              "evaluator": int(bool(evaluator))}
    return {job: [address(job, i) for i in range(count)]
            for job, count in counts.items() if count}


def is_script(recipe: str) -> bool:
    """`kerastrain launch train.py`: a Python script of the user's instead of a recipe."""
    return recipe.endswith(".py")


def tasks_for(spec: dict, recipe: str, sets=(), verbose: bool = False) -> list[Task]:
    """Every task runs the recipe (`kerastrain run` finds its role in TF_CONFIG; `run -v`
    with `verbose`), or the script, whose `Trainer` reads TF_CONFIG; under ps a script's
    workers and ps tasks serve."""
    if is_script(recipe):
        command = [sys.executable, "-m", "kerastrain.cli.script", os.path.abspath(recipe)]
        server = [sys.executable, "-m", "kerastrain.cli.script", "--serve"]
    else:
        command = [sys.executable, "-m", "kerastrain.cli", "run", recipe] + \
            (["-v"] if verbose else [])
        for item in sets:
            command += ["--set", item]
        server = command
    training = {k: v for k, v in spec.items() if k != "evaluator"}
    tasks = []
    for job in ("chief", "worker", "ps", "evaluator"):
        for index in range(len(spec.get(job, ()))):
            # The evaluator is not part of the training cluster: a coordinator that sees
            # it in the cluster spec waits for it forever (tensorflow#46169).
            config = {"cluster": spec if job == "evaluator" else training,
                      "task": {"type": job, "index": index}}
            serves = "ps" in spec and job in ("worker", "ps")
            tasks.append(Task(job, index, json.dumps(config), server if serves else command))
    return tasks


def service_tasks(workers: int, sets=(), multihost: bool = False) -> tuple[list[Task], list]:
    """A tf.data service dispatcher and `workers` workers on loopback ports (none for 0), or
    with `multihost` on hosts of their own, and the `--set` items that point the recipe's
    training data at it."""
    if not is_int(workers, 0):
        raise ValueError(f"`--service-workers` must be an int >= 0. Received: {workers!r}")
    if not workers:
        return [], list(sets)
    command = [sys.executable, "-m", "kerastrain.data.service"]
    if multihost:
        dispatcher = f"{hosts_lib.host_name('data_dispatcher', 0)}:{hosts_lib.SERVICE_PORT}"
        port = hosts_lib.SERVICE_PORT
        workers_at = [(hosts_lib.host_name("data_worker", i), hosts_lib.SERVICE_PORT)
                      for i in range(workers)]
    else:
        port = free_port()
        dispatcher = f"127.0.0.1:{port}"
        workers_at = [("127.0.0.1", free_port()) for _ in range(workers)]
    tasks = [Task("data_dispatcher", 0, "", command + ["dispatcher", "--port", str(port)])]
    # Fixed ports: a worker restarted at its address lets the dispatcher's jobs end. Its
    # host is how the dispatcher tells consumers to reach it.
    tasks += [Task("data_worker", i, "", command + [
        "worker", "--dispatcher", dispatcher, "--port", str(worker_port), "--host", host])
        for i, (host, worker_port) in enumerate(workers_at)]
    return tasks, list(sets) + [f"data.service=grpc://{dispatcher}"]


def chief_of(tasks: list[Task]) -> Task:
    return next((t for t in tasks if t.type == "chief"), None) or next(
        t for t in tasks if t.type == "worker" and t.index == 0)


def dry_run(tasks: list[Task], out=None) -> None:
    out = out or sys.stdout  # the current one: a default bound at import would outlive it
    for task in tasks:
        print(f"[{task.name}] TF_CONFIG='{task.tf_config}'", file=out)
        print(f"[{task.name}] {' '.join(task.command)}", file=out)

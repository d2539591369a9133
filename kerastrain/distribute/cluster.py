"""TF_CONFIG parsing, chief detection, local in-process clusters and task servers."""

from __future__ import annotations

import dataclasses
import errno
import json
import logging
import os
import random
import socket
import tempfile
import threading
import time

from kerastrain.distribute import network

logger = logging.getLogger("kerastrain")

_TASK_TYPES = ("chief", "worker", "ps", "evaluator")


@dataclasses.dataclass(frozen=True)
class ClusterConfig:
    """A parsed, validated `TF_CONFIG`."""

    cluster: dict
    task_type: str
    task_index: int
    rpc_layer: str = "grpc"

    @property
    def num_workers(self) -> int:
        return len(self.cluster.get("worker", ())) + len(self.cluster.get("chief", ()))

    @property
    def num_ps(self) -> int:
        return len(self.cluster.get("ps", ()))

    @property
    def is_chief(self) -> bool:
        if self.task_type == "chief":
            return True
        return self.task_type == "worker" and self.task_index == 0 and "chief" not in self.cluster


def this_task_is_chief(environ=None) -> bool:
    """Whether this process is its job's chief: without `TF_CONFIG` it is alone, so it is."""
    config = read_tf_config(environ)
    return config is None or config.is_chief


def read_tf_config(environ=None) -> ClusterConfig | None:
    """Parse `TF_CONFIG` from the environment, or return None when it is absent.

    Raises:
        ValueError: the JSON is malformed or does not describe this task.
    """
    environ = os.environ if environ is None else environ
    raw = environ.get("TF_CONFIG", "").strip()
    if not raw:
        return None
    try:
        data = json.loads(raw)
    except json.JSONDecodeError as e:
        raise ValueError(
            f"`TF_CONFIG` is not valid JSON ({e.msg} at character {e.pos}). "
            f"Received: TF_CONFIG={raw[:200]!r}. Expected e.g. "
            '{"cluster": {"worker": ["host:port", ...]}, "task": {"type": "worker", "index": 0}}'
        ) from None
    if not isinstance(data, dict):
        raise ValueError(f"`TF_CONFIG` must be a JSON object. Received: TF_CONFIG={raw[:200]!r}")
    cluster = data.get("cluster") or {}
    task = data.get("task") or {}
    if not cluster:
        return None  # A TF_CONFIG without a cluster describes a single machine.
    if not isinstance(cluster, dict) or not all(
        isinstance(v, list) and all(isinstance(a, str) for a in v) for v in cluster.values()
    ):
        raise ValueError(
            "`TF_CONFIG['cluster']` must map job names to lists of 'host:port' strings. "
            f"Received: cluster={cluster!r}"
        )
    unknown = sorted(set(cluster) - set(_TASK_TYPES))
    if unknown:
        raise ValueError(
            f"`TF_CONFIG['cluster']` has unknown job names {unknown}. "
            f"Valid job names: {list(_TASK_TYPES)}."
        )
    task_type = task.get("type")
    task_index = task.get("index", 0)
    if task_type not in cluster:
        raise ValueError(
            "`TF_CONFIG['task']['type']` must name a job of the cluster "
            f"({sorted(cluster)}). Received: task={task!r}"
        )
    if not isinstance(task_index, int) or not 0 <= task_index < len(cluster[task_type]):
        raise ValueError(
            f"`TF_CONFIG['task']['index']` must be between 0 and {len(cluster[task_type]) - 1} "
            f"for job {task_type!r}. Received: task={task!r}"
        )
    if len(cluster.get("chief", ())) > 1:
        raise ValueError(
            f"A cluster has at most one chief. Received: chief={cluster['chief']!r}"
        )
    return ClusterConfig(
        cluster=cluster, task_type=task_type, task_index=task_index,
        rpc_layer=data.get("rpc_layer") or "grpc",
    )


def free_port(host: str = "127.0.0.1") -> int:
    """A port for a server of a local cluster, free now and reserved for this process's life.

    Asking the OS for any port (bind to port 0, then close) is not enough: nothing stops the
    same port going to another caller (another test, another launch, or this process again)
    before the server binds it, and it comes from the ephemeral range, where every outgoing
    connection also takes its local port. Two tasks then meet on one port, or a task's port
    is taken by a stranger. So the port is chosen below the ephemeral range, must be
    bindable on every interface now
    (TensorFlow binds 0.0.0.0, the tf.data service [::]), and is reserved: a byte-range lock
    on one shared file, one byte per port, which the kernel drops when this process ends.
    Within the process a set keeps it from being handed out twice.
    """
    with _PORTS_LOCK:
        for _ in range(200):
            port = _candidate()
            if port is None:  # no range to choose from: the OS's choice, as before
                with socket.socket() as s:
                    s.bind((host, 0))
                    return s.getsockname()[1]
            if port in _RESERVED or not _bindable(port) or not _reserve(port):
                continue
            _RESERVED.add(port)
            return port
    raise RuntimeError(f"No free port found for a local cluster between {_LOWEST} and the "
                       "ephemeral range after 200 tries; too many servers of local clusters "
                       "are running on this machine. Stop some, or pass explicit addresses.")


_LOWEST = 20000
# Ports are drawn from a generator of their own: Keras seeds its initializers from Python's
# `random`, which `keras.utils.set_random_seed` seeds; draws from it here (as many as ports
# turned out taken) gave a seeded script other initial weights on each run under ps.
_PORT_DRAWS = random.Random()
_PORTS_LOCK = threading.Lock()
_RESERVED: set = set()
_reservations = None  # the open reservation file (closing it would drop every reservation)


def _candidate():
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            ephemeral = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    if ephemeral - _LOWEST < 1000:
        return None
    return _PORT_DRAWS.randrange(_LOWEST, ephemeral)


def _bindable(port):
    for family, address in ((socket.AF_INET, ("0.0.0.0", port)), (socket.AF_INET6, ("::", port))):
        try:
            with socket.socket(family) as s:
                s.bind(address)
        except OSError as e:
            if family == socket.AF_INET6 and e.errno in (errno.EAFNOSUPPORT, errno.EADDRNOTAVAIL):
                continue  # no IPv6 here
            return False
    return True


def _reserve(port):
    """Lock byte `port` of the machine's reservation file; False when another process holds it."""
    global _reservations
    try:
        import fcntl
    except ImportError:  # Windows: the in-process set and the bind check only
        return True
    if _reservations is None:
        path = os.path.join(tempfile.gettempdir(), f"kerastrain-ports-{os.getuid()}")
        _reservations = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.lockf(_reservations, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, port)
    except OSError:
        return False
    return True


def ports(cluster: dict) -> list[int]:
    """The ports of a cluster spec's addresses, in job order."""
    return [int(address.rsplit(":", 1)[1]) for tasks in cluster.values() for address in tasks]


def start_local_ps_cluster(num_workers: int, num_ps: int, num_gpus_per_worker: int = 0):
    """Start `num_workers` worker and `num_ps` ps servers in this process.

    They are addressed as 127.0.0.1:PORT, but TensorFlow's servers listen on every interface
    (0.0.0.0, hard-coded): only a private network namespace keeps them to this machine
    (kerastrain.distribute.network).

    Returns:
        (cluster_resolver, servers). Keep `servers` referenced for as long as the
        cluster is used.
    """
    import tensorflow as tf

    spec = {
        "worker": [f"127.0.0.1:{free_port()}" for _ in range(num_workers)],
        "ps": [f"127.0.0.1:{free_port()}" for _ in range(num_ps)],
    }
    cluster_spec = tf.train.ClusterSpec(spec)
    worker_config = tf.compat.v1.ConfigProto()
    # With few cores, in-process workers deadlock unless each can run one op per
    # worker plus its own (TensorFlow's PS tutorial gives the same rule).
    worker_config.inter_op_parallelism_threads = max(num_workers + 1, os.cpu_count() or 1)
    if num_gpus_per_worker:
        worker_config.device_count["GPU"] = num_gpus_per_worker
    servers = [
        tf.distribute.Server(cluster_spec, job_name="worker", task_index=i,
                             config=worker_config, protocol="grpc")
        for i in range(num_workers)
    ] + [
        tf.distribute.Server(cluster_spec, job_name="ps", task_index=i, protocol="grpc")
        for i in range(num_ps)
    ]
    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(cluster_spec, rpc_layer="grpc")
    return resolver, servers


def _reachable(address: str, timeout: float = 1.0) -> bool:
    return _knock(address, timeout) == "up"


def _knock(address: str, timeout: float = 1.0) -> str:
    """"up" (something listens), "refused" (the host answers that nothing does: a server
    that ended) or "silent" (no answer: the host is frozen, partitioned or gone)."""
    host, port = address.rsplit(":", 1)
    try:
        with socket.create_connection((host, int(port)), timeout=timeout):
            return "up"
    except ConnectionRefusedError:
        return "refused"
    except OSError:
        return "silent"


def end_together(config: ClusterConfig, *, timeout: float = 60.0, clock=time.monotonic,
                 sleep=time.sleep) -> None:
    """End one task of a multi-worker mirrored job so that no task reports the others gone.

    TensorFlow's coordination service runs in the leader task (the chief, else worker 0),
    and every other task keeps a call open to it. A task still alive when the leader exits
    logs "StartAbort UNAVAILABLE: Failed to send RPC to coordination service" though the
    job succeeded. So: every task waits at a barrier (all have finished); then the others
    exit, and the leader waits until their servers are gone (at most `timeout` seconds)
    before it exits last. A peer that died already fails the barrier: then this returns at
    once, and the failure is reported by whoever noticed it.
    """
    import tensorflow as tf  # noqa: F401 (the context below is TensorFlow's)

    from kerastrain import _compat
    if not _compat.wait_at_barrier("kerastrain_end", int(timeout * 1000)):
        return
    leader = ("chief", 0) if config.cluster.get("chief") else ("worker", 0)
    if (config.task_type, config.task_index) != leader:
        return
    peers = [address for job in ("chief", "worker") for i, address in
             enumerate(config.cluster.get(job, ())) if (job, i) != leader]
    deadline = clock() + timeout
    while peers and clock() < deadline:
        peers = [address for address in peers if _reachable(address, timeout=0.5)]
        if peers:
            sleep(0.05)


def serve(config: ClusterConfig | None = None, *, startup_timeout: float = 600.0,
          max_seconds: float | None = None, poll_seconds: float = 1.0,
          silent_seconds: float = 600.0, clock=time.monotonic, sleep=time.sleep) -> str:
    """Run this process's `worker`/`ps` server until the chief's job ends.

    TensorFlow servers never stop by themselves, so the task watches the chief's
    address: once it has been up and then refuses connections for three polls (its host
    answers that nothing listens), the job is over and this returns. A chief that does not
    answer at all is frozen, partitioned, or on a host that is gone: a network blip must not
    end every server of the job, so that is waited out for `silent_seconds` (then
    "chief-unreachable"). It also returns if the chief never appears within
    `startup_timeout`, or after `max_seconds`.

    Returns:
        Why it stopped: "chief-finished", "chief-unreachable", "chief-never-started" or
        "max-seconds".

    Raises:
        ValueError: no TF_CONFIG, or this task is not a `worker`/`ps` task.
    """
    import tensorflow as tf

    config = config or read_tf_config()
    if config is None or config.task_type not in ("worker", "ps"):
        raise ValueError(
            "`serve()` runs the server of a `worker` or `ps` task and needs `TF_CONFIG` "
            f"describing one. Received: task={None if config is None else config.task_type!r}"
        )
    server_config = tf.compat.v1.ConfigProto()
    if config.task_type == "worker":
        server_config.inter_op_parallelism_threads = max(
            config.num_workers + 1, os.cpu_count() or 1)
    # Held for the life of this function: the server runs as long as its object lives.
    server = tf.distribute.Server(  # noqa: F841
        tf.train.ClusterSpec(config.cluster), job_name=config.task_type,
        task_index=config.task_index, config=server_config,
        protocol=config.rpc_layer, start=True)
    # TensorFlow's server.target says localhost; it listens on every interface, so say that.
    port = int(config.cluster[config.task_type][config.task_index].rsplit(":", 1)[1])
    logger.info("serving %s:%d on port %d of %s until the chief finishes", config.task_type,
                config.task_index, port, network.where())
    chief = config.cluster.get("chief", config.cluster.get("worker"))[0]
    start = clock()
    seen, misses, silent_since = False, 0, None
    while True:
        now = clock()
        if max_seconds is not None and now - start >= max_seconds:
            return "max-seconds"
        answer = _knock(chief)
        if answer == "up":
            seen, misses, silent_since = True, 0, None
        elif seen and answer == "refused":
            misses, silent_since = misses + 1, None
            if misses >= 3:
                return "chief-finished"
        elif seen:
            silent_since = now if silent_since is None else silent_since
            if now - silent_since >= silent_seconds:
                return "chief-unreachable"
        elif now - start >= startup_timeout:
            return "chief-never-started"
        sleep(poll_seconds)


def main() -> int:
    """`python -m kerastrain.distribute.cluster`: serve this `worker`/`ps` task until the chief ends."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    reason = serve()
    logger.info("server stopping: %s", reason)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())


def tf_config_from_slurm(strategy_name: str, num_ps: int = 1, port_base: int = 8888) -> str:
    """The `TF_CONFIG` of this Slurm task, from Slurm's environment (one task per process).

    Multi-worker mirrored: every task is a worker. Parameter servers: task 0 is the
    chief (coordinator), the next `num_ps` are ps tasks, the rest workers.
    """
    import tensorflow as tf

    environ_tasks = int(os.environ.get("SLURM_STEP_NUM_TASKS") or os.environ.get(
        "SLURM_NTASKS") or 0)
    if "SLURM_PROCID" not in os.environ or not environ_tasks:
        raise ValueError(
            "`cluster_resolver: slurm` needs to run inside a Slurm job step (srun), which sets "
            "SLURM_PROCID and SLURM_STEP_NUM_TASKS. Received: SLURM_PROCID="
            f"{os.environ.get('SLURM_PROCID')!r}, SLURM_STEP_NUM_TASKS="
            f"{os.environ.get('SLURM_STEP_NUM_TASKS')!r}")
    if strategy_name == "ps":
        if environ_tasks < num_ps + 2:
            raise ValueError(
                f"A parameter-server job needs a chief, {num_ps} ps and at least one worker: "
                f"{num_ps + 2} Slurm tasks or more. Received: {environ_tasks} tasks")
        jobs = {"chief": 1, "ps": num_ps, "worker": environ_tasks - 1 - num_ps}
    else:
        jobs = {"worker": environ_tasks}
    # GPU placement is left to TensorFlow (auto_set_gpu=False); the resolver still
    # divides GPUs among tasks and fails on nodes without any (a zero range step), so
    # give it a count that cannot run out. Only hosts and ports are used here.
    resolver = tf.distribute.cluster_resolver.SlurmClusterResolver(
        jobs=jobs, port_base=port_base, auto_set_gpu=False, gpus_per_node=1024,
        gpus_per_task=1)
    spec = resolver.cluster_spec().as_dict()
    return json.dumps({"cluster": {job: list(tasks) for job, tasks in spec.items()},
                       "task": {"type": resolver.task_type, "index": resolver.task_id}})


def use_slurm(strategy_name: str, options: dict) -> None:
    """With `cluster_resolver: slurm`, set TF_CONFIG from Slurm's environment (once)."""
    if options.get("cluster_resolver") != "slurm" or os.environ.get("KERASTRAIN_TF_CONFIG_FROM"):
        return
    os.environ["TF_CONFIG"] = tf_config_from_slurm(
        strategy_name, num_ps=options.get("num_ps") or 1)
    os.environ["KERASTRAIN_TF_CONFIG_FROM"] = "slurm"
    logger.info("TF_CONFIG from Slurm: %s", os.environ["TF_CONFIG"])

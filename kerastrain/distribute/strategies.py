"""Strategy names and options -> built `tf.distribute` strategies, and the "auto" choice."""

from __future__ import annotations

import dataclasses
import difflib
import logging
from typing import Any, Callable, Mapping

from kerastrain import _logging
from kerastrain.distribute import cluster as cluster_lib
from kerastrain.distribute import network as network_lib
from kerastrain.distribute import user_scope
from kerastrain.distribute.devices import (  # configure_cpu_devices: public here too
    configure_cpu_devices, gpus, local_devices, on_one_device)
from kerastrain.distribute.ps import partitioning
from kerastrain._options import is_int, is_number

logger = logging.getLogger("kerastrain")


@dataclasses.dataclass
class BuiltStrategy:
    """A strategy plus what the trainer needs to know about it."""

    strategy: Any
    name: str
    reason: str
    is_chief: bool = True
    coordinator: Any = None          # ClusterCoordinator under parameter servers
    num_workers: int = 1             # input pipelines / PS workers
    keep_alive: tuple = ()           # in-process servers of a local cluster
    options: dict = dataclasses.field(default_factory=dict)  # as checked by `normalize`

    @property
    def is_parameter_server(self) -> bool:
        return self.coordinator is not None

    @property
    def is_multi_worker(self) -> bool:
        """Workers run collectives together, so they must agree on where to stop."""
        return self.name == "multi_worker_mirrored"

    @property
    def replica_devices(self) -> tuple:
        """The devices this task's replicas run on (empty where the strategy does not say)."""
        try:
            return tuple(self.strategy.extended.worker_devices)
        except (AttributeError, RuntimeError, NotImplementedError):
            return ()

    @property
    def on_gpu(self) -> bool:
        """Whether this task's replicas run on GPUs."""
        return any("GPU" in str(d).upper() for d in self.replica_devices)

    @property
    def places_variables(self) -> bool:
        """Whether variables must be created inside the scope to be placed right."""
        return self.name not in ("default", "one_device")


# ---------------------------------------------------------------------------
# Option checking


def _check_int(name, minimum):
    def check(key, value):
        if not is_int(value, minimum):
            raise ValueError(
                f"Strategy option `{key}` must be an int >= {minimum}. Received: {key}={value!r}")
        return value
    return check


def _check_choice(*choices):
    def check(key, value):
        if value not in choices:
            raise ValueError(
                f"Strategy option `{key}` must be one of {list(choices)}. "
                f"Received: {key}={value!r}")
        return value
    return check


def _check_str(key, value):
    if not isinstance(value, str) or not value:
        raise ValueError(f"Strategy option `{key}` must be a device string such as "
                         f"'/cpu:0' or '/gpu:0'. Received: {key}={value!r}")
    return value


def _check_devices(key, value):
    if isinstance(value, str) or not isinstance(value, (list, tuple)) or not value or not all(
            isinstance(d, str) and d for d in value):
        raise ValueError(f"Strategy option `{key}` must be a non-empty list of device strings "
                         f"such as ['/gpu:0', '/gpu:1']. Received: {key}={value!r}")
    return list(value)


def _check_seconds(key, value):
    if value is not None and not is_number(value, above=0):
        raise ValueError(f"Strategy option `{key}` must be a number of seconds > 0, or null "
                         f"(never). Received: {key}={value!r}")
    return value


def _check_partitioner(key, value):
    return partitioning.check_partitioner(value, key=f"Strategy option `{key}`")


_COMMON = {"cpu_devices": _check_int("cpu_devices", 1)}


@dataclasses.dataclass(frozen=True)
class _Spec:
    build: Callable[..., BuiltStrategy]
    options: Mapping[str, Callable]


_REGISTRY: dict[str, _Spec] = {}
_ALIASES = {"parameter_server": "ps", "mwm": "multi_worker_mirrored",
            "multi_worker": "multi_worker_mirrored", "onedevice": "one_device"}


# A tf.distribute strategy object given instead of a name: the name that builds it.
_NAME_OF_CLASS = {"MirroredStrategy": "mirrored", "OneDeviceStrategy": "one_device",
                  "MultiWorkerMirroredStrategy": "multi_worker_mirrored",
                  "CollectiveAllReduceStrategy": "multi_worker_mirrored",
                  "CentralStorageStrategy": "central_storage",
                  "ParameterServerStrategy": "ps", "ParameterServerStrategyV2": "ps",
                  "_DefaultDistributionStrategy": "default"}


def _register(name, **options):
    def wrap(fn):
        _REGISTRY[name] = _Spec(fn, {**_COMMON, **options})
        return fn
    return wrap


def strategy_names() -> list[str]:
    return sorted(_REGISTRY) + sorted(_ALIASES)


def normalize(strategy, strategy_options=None) -> tuple[str, dict]:
    """Split `strategy=` (a name or {"name": ..., **options}) into a checked name and options.

    Raises:
        ValueError: unknown name or option, or an option of the wrong type.
    """
    options = {}
    if isinstance(strategy, Mapping):
        options = dict(strategy)
        if "name" not in options:
            raise ValueError("A strategy mapping needs a `name` key, e.g. "
                             f"{{'name': 'mirrored', 'devices': ['/gpu:0']}}. Received: strategy={strategy!r}")
        strategy = options.pop("name")
    if strategy is None:
        strategy = "auto"
    if not isinstance(strategy, str):
        named = _NAME_OF_CLASS.get(type(strategy).__name__)
        raise TypeError(
            "`strategy` must be a strategy name or a mapping {'name': ..., **options}; "
            "kerastrain builds the tf.distribute strategy itself"
            + (f" (for a {type(strategy).__name__}: strategy={named!r}, its devices or cluster "
               "as options)" if named else "") + f". Received: strategy={strategy!r} "
            f"of type {type(strategy).__name__}")
    name = _ALIASES.get(strategy.lower(), strategy.lower())
    if name not in _REGISTRY:
        close = difflib.get_close_matches(strategy.lower(), strategy_names(), n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise ValueError(f"Unknown strategy {strategy!r}.{hint} Valid names: {strategy_names()}. "
                         f"Received: strategy={strategy!r}")
    options.update(strategy_options or {})
    spec = _REGISTRY[name]
    checked = {}
    for key, value in options.items():
        if key not in spec.options:
            close = difflib.get_close_matches(key, list(spec.options), n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise ValueError(f"Unknown option {key!r} for strategy {name!r}.{hint} "
                             f"Valid options: {sorted(spec.options)}. Received: {key}={value!r}")
        checked[key] = spec.options[key](key, value)
    return name, checked


def local_cluster_network(strategy, environ=None) -> str | None:
    """`network` of a strategy that starts a local in-process cluster, else None.

    Decided from the recipe alone, before TensorFlow: `ps` with no `TF_CONFIG` (nor Slurm).
    A strategy that does not validate gives None: validation reports it right after.
    """
    try:
        name, options = normalize(strategy)
        config = cluster_lib.read_tf_config(environ)
    except (ValueError, TypeError):
        return None
    if name != "ps" or config is not None or options.get("cluster_resolver") == "slurm":
        return None
    return options.get("network", network_lib.PRIVATE)


def build_strategy(strategy="auto", strategy_options=None) -> BuiltStrategy:
    """Build a `tf.distribute` strategy from a name plus options.

    Example:
        >>> built = build_strategy({"name": "mirrored", "cpu_devices": 2})
        >>> built.strategy.num_replicas_in_sync
        2
    """
    name, options = normalize(strategy, strategy_options)
    user_scope.check_outside()
    cluster_lib.use_slurm(name, options)
    if "cpu_devices" in options:
        configure_cpu_devices(options["cpu_devices"])
    built = _REGISTRY[name].build(**options)
    built.options = options
    _logging.say_devices()  # once, where TensorFlow's start-up lines were held back
    logger.info("strategy: %s (%s)%s", built.name, built.reason, _asynchronous_note(built))
    return built


def default_for_instance(built, model):
    """Under `one_device`, the default strategy for a model instance whose variables already
    live on its device: training on one device is the same, and the instance trains as it
    is, with no copy (Keras clones only Sequential and functional models, and a copy from a
    config loses what the config does not say). None for any other case."""
    import keras
    if built.name != "one_device" or not isinstance(model, keras.Model):
        return None
    device = built.strategy.extended.worker_devices[0]
    if not on_one_device(model, device):
        return None
    fallback = _REGISTRY["default"].build()
    fallback.reason = (
        f"one_device was chosen ({built.reason}); the model instance's variables are on "
        f"{device}, so the default strategy trains it there as it is, the same training")
    logger.info("strategy: %s (%s)", fallback.name, fallback.reason)
    return fallback


def _asynchronous_note(built):
    """What a ps user must read before meeting it: with several workers, updates are
    asynchronous (docs/parameter_servers.md has the measured spread)."""
    if not built.is_parameter_server or built.num_workers < 2:
        return ""
    return (f"; its {built.num_workers} workers update the variables asynchronously, each "
            "step reading weights others may be updating: losses differ from one device's "
            "and from run to run (one worker runs the steps in order)")


# ---------------------------------------------------------------------------
# Builders


def choose_auto(config, num_gpus, cpu_devices=None):
    """The `auto` rule as a pure function: (strategy name, reason)."""
    if config is not None and config.num_ps:
        return "ps", f"auto: TF_CONFIG has {config.num_ps} ps task(s)"
    if config is not None and config.num_workers > 1:
        return "multi_worker_mirrored", f"auto: TF_CONFIG has {config.num_workers} workers"
    if num_gpus > 1:
        return "mirrored", f"auto: {num_gpus} GPUs on this machine"
    if num_gpus == 1:
        return "one_device", "auto: one GPU on this machine"
    if cpu_devices and cpu_devices > 1:
        return "mirrored", f"auto: no GPU, CPU split into {cpu_devices} logical devices"
    return "default", "auto: no GPU and no cluster, training on the CPU"


@_register("auto")
def _build_auto(cpu_devices=None):
    import tensorflow as tf
    # Physical devices: listing logical ones would start TensorFlow's runtime, after
    # which multi-worker mirrored can no longer be built in this process.
    num_gpus = len(tf.config.list_physical_devices("GPU"))
    name, reason = choose_auto(cluster_lib.read_tf_config(), num_gpus, cpu_devices)
    built = _REGISTRY[name].build()
    built.reason = reason
    return built


@_register("default")
def _build_default(cpu_devices=None):
    import tensorflow as tf
    return BuiltStrategy(tf.distribute.get_strategy(), "default", "requested")


@_register("one_device", device=_check_str)
def _build_one_device(device=None, cpu_devices=None):
    import tensorflow as tf
    device = device or ("/gpu:0" if gpus() else "/cpu:0")
    return BuiltStrategy(tf.distribute.OneDeviceStrategy(device), "one_device", f"on {device}")


_CROSS_DEVICE_OPS = {
    "nccl": lambda tf: tf.distribute.NcclAllReduce(),
    "hierarchical_copy": lambda tf: tf.distribute.HierarchicalCopyAllReduce(),
    "reduction_to_one_device": lambda tf: tf.distribute.ReductionToOneDevice(),
}


_MIRRORED = {}  # (devices, cross_device_ops) -> the process's MirroredStrategy for them


def choose_cross_device_ops(devices, nccl_available):
    """The all-reduce for mirrored over `devices` when none is given: (name or None, why).

    Two or more GPUs: NCCL where TensorFlow has it (Linux CUDA builds), else
    hierarchical copy (GPU-to-GPU copies, which beat TensorFlow's fallback of reducing
    everything on one device). One device, or CPUs: reduction to one device (TensorFlow's
    choice for CPUs; NCCL needs GPUs).
    """
    gpus = [d for d in devices if "GPU" in d.upper()]
    if len(gpus) < 2 or len(gpus) != len(devices):
        return "reduction_to_one_device", (
            f"reduction to one device ({len(devices)} device(s), {len(gpus)} GPU(s))")
    if nccl_available:
        return "nccl", f"NCCL all-reduce ({len(gpus)} GPUs)"
    return "hierarchical_copy", f"hierarchical-copy all-reduce ({len(gpus)} GPUs, no NCCL)"


def _nccl_available():
    import platform

    import tensorflow as tf
    return platform.system() == "Linux" and bool(tf.sysconfig.get_build_info().get("is_cuda_build"))


@_register("mirrored", devices=_check_devices,
           cross_device_ops=_check_choice(*_CROSS_DEVICE_OPS))
def _build_mirrored(devices=None, cross_device_ops=None, cpu_devices=None):
    import tensorflow as tf
    devices = devices or local_devices()
    # One strategy per device set for the whole process: each MirroredStrategy numbers
    # its collective groups and instances from the same start, so a second one over the
    # same devices reuses the first one's keys, and two models of different shapes then
    # fail with "Shape mismatch in the collective instance" (a notebook training two
    # models in turn). Variables and functions of several Trainers share it safely.
    chosen = f"{cross_device_ops} all-reduce (requested)"
    if cross_device_ops is None:
        cross_device_ops, chosen = choose_cross_device_ops(devices, _nccl_available())
    key = (tuple(devices), cross_device_ops)
    if key not in _MIRRORED:
        ops = _CROSS_DEVICE_OPS[cross_device_ops](tf)
        _MIRRORED[key] = tf.distribute.MirroredStrategy(devices, cross_device_ops=ops)
    return BuiltStrategy(_MIRRORED[key], "mirrored",
                         f"{len(devices)} replicas on {devices}, {chosen}")


@_register("central_storage", compute_devices=_check_devices, parameter_device=_check_str)
def _build_central_storage(compute_devices=None, parameter_device=None, cpu_devices=None):
    import tensorflow as tf
    devices = compute_devices or local_devices()
    strategy = tf.distribute.experimental.CentralStorageStrategy(
        compute_devices=devices, parameter_device=parameter_device)
    return BuiltStrategy(strategy, "central_storage",
                         f"{len(devices)} replicas on {devices}, variables on "
                         f"{parameter_device or 'the CPU'}")


_RESOLVER = _check_choice("tf_config", "slurm")


@_register("multi_worker_mirrored", communication=_check_choice("auto", "ring", "nccl"),
           cluster_resolver=_RESOLVER, timeout_seconds=_check_int("timeout_seconds", 1))
def _build_mwm(communication="auto", cpu_devices=None, cluster_resolver="tf_config",
               timeout_seconds=None):
    import tensorflow as tf
    config = cluster_lib.read_tf_config()
    implementation = {
        "auto": tf.distribute.experimental.CommunicationImplementation.AUTO,
        "ring": tf.distribute.experimental.CommunicationImplementation.RING,
        "nccl": tf.distribute.experimental.CommunicationImplementation.NCCL,
    }[communication]
    try:
        strategy = tf.distribute.MultiWorkerMirroredStrategy(
            communication_options=tf.distribute.experimental.CommunicationOptions(
                implementation=implementation, timeout_seconds=timeout_seconds))
    except RuntimeError as e:
        raise RuntimeError(
            "`multi_worker_mirrored` must be built before TensorFlow runs any operation in "
            "this process (TensorFlow configures collectives at start-up), and building a model "
            "runs operations. Create the Trainer first thing in your program, with a function "
            "that builds and compiles the model (`Trainer(build_model, ...)`) rather than a "
            f"model built before it. TensorFlow said: {e}") from None
    if config is None:
        return BuiltStrategy(strategy, "multi_worker_mirrored",
                             "no TF_CONFIG: one local worker")
    return BuiltStrategy(
        strategy, "multi_worker_mirrored",
        f"{config.num_workers} workers from TF_CONFIG, this is {config.task_type}:{config.task_index}",
        is_chief=config.is_chief, num_workers=config.num_workers)


_LOCAL_PS_CACHE: dict = {}


@_register("ps", num_workers=_check_int("num_workers", 1), num_ps=_check_int("num_ps", 1),
           num_gpus_per_worker=_check_int("num_gpus_per_worker", 0), cluster_resolver=_RESOLVER,
           variable_partitioner=_check_partitioner,
           network=_check_choice(*network_lib.NETWORKS),
           frozen_worker_timeout=_check_seconds)
def _build_ps(num_workers=None, num_ps=None, num_gpus_per_worker=0, cpu_devices=None,
              cluster_resolver="tf_config", variable_partitioner=None,
              network=network_lib.PRIVATE, frozen_worker_timeout=None):
    # `frozen_worker_timeout` is the coordinator's (kerastrain.loop.ps.liveness), read from
    # `BuiltStrategy.options` by the parameter-server mode.
    import tensorflow as tf

    from kerastrain import _compat
    config = cluster_lib.read_tf_config()
    partitioner = partitioning.build_partitioner(variable_partitioner)
    split = ("; variables split by " + partitioning.describe(variable_partitioner)
             if variable_partitioner else "")
    if config is None:
        num_workers, num_ps = num_workers or 2, num_ps or 1
        key = (num_workers, num_ps, num_gpus_per_worker)
        if key not in _LOCAL_PS_CACHE:
            # A process connects to one cluster; reuse it for every Trainer that asks.
            resolver, servers = cluster_lib.start_local_ps_cluster(
                num_workers, num_ps, num_gpus_per_worker)
            ports = cluster_lib.ports(resolver.cluster_spec().as_dict())
            # TensorFlow binds every interface (no option): say where that reaches, once.
            warning = network_lib.exposure_line(ports, network_lib.avoid_in_process(network))
            if warning:
                logger.warning(warning)
            _collect_before_connecting()
            strategy = tf.distribute.ParameterServerStrategy(resolver)
            coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
            _LOCAL_PS_CACHE[key] = (strategy, coordinator, tuple(servers), ports)
        strategy, coordinator, servers, ports = _LOCAL_PS_CACHE[key]
        # The partitioner is read when variables are created: each Trainer sets its own.
        _compat.set_variable_partitioner(strategy, partitioner)
        return BuiltStrategy(
            strategy, "ps",
            f"no cluster configured: started a local in-process cluster of {num_workers} "
            f"worker(s) and {num_ps} ps, listening on ports {', '.join(map(str, ports))} of "
            f"{network_lib.where()}{split}",
            coordinator=coordinator, num_workers=num_workers, keep_alive=servers)
    if not config.num_ps or "worker" not in config.cluster:
        raise ValueError(
            "Strategy 'ps' needs a cluster with `ps` and `worker` tasks in TF_CONFIG. "
            f"Received: cluster jobs {sorted(config.cluster)}. Add ps tasks, or use "
            "'multi_worker_mirrored' for a cluster of workers only.")
    if config.task_type in ("worker", "ps"):
        raise RuntimeError(
            f"This process is task {config.task_type}:{config.task_index} of a parameter-server "
            "cluster; only the chief (coordinator) builds a Trainer. On worker and ps tasks run "
            "`kerastrain run RECIPE` (it serves them) or `python -m kerastrain.distribute.cluster`.")
    if num_workers is not None or num_ps is not None:
        # The same recipe runs on a laptop (local cluster of this size) and on a cluster.
        logger.info("num_workers/num_ps size a local cluster; TF_CONFIG describes this one "
                    "(%d workers, %d ps), which is used", len(config.cluster["worker"]),
                    config.num_ps)
    # The evaluator is not part of the training cluster: a coordinator that sees it in
    # the cluster spec waits for it forever (tensorflow#46169).
    training = {job: tasks for job, tasks in config.cluster.items() if job != "evaluator"}
    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
        tf.train.ClusterSpec(training), task_type=config.task_type, task_id=config.task_index,
        rpc_layer=config.rpc_layer)
    _collect_before_connecting()
    strategy = tf.distribute.ParameterServerStrategy(resolver, variable_partitioner=partitioner)
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
    return BuiltStrategy(
        strategy, "ps",
        f"{len(config.cluster['worker'])} workers and {config.num_ps} ps from TF_CONFIG{split}",
        coordinator=coordinator, num_workers=len(config.cluster["worker"]),
        is_chief=config.task_type == "chief")


def _collect_before_connecting():
    """Delete this process's garbage functions while its context is still local, and keep
    the live ones from ever being removed remotely.

    Once connected to a cluster, TensorFlow removes each deleted function from every remote
    task too, where one traced before (another Trainer's, a dataset's map) never was, and
    logs an error line for each ("Failed to remove function remotely": about 40 lines after
    a mirrored Trainer in the same script, more when that Trainer is dropped later).
    """
    import gc

    from kerastrain import _compat  # imports Keras: strategies.py itself stays light
    gc.collect()
    _compat.keep_local_functions_local()  # what lives on is never removed remotely
    _compat.skip_function_removal_at_exit()  # nor, at exit, what was traced after

"""The tf.data service: the training pipeline runs on other processes, each example once a pass.

`Trainer(..., data_service="local")` (recipe: `data: {service: local}`) starts an
in-process dispatcher and workers on 127.0.0.1 ports; `{"dispatcher": "grpc://host:port"}`
uses a running dispatcher (`python -m kerastrain.data.service dispatcher|worker`, or
`kerastrain launch --service-workers N`). The training pipeline is then
`dataset.apply(tf.data.experimental.service.distribute("distributed_epoch", ...))`:
the dispatcher splits the pipeline's source (files, `range`, `from_tensor_slices`)
among the service's workers, which run the rest of it (maps, batching), so a pass
over the data produces every example exactly once, whichever consumer reads it.

- One device / mirrored / central storage: one consumer; each pass is one job
  (a new one per pass), so an epoch that reads to the end of the data trains
  every example once. The number of examples that reached training in each pass
  is checked at the pass's end; fewer than expected are reported (a service worker
  lost mid-pass takes the splits it was processing with it).
- Parameter servers: with `steps_per_epoch=None` an epoch is one pass, a job
  (`job_name` "<prefix>/pass/<k>") that every ps worker reads to its end
  (`loop.ps.driver.PSDriver.run_pass`: once one worker's reader has ended, every other
  worker runs loops until its reader has too, so the batches a worker held are
  trained in their own epoch): each example once per epoch, and the examples
  trained are counted as above. With `steps_per_epoch` set (or gradient
  accumulation), epochs count steps of one repeated job: each example once per
  pass, but passes overlap at epoch ends by the batches the workers hold
  (measured: up to 31 of 512 ids not trained, or trained 2-3 times, in one epoch).
- Multi-worker mirrored is refused (its workers must see the end of the data at the
  same step, which a shared job does not promise).

Validation and evaluation never go through the service.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import re
import threading
import uuid

from kerastrain import _options
from kerastrain.data import policy as policy_lib

logger = logging.getLogger("kerastrain")

LOCAL = "local"
MODES = ("distributed_epoch", "parallel_epochs")
# Dataset sources the dispatcher can split (TensorFlow's split providers), by op name.
SPLITTABLE_SOURCES = ("RangeDataset", "TensorSliceDataset", "TensorDataset", "TFRecordDataset",
                      "TFRecordDatasetV2", "TextLineDataset", "FixedLengthRecordDataset",
                      "FixedLengthRecordDatasetV2")
CONNECT_WAIT_SECS = 60.0  # for a dispatcher started at the same time as the trainer
# How often a consumer asks the dispatcher about its job (TF's default, 1 s, ended every
# pass about 0.9 s after its last batch; at 100 ms, ~35 ms: docs/performance.md).
TASK_REFRESH_MS = 100
_ADDRESS = re.compile(r"^(grpc://)?[\w.\-\[\]:]+:\d+$")


@dataclasses.dataclass(frozen=True, kw_only=True)
class ServiceOptions:
    """Where the tf.data service is, and how it splits the data.

    Attributes:
        dispatcher: "local" (an in-process dispatcher and `workers` workers on
            127.0.0.1 ports, stopped at `Trainer.close` or exit), or the address of a
            running dispatcher, "grpc://host:port".
        workers: with "local", how many in-process workers (>= 1).
        processing_mode: "distributed_epoch" (default: each example once per pass;
            the pipeline must start from files, `range` or `from_tensor_slices`), or
            "parallel_epochs" (every service worker reads all the data: each example
            is trained once per worker per pass).
        network: with "local", "private" (default: `kerastrain run` moves the process
            into a private network namespace first, as for a local ps cluster) or
            "host" (the servers stay reachable from the network; a warning says so).
    """

    dispatcher: str = LOCAL
    workers: int = 2
    processing_mode: str = "distributed_epoch"
    network: str = "private"

    def __post_init__(self):
        if not isinstance(self.dispatcher, str) or not (
                self.dispatcher == LOCAL or _ADDRESS.match(self.dispatcher)):
            raise ValueError(
                "`data_service.dispatcher` must be 'local' (an in-process service on this "
                "machine) or a dispatcher's address 'grpc://host:port'. "
                f"Received: dispatcher={self.dispatcher!r}")
        if not _options.is_int(self.workers, 1):
            raise ValueError("`data_service.workers` must be an int >= 1 (in-process workers "
                             f"of the 'local' service). Received: workers={self.workers!r}")
        if self.network not in ("private", "host"):
            raise ValueError("`data_service.network` must be 'private' or 'host'. "
                             f"Received: network={self.network!r}")
        if self.processing_mode not in MODES:
            raise ValueError(f"`data_service.processing_mode` must be one of {list(MODES)}. "
                             f"Received: processing_mode={self.processing_mode!r}")

    @property
    def address(self) -> str | None:
        """The dispatcher's "grpc://host:port", None for "local" (known once started)."""
        if self.dispatcher == LOCAL:
            return None
        return self.dispatcher if self.dispatcher.startswith("grpc://") else \
            "grpc://" + self.dispatcher

    @classmethod
    def coerce(cls, value):
        """None (no service), "local", "grpc://host:port", a mapping of fields, or an instance."""
        if isinstance(value, str):
            return cls(dispatcher=value)
        if value is True or not (value is None or value is False or isinstance(value, (cls, dict))):
            raise TypeError("`data_service` must be None, 'local', 'grpc://host:port', or a "
                            "mapping {'dispatcher': ..., 'workers': ..., 'processing_mode': ...}. "
                            f"Received: data_service={value!r} of type {type(value).__name__}")
        return _options.coerce(cls, value, "data_service")


def local_network(value) -> str | None:
    """`network` of a recipe's `data.service` that starts a local service, else None
    (for `kerastrain run`, before TensorFlow; a bad value gives None, validation says why)."""
    try:
        options = ServiceOptions.coerce(value)
    except (ValueError, TypeError):
        return None
    return options.network if options is not None and options.dispatcher == LOCAL else None


def check_strategy(options, built, policy):
    """Refuse a strategy the service cannot keep exact (multi-worker mirrored), as its
    `data.policy.InputPolicy` says (`policy.service` None)."""
    if options is not None and policy.service is None:
        raise ValueError(
            "`data_service` works with one device, mirrored, central storage and ps; under "
            "multi_worker_mirrored every worker must reach the end of the data at the same "
            "step, which a shared tf.data service job does not promise. Train with "
            f"strategy 'ps', or without the service. Received: strategy={built.name!r}")


# -- the servers ------------------------------------------------------------------------------

class LocalService:
    """An in-process dispatcher and workers on 127.0.0.1 ports (they listen on every
    interface: TensorFlow's data service servers bind all of them, with no option)."""

    def __init__(self, workers, network_mode="private"):
        import tensorflow as tf

        from kerastrain.distribute import cluster
        service = tf.data.experimental.service
        self.dispatcher = service.DispatchServer(service.DispatcherConfig(port=cluster.free_port()))
        self.port = int(self.dispatcher.target.rsplit(":", 1)[1])
        self.address = f"grpc://127.0.0.1:{self.port}"
        self.workers = [service.WorkerServer(service.WorkerConfig(
            dispatcher_address=f"127.0.0.1:{self.port}", worker_address="127.0.0.1:%port%",
            port=cluster.free_port())) for _ in range(workers)]
        from kerastrain import _compat
        self.ports = [self.port] + [_compat.service_worker_port(w) for w in self.workers]

        from kerastrain.distribute import network
        mode = network_mode
        how = ("`data_service.network: host` asked for this" if mode == "host" else
               "to avoid it, call kerastrain.isolate_network() first thing in the script, or "
               "train with `kerastrain run` (it isolates a recipe with data.service: local)")
        warning = network.exposure_line(self.ports, how, who="the local tf.data service's servers")
        if warning:
            logger.warning(warning)

    def stop(self, timeout=10.0):
        """Stop workers, then the dispatcher; a server that does not stop within `timeout`
        s (a task blocked in Python code) is left to the end of the process."""
        for server in self.workers + [self.dispatcher]:
            thread = threading.Thread(target=server.stop, daemon=True)
            thread.start()
            thread.join(timeout)


def check_reachable(address, wait=None):
    """A dispatcher that cannot be reached within `wait` s (CONNECT_WAIT_SECS: it may be
    starting beside this process) is an error: TensorFlow's client would retry for a long
    time before saying anything."""
    import socket
    import time
    wait = CONNECT_WAIT_SECS if wait is None else wait
    host, port = address.removeprefix("grpc://").rsplit(":", 1)
    deadline = time.monotonic() + wait
    while True:
        try:
            socket.create_connection((host.strip("[]"), int(port)), timeout=5).close()
            return
        except OSError as e:
            error = e
        if time.monotonic() >= deadline:
            raise ValueError(
                f"Cannot reach the tf.data service dispatcher at {address} within {wait:g} s "
                f"({error.strerror or error}). Start one there (`python -m kerastrain.data.service "
                "dispatcher --port PORT`, or `kerastrain launch ... --service-workers N`), fix "
                f"the address, or use data_service='local'. Received: dispatcher={address!r}")
        time.sleep(0.5)


# -- the pipeline through the service ---------------------------------------------------------

def unsplittable_sources(graph_def) -> list[str]:
    """The source datasets of a pipeline's graph that the dispatcher cannot split."""
    if graph_def is None:
        return ["a pipeline TensorFlow cannot serialise (e.g. a py_function or generator)"]
    nodes = {n.name: n for n in graph_def.node}
    found = []
    for node in graph_def.node:
        if not node.op.endswith("Dataset") and "Dataset" not in node.op:
            continue
        inputs = [nodes.get(i.lstrip("^").split(":")[0]) for i in node.input]
        if any(i is not None and "Dataset" in i.op for i in inputs):
            continue  # a transformation of another dataset
        if node.op not in SPLITTABLE_SOURCES:
            found.append(node.op)
    for function in graph_def.library.function:
        if any(n.op == "GeneratorDataset" for n in function.node_def):
            found.append("a Python generator")
    return sorted(set(found))


class Service:
    """The service as one Trainer's training input uses it."""

    def __init__(self, options: ServiceOptions):
        self.options = options
        self._local = (LocalService(options.workers, options.network)
                       if options.dispatcher == LOCAL else None)
        self.address = self._local.address if self._local else options.address
        if self._local is None:
            check_reachable(self.address)
        self._prefix = f"kerastrain-{uuid.uuid4().hex[:12]}"
        self._jobs = 0  # per-pass jobs started (ps)

    def close(self):
        """Stop an in-process service (`Trainer.close`)."""
        if self._local is not None:
            self._local.stop()
            self._local = None

    def where(self) -> str:
        from kerastrain.distribute import network
        if self._local is not None:
            return (f"an in-process tf.data service (dispatcher and {self.options.workers} "
                    f"worker(s) on ports {', '.join(map(str, self._local.ports))} of "
                    f"{network.where()})")
        return f"the tf.data service at {self.address}"

    def check_splittable(self, graph_def, argument):
        if self.options.processing_mode != "distributed_epoch":
            return
        bad = unsplittable_sources(graph_def)
        if bad:
            raise ValueError(
                f"`data_service` with processing_mode='distributed_epoch' splits the pipeline at "
                f"its source, and this one starts from {', '.join(bad)}, which TensorFlow "
                "cannot split. Build it from files (kerastrain.data.files, TFRecordDataset), "
                "`tf.data.Dataset.range` or `from_tensor_slices`; or pass data_service="
                "{'processing_mode': 'parallel_epochs', ...} to have every service worker "
                "read all of it (each example then trained once per worker per pass). "
                f"Received: `{argument}` with sources {bad}")

    def sentence(self, *, readers, expected) -> str:
        """The one-line account of what holds (`readers`: `policy.CONSUMER` or
        `policy.WORKERS`, who reads the training data's jobs)."""
        mode = self.options.processing_mode
        if mode == "parallel_epochs":
            n = "W" if self._local is None else str(self.options.workers)
            what = (f"every service worker reads all the data: each example is trained {n} "
                    "times per pass, in no fixed order")
        elif readers == policy_lib.WORKERS:
            what = ("with steps_per_epoch=None an epoch is one pass: one job per pass, which "
                    "every ps worker reads to its end, so each example is trained once per "
                    "epoch; with steps_per_epoch set (or gradient accumulation), epochs count "
                    "steps of one repeated job, each example once per pass, but passes "
                    "overlap at epoch ends by the batches workers hold, so an epoch may train "
                    "a few examples twice or not at all; examples a lost service worker was "
                    "processing are reported")
        else:
            count = f"{expected} examples" if expected else "the first pass's examples"
            what = (f"one job per pass: each example is trained once per pass (checked against "
                    f"{count}; examples a lost service worker was processing are reported)")
        batches = ("NumPy data is split by batch (a pass has the same batches as without the "
                   "service)" if expected else "batches are made on the service workers from "
                   "the splits they get, so a pass may end with a partial batch per worker")
        return f"through {self.where()}, processing_mode='{mode}': {what}; {batches}; the " \
               "order differs from the pipeline's own (seeded shuffles included)"

    # -- synchronous strategies: one consumer --------------------------------------------

    def consumer_dataset(self, dataset, account):
        """`dataset` read through the service (a new job each time it is iterated), its
        examples counted by `account` (a `PassAccount`)."""
        from kerastrain import _compat
        distributed = dataset.apply(_compat.service_distribute(
            self.options.processing_mode, self.address, task_refresh_ms=TASK_REFRESH_MS))
        return account.wrap(distributed)

    # -- parameter servers -------------------------------------------------------------------

    def pass_fn(self, dataset):
        """A function building one ps worker's dataset: a new job of one pass, which every
        worker reads to its end (epochs of one pass, `loop.ps.driver.PSDriver.run_pass`). Job
        names are never reused: a finished job's name would give a new reader nothing."""
        import tensorflow as tf
        from kerastrain import _compat
        service = tf.data.experimental.service
        dataset_id = service.register_dataset(self.address, dataset)
        self._jobs += 1
        spec, mode, address, name = (dataset.element_spec, self.options.processing_mode,
                                     self.address, f"{self._prefix}/pass/{self._jobs}")

        def make():
            # Each reader learns its pass has ended at its next heartbeat: the drain
            # waits for it, so heartbeat as often as a single consumer does.
            return _compat.service_from_dataset_id(mode, address, dataset_id, spec,
                                                   job_name=name, task_refresh_ms=TASK_REFRESH_MS)
        return make

    def per_worker_fn(self, dataset, repeat=True):
        """A function building one ps worker's dataset: the one repeated job every worker
        reads, for epochs of `steps_per_epoch` steps."""
        import tensorflow as tf
        service = tf.data.experimental.service
        # The split provider repeats too: pass k+1's splits follow pass k's, each once.
        dataset_id = service.register_dataset(self.address,
                                              dataset.repeat() if repeat else dataset)
        spec, mode, address, name = (dataset.element_spec, self.options.processing_mode,
                                     self.address, self._prefix + "/train")

        def make():
            return service.from_dataset_id(mode, address, dataset_id, spec, job_name=name,
                                           max_outstanding_requests=1)
        return make


class PerPass:
    """An iterable whose every `iter()` is the next pass, built by `make(pass_index)`
    (what a synchronous driver iterates: a new job, and NumPy data reshuffled, per pass)."""

    def __init__(self, make):
        self._make = make
        self.passes = 0

    def __iter__(self):
        self.passes += 1
        return iter(self._make(self.passes - 1))


def numpy_batches(numpy_data, first_pass=0, passes=1):
    """NumPy data whose splits are whole batches (one split per batch, not per example).

    The source is a range of (pass, batch) indices; a service worker gathers batch b of
    pass k from the arrays (constants in the graph: 2 GB at most) in the order of a
    permutation seeded by (seed, k), the same on every worker, new each pass. A pass has
    ceil(n / batch_size) batches, the last one partial, as without the service.
    """
    import tensorflow as tf
    n, size = numpy_data.num_examples, numpy_data.batch_size
    per_pass = -(-n // size)
    arrays = numpy_data.constants()
    seed = tf.constant(numpy_data.seed or 0, tf.int64)

    def gather(j):
        # Only this batch's positions go through the pass's permutation (a stateless
        # bijection of [0, n)): O(batch size) per batch, not O(n).
        k, b = j // per_pass, j % per_pass
        idx = tf.range(b * size, tf.minimum((b + 1) * size, n), dtype=tf.int64)
        if numpy_data.shuffle:
            idx = tf.raw_ops.RandomIndexShuffle(index=idx, seed=tf.stack([seed, k, 0]),
                                                max_index=tf.constant(n - 1, tf.int64))
        return numpy_data.gather(idx, arrays)
    return tf.data.Dataset.range(first_pass * per_pass, (first_pass + passes) * per_pass).map(
        gather)


class PassAccount:
    """Counts the examples of each pass that reach training; reports a pass that had fewer.

    The check runs where the pass ends (a sentinel after the last batch, never emitted).
    """

    def __init__(self, expected):
        self.expected = expected
        self.passes = 0
        self.lock = threading.Lock()
        self._counter = None

    def wrap(self, dataset):
        import tensorflow as tf
        if self._counter is None:
            with tf.init_scope(), tf.device("/cpu:0"):
                self._counter = tf.Variable(0, dtype=tf.int64, trainable=False,
                                            name="service_examples")
        counter, spec = self._counter, dataset.element_spec

        def count(*batch):
            first = tf.nest.flatten(batch)[0]
            with tf.control_dependencies([counter.assign_add(
                    tf.cast(tf.shape(first)[0], tf.int64))]):
                return tuple(batch) if isinstance(spec, tuple) else batch[0]

        def ended(_):
            done = tf.py_function(self.ended, [counter.read_value()], tf.int64)
            with tf.control_dependencies([done, counter.assign(0)]):
                return tf.nest.map_structure(
                    lambda s: tf.zeros([0 if d is None else d for d in s.shape], s.dtype), spec)
        sentinel = tf.data.Dataset.range(1).map(ended).filter(
            lambda *_: tf.constant(False))
        return dataset.map(count).concatenate(sentinel)

    def ended(self, counted):
        """Pass `passes + 1` ended with `counted` examples trained."""
        counted = int(counted)
        with self.lock:
            self.passes += 1
            expected = self.expected
            if expected is None:
                self.expected = counted
                return 0
        if counted < expected:
            logger.warning(
                "tf.data service: pass %d of the training data: %d of %d examples reached "
                "training; %d were lost (a service worker stopped while processing them, "
                "and distributed_epoch does not process its splits again; or a ps worker "
                "stopped holding them)", self.passes, counted,
                expected, expected - counted)
        return 0


# -- servers as processes: `python -m kerastrain.data.service dispatcher|worker` -----------------------

def serve(role, *, port=0, dispatcher=None, host="127.0.0.1"):
    """Run a dispatcher or a worker until killed (for `kerastrain launch` or by hand)."""
    import tensorflow as tf
    service = tf.data.experimental.service
    if role == "dispatcher":
        server = service.DispatchServer(service.DispatcherConfig(port=port))
    elif role == "worker":
        if not dispatcher:
            raise ValueError("A worker needs `--dispatcher host:port`. Received: dispatcher=None")
        server = service.WorkerServer(service.WorkerConfig(
            dispatcher_address=dispatcher.removeprefix("grpc://"),
            worker_address=f"{host}:%port%", port=port))
    else:
        raise ValueError(f"`role` must be 'dispatcher' or 'worker'. Received: role={role!r}")
    print(f"kerastrain: tf.data service {role} serving on port {port or '(any)'} of every "
          f"interface (TensorFlow binds all of them; no option); pid {os.getpid()}", flush=True)
    server.join()


def main(argv=None):
    import argparse

    from kerastrain._lifetime import die_with_launcher
    die_with_launcher()  # started by `kerastrain launch --service-workers`
    parser = argparse.ArgumentParser(prog="python -m kerastrain.data.service",
                                     description="Run a tf.data service dispatcher or worker.")
    parser.add_argument("role", choices=("dispatcher", "worker"))
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--dispatcher", help="host:port of the dispatcher (workers)")
    parser.add_argument("--host", default="127.0.0.1",
                        help="how consumers reach this worker (its address's host)")
    args = parser.parse_args(argv)
    serve(args.role, port=args.port, dispatcher=args.dispatcher, host=args.host)


if __name__ == "__main__":
    main()

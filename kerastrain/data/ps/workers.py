"""Training data parameter-server workers read, each from a pipeline of its own.

A coordinator schedules loops on the workers, which build their datasets from tf.data graphs
(`per_worker_iterator`). Where the data allows it (finite, of known size, one replica per
worker, not `shard="off"`), a loop trains the exact positions of batches the coordinator hands
out (`reader`, `kerastrain.distribute.ps.visits`): every example once per pass, whichever worker
takes it. Through the tf.data service every worker reads one shared job a pass
(`pass_iterators`).
"""

from __future__ import annotations

import dataclasses
import warnings

import tensorflow as tf

from kerastrain import _compat
from kerastrain.data import distributed
from kerastrain.data import inputs as data_lib
from kerastrain.data import policy as policy_lib
from kerastrain.data import service as service_lib
from kerastrain.distribute.ps import inputs as ps_inputs
from kerastrain.distribute.ps import visits


class WorkerInput(distributed.DistributedInput):
    """A `DistributedInput` the parameter-server workers read (`InputPolicy.worker_input`).

    What it keeps between fits (its reader of exact visits, the workers' iterators, the
    passes read through the service) lets a later fit on the same data go on where the last
    stopped.
    """

    def __init__(self, *args, **kwargs):
        self._per_worker = self._worker_index = self._account = self._reader = None
        self.passes_read = 0
        self.exact = False
        super().__init__(*args, **kwargs)

    def _account_for_workers(self):
        """Loops name the batches they train (exact visits) unless a worker splits its
        batches over replicas, a pipeline is empty, or shard='off' opts out (each worker
        reads its own pipeline, or all the data); the training data's sentence says which."""
        self.exact = (self._policy.visits and self._built.strategy.num_replicas_in_sync == 1
                      and 0 not in self._sizes and not self._off and self._service is None)
        if self._policy.visits and self._role == "training":
            sizes = self._sizes
            self.plan = dataclasses.replace(self.plan, sentence=ps_inputs.account(
                self.plan.sentence, exact=self.exact, off=self._off, form=self.form,
                pipelines=self._pipelines, infinite=data_lib.INFINITE in sizes,
                unknown=data_lib.UNKNOWN in sizes, empty=0 in sizes))

    def _worker_dataset(self, index, repeat=True):
        """Worker `index`'s (repeated) shard, built eagerly here or traced for that worker."""
        if self.form == "context_fn":
            ctx = tf.distribute.InputContext(self._pipelines, index,
                                             self._built.strategy.num_replicas_in_sync)
            return self._checked(self._fn(ctx), repeat=repeat)
        dataset = distributed.with_policy(self._make(), self.plan.policy)
        if self.plan.policy in ("file", "data"):
            dataset = _compat.auto_shard(dataset, self._pipelines, index)
        return self._checked(dataset, repeat=repeat)

    def per_worker_iterator(self):
        """Per-worker iterators under parameter servers; repeated, so they never run dry."""
        if self._per_worker is None:
            strategy = self._built.strategy
            if self._service is not None:
                numpy = self.form == "numpy"  # its source counts passes itself
                through = self._service.per_worker_fn(
                    self._service_source(passes=2 ** 40 if numpy else 1), repeat=not numpy)

                def make(index):
                    return strategy.distribute_datasets_from_function(lambda ctx: through())
            elif self.form == "dataset":
                # A dataset object lives here; workers get it as a serialised graph.
                graphs = [_compat.serialize_dataset(self._worker_dataset(i))
                          for i in range(self._pipelines)]
                spec = self.element_spec

                def make(index):
                    return strategy.distribute_datasets_from_function(
                        lambda ctx: _compat.deserialize_dataset(graphs[index], spec))
            else:
                def make(index):
                    return strategy.distribute_datasets_from_function(
                        lambda ctx: self._worker_dataset(index))
            with warnings.catch_warnings():
                # tf.data warns that dataset options are not known while tracing.
                warnings.simplefilter("ignore", UserWarning)
                self._per_worker = _compat.per_worker_iterator(
                    self._built.coordinator, strategy, make)
        return self._per_worker

    @property
    def drains(self) -> bool:
        """Through the tf.data service, where the workers read shared jobs (parameter
        servers): an epoch of `steps_per_epoch=None` is one pass of a job every worker
        reads to its end (`loop.ps.driver.PSDriver.run_pass`)."""
        return self._service is not None and self._policy.service == policy_lib.WORKERS

    def pass_iterators(self):
        """Per-worker iterators over the next pass's job (one job, shared by every ps
        worker), and per-worker iterators yielding each worker's index."""
        strategy, coordinator = self._built.strategy, self._built.coordinator
        k, self.passes_read = self.passes_read, self.passes_read + 1
        source = (self._service_source(first_pass=k) if self.form == "numpy"
                  else self._service_source())
        through = self._service.pass_fn(source)
        with warnings.catch_warnings():
            # tf.data warns that dataset options are not known while tracing.
            warnings.simplefilter("ignore", UserWarning)
            iterator = _compat.per_worker_iterator(
                coordinator, strategy,
                lambda index: strategy.distribute_datasets_from_function(lambda ctx: through()))
            if self._worker_index is None:
                self._worker_index = visits.worker_indices(self._built)
        return iterator, self._worker_index

    def pass_ended(self, examples):
        """A pass read through the service trained `examples`: fewer than a pass has are
        reported (`service.PassAccount`)."""
        if self._account is None:
            self._account = service_lib.PassAccount(self._expected)
        self._account.ended(int(round(examples)))

    def reader(self):
        """The `visits.Reader` of exact visits under parameter servers (None: not exact)."""
        if not self.exact:
            return None
        if self._reader is None:
            finish = None
            if self.form == "numpy":
                make, finish = self._numpy.indices, self._numpy.gather
            elif self.form == "context_fn":
                replicas = self._built.strategy.num_replicas_in_sync

                def make(j):
                    return self._checked(self._fn(tf.distribute.InputContext(
                        self._pipelines, j, replicas)))
            elif self.form == "dataset":
                graph = _compat.serialize_dataset(self._make())
                spec = self.element_spec

                def make(j):
                    return _compat.deserialize_dataset(graph, spec)
            else:
                def make(j):
                    return self._checked(self._make())
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)
                sizes = [size if size > 0 else None for size in self._sizes]
                self._reader = visits.Reader(self._built, sizes, make, finish,
                                             element_spec=self.element_spec)
        return self._reader

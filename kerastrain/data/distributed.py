"""One input (any form) made iterable under one strategy: on replicas, through the tf.data service,
or on this task alone; what parameter-server workers read is `kerastrain.data.ps`."""

from __future__ import annotations

import dataclasses
import logging

import tensorflow as tf

from kerastrain import _logging
from kerastrain.data import inputs as data_lib
from kerastrain.data import in_step_batches
from kerastrain.data import pipelines as pipeline_lib
from kerastrain.data import sharding
from kerastrain.data import service as service_lib

logger = logging.getLogger("kerastrain")


def with_policy(dataset, policy):
    """`dataset` with the auto-shard policy of the plan. One pipeline ("none") keeps
    TensorFlow's default, which shards nothing for one worker and splits each global batch
    on its own across the replicas: `OFF` made TensorFlow regroup examples across batch
    boundaries (a short batch before the end merged with the next: other steps than one
    device's, silently)."""
    if policy == "none":
        return dataset
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = {
        "file": tf.data.experimental.AutoShardPolicy.FILE,
        "data": tf.data.experimental.AutoShardPolicy.DATA,
    }.get(policy, tf.data.experimental.AutoShardPolicy.OFF)
    return dataset.with_options(options)


class DistributedInput:
    """One input (any form) made iterable under one strategy.

    Attributes:
        form: "context_fn", "global_fn", "dataset" or "numpy".
        plan: the `sharding.Plan` decided (logged once).
        element_spec: the element spec of the batches (checked).
        cardinality: batches per epoch: per pipeline for `dataset_fn(ctx)`
            read in step, global batches otherwise (the sum over workers where
            they take batches in turn: parameter servers); or INFINITE / UNKNOWN.

    `built` is the `strategies.BuiltStrategy`, `policy` its kind's
    `data.policy.InputPolicy`, which says how the data is read. `role`
    ("training", "validation", "evaluation") names the input in the log line;
    only training data is shuffled (NumPy input).
    """

    def __init__(self, built, data, *, policy, argument="dataset_fn", shard="auto",
                 batch_size=None, seed=None, role="training", shuffle=True, input_options=True,
                 in_step=True, service=None):
        self.form = data_lib.input_form(data, argument)
        sharding.check_policy(shard)
        if batch_size is not None and self.form != "numpy":
            raise ValueError(
                "`batch_size` applies to NumPy input only; a dataset or dataset_fn batches its "
                f"own data. Received: batch_size={batch_size!r} with {argument} of form "
                f"{self.form!r}")
        self._built, self._policy = built, policy
        self._argument = argument
        self._role = role
        self._input_options = input_options  # `pipeline_lib.tuned` on what synchronous loops read
        # Under parameter servers only training data goes to the workers: the coordinator
        # evaluates (validation too) from one pipeline of its own (`local_dataset`).
        evaluated_here = policy.evaluated_here(role)
        self._pipelines = 1 if evaluated_here else policy.pipelines
        self._distributed = self._local = None  # built on first use
        # A `kerastrain.data.service.Service` reads training data only (validation stays local).
        self._service = service if role == "training" else None
        source = data_lib.resolve(
            built, data, self.form, policy=policy, argument=argument, shard=shard,
            batch_size=batch_size, seed=seed, input_options=input_options,
            for_training=role == "training" and shuffle)  # NumPy training data is reshuffled
        # Python batches and arrays Keras's adapters slice (ragged, sparse, None) are read as
        # a dataset of global batches from here on.
        self.form = source.form
        self._make, self._fn, self._numpy = source.make, source.fn, source.numpy
        self.element_spec, self.cardinality = source.element_spec, source.cardinality
        self._sizes = source.sizes
        self.plan = sharding.decide(
            shard, form=self.form, pipelines=self._pipelines, source=source.file_source,
            in_turn=policy.in_turn, global_batch=source.global_batch,
            replicas=built.strategy.num_replicas_in_sync)
        if evaluated_here:
            self.plan = dataclasses.replace(self.plan, sentence=(
                f"read on the coordinator (under parameter servers the chief evaluates): "
                f"{self.plan.sentence}"))
        self._off = shard == "off"
        self._account_for_workers()
        self._say_plan(source.probe, in_step)

    def _account_for_workers(self):
        """Where workers read the data from pipelines of their own (`data.ps.WorkerInput`),
        what they read, said in the plan's sentence; nothing here."""

    @property
    def drains(self) -> bool:
        """An epoch of `steps_per_epoch=None` is one pass of a job every worker reads to its
        end (`data.ps.WorkerInput`); never here."""
        return False

    def _say_plan(self, probe, in_step):
        """Log the plan (the service's, if one splits the data) and how batches are read."""
        if self._service is not None:
            self.plan = self._service_plan(probe)
        if self.plan.policy == "none" and self._built.strategy.num_replicas_in_sync == 1:
            # One pipeline feeding one replica: nothing decided worth a line of its own.
            _logging.tuning(f"{self._role} data: one input pipeline", "%s data: %s",
                            self._role, self.plan.sentence)
        else:
            logger.info("%s data: %s", self._role, self.plan.sentence)
        self._in_step = in_step and self._in_step_source(probe)

    def _in_step_source(self, probe):
        """`() -> in_step_batches.InStepBatches` when the batches can be read inside the compiled
        loop (`in_step_batches.source`), else None."""
        built = self._built
        if self._policy.built_on_workers or self._pipelines != 1 or self._service is not None:
            return None
        return in_step_batches.source(self._numpy if self.form == "numpy" else None, probe,
                             self.element_spec, built.replica_devices or ("/cpu:0",),
                             self._role)

    def _service_plan(self, probe):
        """The plan when the tf.data service splits the data (no sharding by kerastrain)."""
        if self.form != "numpy":  # NumPy data goes as `service.numpy_batches`, split by batch
            self._service.check_splittable(sharding.PipelineGraph(probe).graph, self._argument)
        expected = self._numpy.num_examples if self.form == "numpy" else None
        self._expected = expected
        return dataclasses.replace(self.plan, policy="off", sentence=self._service.sentence(
            readers=self._policy.service, expected=expected))

    def _service_source(self, ctx=None, first_pass=0, passes=1):
        """The whole data as one pipeline, for the service to split (NumPy: by batch)."""
        if self.form == "context_fn":
            return self._checked(self._fn(ctx or tf.distribute.InputContext(
                1, 0, self._built.strategy.num_replicas_in_sync)))
        if self.form == "numpy":
            return service_lib.numpy_batches(self._numpy, first_pass, passes)
        return self._checked(self._make())

    # -- what the runners iterate ---------------------------------------------------

    def _checked(self, dataset, repeat=False):
        data_lib.check_element_spec(dataset, self._argument)
        if repeat and data_lib.cardinality(dataset) != data_lib.INFINITE:
            dataset = dataset.repeat()
        return dataset

    def distributed(self, fresh=False):
        """A distributed dataset for synchronous strategies (iterate it once per pass).

        `fresh`: build it again, as a new run would (a recovery reads the data again
        from its first pass, and reshuffling follows how often the object was iterated).
        """
        if self._distributed is None or fresh:
            strategy = self._built.strategy
            # Batches are prefetched onto each replica's device by TensorFlow's default
            # `InputOptions(experimental_fetch_to_device=True)` (passing it explicitly
            # breaks CentralStorageStrategy in TF 2.21): a GPU step does not wait for a
            # host-to-device copy.
            if self._service is not None:
                account = service_lib.PassAccount(self._expected)

                def one_pass(k):
                    def through(ctx=None):
                        return self._tuned(self._service.consumer_dataset(
                            self._service_source(ctx, first_pass=k), account))
                    if self.form == "context_fn":
                        return strategy.distribute_datasets_from_function(through)
                    return strategy.experimental_distribute_dataset(
                        with_policy(through(), "off"))
                self._distributed = service_lib.PerPass(one_pass)
            elif self._in_step:
                self._distributed = self._in_step()
            elif self.form == "context_fn":
                self._distributed = strategy.distribute_datasets_from_function(
                    lambda ctx: self._tuned(self._checked(self._fn(ctx))))
            else:
                dataset = self._tuned(with_policy(self._make(), self.plan.policy))
                self._distributed = strategy.experimental_distribute_dataset(dataset)
        return self._distributed

    def _tuned(self, dataset):
        """`dataset` with kerastrain's tf.data options (`pipeline_lib.tuned`), logged once."""
        if not self._input_options:
            return dataset
        dataset, sentence = pipeline_lib.tuned(dataset, on_gpu=self._built.on_gpu)
        if not getattr(self, "_tuning_logged", False):
            self._tuning_logged = True
            _logging.tuning(f"{self._role} data: tf.data options tuned",
                            "%s data: tf.data options: %s (switch off with "
                            "tuning={'input_options': False})", self._role, sentence)
        return dataset

    def local_dataset(self):
        """The whole dataset read on this task (coordinator-side evaluation under PS).

        Made once and iterated anew for each evaluation, as `fit` iterates its
        `validation_data`: making it traces its functions, which a coordinator registers
        with every worker while holding the GIL, so with a frozen worker a new one each
        epoch would block every thread of the process (the stall watch's too).
        """
        if self._local is None:
            if self.form == "context_fn":
                self._local = self._checked(self._fn(tf.distribute.InputContext(1, 0, 1)))
            else:
                self._local = self._checked(self._make())
        return self._local

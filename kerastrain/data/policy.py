"""What a kind of strategy asks of the data: one `InputPolicy` the data layer follows.

Each kind of strategy (`kerastrain.loop.modes`) builds its policy; the data code reads its
fields, which say data things (how many pipelines, where they are built, who reads
evaluation data), and never tests which strategy runs.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Optional

# What the tf.data service does for training data (`InputPolicy.service`): this task
# reads it, a new job each pass (`service.Service.consumer_dataset`); or every worker reads
# one shared job (`service.Service.pass_fn`, `per_worker_fn`).
CONSUMER = "consumer"
WORKERS = "workers"


@dataclasses.dataclass(frozen=True, kw_only=True)
class InputPolicy:
    """How training, evaluation and prediction data are read under one kind of strategy.

    Attributes:
        pipelines: input pipelines that read training data (one per worker).
        built_on_workers: training pipelines are built on the workers from tf.data graphs
            (per-worker datasets), not read by this task's own loops: a Python object cannot
            travel there, and nothing is read inside this task's compiled loop.
        in_turn: workers train whole global batches in turn, as a coordinator schedules
            them, each from its own pipeline (an epoch counts the batches of every
            pipeline); False: every step trains one global batch, split over the replicas
            of every worker.
        visits: loops may train the exact positions of batches a coordinator hands out
            (`kerastrain.distribute.ps.visits`) where the data allows it.
        evaluates_here: validation and evaluation data are read on this task alone, from
            one pipeline of its own.
        predicts_here: prediction data is read on this task alone, each batch predicted
            whole (not split over replicas).
        absent_inputs: an optional input may be given None: the step reads the batches
            as the dataset yields them, not through tf.distribute iterators (which cannot
            carry a None).
        shared_order_seed: NumPy data's example orders need a seed every worker shares (0
            when none is given), or data sharding would not be exact.
        service: what the tf.data service does for training data here: `CONSUMER`,
            `WORKERS`, or None where it cannot keep the data exact (it is refused).
        check_dataset: `(dataset, argument) -> None`, raising where a `tf.data.Dataset`
            object given cannot be used here; None: every one can.
        worker_input: the class of an input the workers read from pipelines of their own
            (`kerastrain.data.ps.WorkerInput`, a `DistributedInput` with the workers'
            iterators and exact visits); None: the workers read none.
    """

    pipelines: int = 1
    built_on_workers: bool = False
    in_turn: bool = False
    visits: bool = False
    evaluates_here: bool = False
    predicts_here: bool = False
    absent_inputs: bool = False
    shared_order_seed: bool = False
    service: Optional[str] = CONSUMER
    check_dataset: Optional[Callable] = None
    worker_input: Optional[type] = None

    def evaluated_here(self, role):
        """Whether data of `role` is read on this task alone (validation and evaluation data
        where `evaluates_here`)."""
        return self.evaluates_here and role in ("validation", "evaluation")

    def input_type(self, role, default):
        """The class of an input of `role`: `worker_input` where the workers read it, else
        `default`."""
        if self.worker_input is None or self.evaluated_here(role):
            return default
        return self.worker_input

"""What the step side does differently under one kind of strategy, said in step terms."""

from __future__ import annotations

import dataclasses

from kerastrain.step import models


@dataclasses.dataclass(frozen=True)
class StepPolicy:
    """Made by each kind object (`kerastrain.loop.modes`) and read by the model's placement,
    its refusals (`checks`) and the step, so that none of them asks which strategy runs.

    The default is one task's replicas (one device, mirrored, central storage).
    """

    # A model's own step's logs are Keras's mean over replicas: over every task's replicas
    # (a collective, `strategy.reduce`) where they span tasks, else over this task's.
    logs_mean_spans_tasks: bool = False
    # Why `run_eagerly=True` cannot be honoured here (the steps are functions TensorFlow runs
    # elsewhere), or None where every step runs on this task's replicas and can run eagerly.
    eager_refused: str | None = None
    # Why a stateful RNN cannot train here even on one replica, or None where it can.
    stateful_refused: str | None = None
    # Where the model's variables are made and how they are built (`models.Placement`; the
    # parameter servers' is `kerastrain.step.ps.placement.ServerPlacement`).
    placement: models.Placement = dataclasses.field(default_factory=models.Placement)

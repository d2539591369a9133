"""The parameter-server runner reports when variables match the step it reports."""

import types

import numpy as np

from kerastrain import checkpoints, runners


class FakeCoordinator:
    """Runs nothing; each scheduled loop 'returns' its step count, as a real one does."""

    def __init__(self):
        self.joins = 0

    def schedule(self, fn, args):
        n = int(args[1])
        return types.SimpleNamespace(fetch=lambda: (np.zeros(3), n))

    def join(self):
        self.joins += 1


def test_ps_runner_is_in_sync_only_after_the_last_loop_of_a_join():
    coordinator = FakeCoordinator()
    checkpointer = checkpoints.Checkpointer(
        None, checkpoints.CheckpointOptions(every_steps=6), is_chief=False)
    assigned = []
    trainer = types.SimpleNamespace(
        _loops=types.SimpleNamespace(train_loop=lambda: None),
        _built=types.SimpleNamespace(coordinator=coordinator),
        _checkpointer=checkpointer, _watch=None,
        _global_step=types.SimpleNamespace(assign=assigned.append))
    data = types.SimpleNamespace(per_worker_iterator=lambda: None)
    runner = runners.PSRunner(trainer)
    seen = []
    for _, ran in runner.train_epoch(data, 10, 2, 0, lambda step: None):
        seen.append((ran, runner.in_sync))
    # Loops of 2 steps; a join at step 6 (a checkpoint boundary), the rest at the end.
    assert seen == [(2, False), (2, False), (2, True), (2, False), (2, True)]
    assert coordinator.joins == 2
    # After each join the step counter holds the steps asked for, whatever retried
    # closures added to it.
    assert assigned == [6, 10]

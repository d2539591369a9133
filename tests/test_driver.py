"""The parameter-server driver reports when variables match the step it reports."""

import types

import numpy as np

from kerastrain import driver


class FakeCoordinator:
    """Runs nothing; each scheduled loop 'returns' its step count, as a real one does."""

    def __init__(self):
        self.joins = 0
        self.fetched = []
        self.scheduled = 0

    def schedule(self, fn, args):
        n = int(args[1])
        self.scheduled += 1
        index = self.scheduled

        def fetch():
            self.fetched.append(index)
            return np.zeros(3), n
        return types.SimpleNamespace(fetch=fetch)

    def join(self):
        self.joins += 1


def ps_driver(coordinator, assigned, **kwargs):
    return driver.PSDriver(None, coordinator, types.SimpleNamespace(assign=assigned.append),
                           **kwargs)


DATA = types.SimpleNamespace(per_worker_iterator=lambda: None)


def test_ps_results_are_in_sync_only_after_the_last_loop_of_a_join():
    coordinator = FakeCoordinator()
    assigned = []
    ps = ps_driver(coordinator, assigned, stop_requested=lambda: False,
                   join_at=lambda step: step % 6 == 0, max_in_flight=100)
    seen = [(r.steps, r.in_sync) for r in ps.run_epoch(DATA, 10, 2, 0, lambda step: None)]
    # Loops of 2 steps; a join at step 6 (a checkpoint boundary), the rest at the end.
    assert seen == [(2, False), (2, False), (2, True), (2, False), (2, True)]
    assert coordinator.joins == 2
    # After each join the step counter holds the steps asked for, whatever retried
    # closures added to it.
    assert assigned == [6, 10]


def test_ps_schedules_a_bounded_number_of_loops_ahead_and_stops_scheduling_on_request():
    coordinator = FakeCoordinator()
    stop = {"now": False}
    ps = ps_driver(coordinator, [], stop_requested=lambda: stop["now"], max_in_flight=3)
    results = []
    for r in ps.run_epoch(DATA, 100, 1, 0, lambda step: None):
        results.append(r)
        # At most 3 loops were scheduled beyond the ones whose results arrived.
        assert coordinator.scheduled - len(results) <= 3
        if len(results) == 5:
            stop["now"] = True  # e.g. SIGTERM: no more loops are scheduled
    assert coordinator.fetched == sorted(coordinator.fetched)  # oldest first
    # 5 results had arrived, with 3 more in flight: those finish, nothing else starts.
    assert len(results) == coordinator.scheduled == 8
    assert [r.in_sync for r in results[-2:]] == [False, True]


def test_a_stop_before_the_epochs_first_loop_still_reaches_the_preemption_action(tmp_path):
    """SIGTERM between two epochs under ps: the driver schedules nothing, yet the stop must
    be saved and reported, not mistaken for an empty dataset."""
    import numpy as np

    import helpers
    import kerastrain as kt

    trainer = kt.Trainer(helpers.build_model, helpers.global_batch_dataset_fn(32),
                         strategy="default", model_dir=tmp_path, verbose=0)

    class NoLoops:
        passes = offset = 0

        def fast_forward(self, *args):
            pass

        def epoch_done(self, steps_per_epoch):
            pass

        def run_epoch(self, *args):
            return iter(())

    class Requested:
        requested = True

    trainer._ensure_built(trainer._input(trainer._dataset_fn, "dataset_fn", "training")
                          .element_spec)
    listed = trainer._actions(NoLoops(), watch=Requested(), agree=None,
                              monitor=trainer._monitor(None), callback_list=None,
                              validation=None, steps_per_epoch=2, batch_logs=False)
    progress = trainer._train_epochs(NoLoops(), None, listed, range(0, 3), 2, 1, None,
                                     type("C", (), {"on_epoch_begin": lambda *a: None})())
    assert progress.stop == "preempted" and listed[0].preempted.step == 0
    assert np.all(progress.totals == 0)

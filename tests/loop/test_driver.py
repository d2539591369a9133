"""The parameter-server driver reports when variables match the step it reports."""

import types

import numpy as np

import helpers
from kerastrain.data.trainer_inputs import FitInputs
from kerastrain.loop import driver
from kerastrain.loop.ps import driver as ps_driver_lib


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
    # The step counter reads back what was assigned: no loop ran twice.
    counter = types.SimpleNamespace(assign=assigned.append,
                                    numpy=lambda: assigned[-1] if assigned else 0)
    return ps_driver_lib.PSDriver(None, coordinator, counter, **kwargs)


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

    import kerastrain as kt

    trainer = kt.Trainer(helpers.build_model, helpers.global_batch_dataset_fn(32),
                         strategy="default", model_dir=tmp_path, verbose=0)

    class NoLoops:
        passes = offset = saved_offset = 0

        def resume(self, *args):
            pass

        def epoch_done(self, steps_per_epoch):
            pass

        def run_epoch(self, *args, **kwargs):
            return iter(())

    class Requested:
        requested = True

    trainer.build(trainer._dataset_fn)
    epochs = trainer._new_controller()
    monitor = trainer._workdir.monitor(trainer.model, step=0, element_spec=None)
    watch = Requested()
    epochs.driver, epochs.inputs, epochs.steps_per_epoch = NoLoops(), FitInputs(None, None), 2
    listed = epochs.actions(watch=watch, agree=None, monitor=monitor)
    epochs.callback_list = type("C", (), {"on_epoch_begin": lambda *a: None})()
    progress = epochs.train(listed, range(0, 3))
    assert progress.stop == "preempted" and watch.preempted.step == 0
    assert np.all(progress.totals == 0)


# -- exact visits: positions per loop -------------------------------------------------

def test_positions_take_the_pipelines_in_turn_and_continue_into_the_next_pass():
    from kerastrain.distribute.ps import visits
    positions = visits.Positions([3, 2])   # pipeline 0: 3 batches a pass, pipeline 1: 2
    assert positions.per_pass == 5
    assert [tuple(map(int, p)) for p in zip(*positions.of(0, 5))] == [
        (0, 0), (1, 0), (0, 1), (1, 1), (0, 2)]
    # The last batch of pass 0, then pass 1: positions count along each repeated pipeline.
    assert [tuple(map(int, p)) for p in zip(*positions.of(4, 4))] == [
        (0, 2), (0, 3), (1, 2), (0, 4)]


class PositionsCoordinator(FakeCoordinator):
    def __init__(self):
        super().__init__()
        self.positions = []

    def schedule(self, fn, args):
        self.positions.append([int(q) for q in args[3]])
        n = len(self.positions[-1])

        def fetch():
            return np.zeros(3), n, 0
        return types.SimpleNamespace(fetch=fetch)


def test_ps_loops_carry_consecutive_positions_and_the_position_survives_a_restart(caplog):
    from kerastrain.distribute.ps import visits
    reader = types.SimpleNamespace(positions=visits.Positions([4]), iterators=(), worker=None,
                                     cursor=0)
    data = types.SimpleNamespace(reader=lambda: reader, drains=False)
    coordinator = PositionsCoordinator()
    counted = {"extra": 0}
    assigned = []
    # The step counter counts every step run: those scheduled, and any run twice.
    counter = types.SimpleNamespace(assign=assigned.append, numpy=lambda: sum(
        len(p) for p in coordinator.positions) + counted["extra"])
    ps = ps_driver_lib.PSDriver(None, coordinator, counter, stop_requested=lambda: False,
                         positions_loop=lambda r, fresh=False: "loop")
    list(ps.run_epoch(data, 3, 2, 0, lambda step: None))
    assert coordinator.positions == [[0, 1], [2]]
    counted["extra"] = 2   # a worker failed; its loop ran again elsewhere: 2 steps twice
    list(ps.run_epoch(data, 3, 2, 3, lambda step: None))
    assert coordinator.positions[2:] == [[3, 4], [5]]   # into the second pass
    assert ps.repeated_steps == 2
    assert "2 step(s) (their batches) were trained twice" in caplog.text
    assert (ps.passes, ps.offset) == (2, 2)              # as a checkpoint keeps it
    again = ps_driver_lib.PSDriver(None, PositionsCoordinator(), counter, stop_requested=lambda: False,
                            positions_loop=lambda r, fresh=False: "loop")
    again.fast_forward(data, ps.passes, ps.offset)
    assert again.cursor == 6
    list(again.run_epoch(data, 2, 2, 6, lambda step: None))
    assert again._coordinator.positions == [[6, 7]]


def test_a_later_fit_begins_the_next_pass_or_goes_on_along_an_infinite_stream():
    """A new driver (a later fit) on the same input never starts again at position 0,
    where every worker's iterators already stand past the loops' positions."""
    from kerastrain.distribute.ps import visits

    def scheduled_by_two_fits(sizes, steps):
        reader = types.SimpleNamespace(positions=visits.Positions(sizes), iterators=(),
                                       worker=None, cursor=0)
        data = types.SimpleNamespace(reader=lambda: reader, drains=False)
        counter = types.SimpleNamespace(assign=lambda v: None, numpy=lambda: 0)
        coordinators = []
        for _ in range(2):
            coordinators.append(PositionsCoordinator())
            ps = ps_driver_lib.PSDriver(None, coordinators[-1], counter, stop_requested=lambda: False,
                                 positions_loop=lambda r, fresh=False: "loop")
            list(ps.run_epoch(data, steps, 2, 0, lambda step: None))
        return [c.positions for c in coordinators], (ps.passes, ps.offset)

    # 5 batches a pass; the first fit stops 3 into it, the second begins pass 2 (as one
    # device begins a new pass per fit).
    positions, where = scheduled_by_two_fits([5], 3)
    assert positions == [[[0, 1], [2]], [[5, 6], [7]]] and where == (2, 3)
    # An infinite stream: the second fit goes on where the first stopped.
    positions, _ = scheduled_by_two_fits([None], 3)
    assert positions == [[[0, 1], [2]], [[3, 4], [5]]]


def test_a_retried_loop_behind_its_new_worker_runs_again_from_a_fresh_copy(caplog):
    from kerastrain.distribute.ps import visits
    reader = types.SimpleNamespace(positions=visits.Positions([4]), iterators=(), worker=None,
                                     cursor=0)
    data = types.SimpleNamespace(reader=lambda: reader, drains=False)
    scheduled = []

    class Coordinator(FakeCoordinator):
        def schedule(self, fn, args):
            scheduled.append((fn, [int(q) for q in args[-2]]))
            # The first loop finds its worker past its batches: no step, behind=1.
            behind = fn == "loop" and len(scheduled) == 1
            n = len(scheduled[-1][1])
            return types.SimpleNamespace(fetch=lambda: (np.ones(3), 0 if behind else n,
                                                        int(behind)))

    counter = types.SimpleNamespace(assign=lambda v: None, numpy=lambda: 4)
    ps = ps_driver_lib.PSDriver(None, Coordinator(), counter, stop_requested=lambda: False,
                         positions_loop=lambda r, fresh=False: "fresh" if fresh else "loop")
    results = list(ps.run_epoch(data, 4, 2, 0, lambda step: None))
    # The behind loop ran again, fresh, at the same positions; steps count once.
    assert scheduled == [("loop", [0, 1]), ("loop", [2, 3]), ("fresh", [0, 1])]
    assert [r.steps for r in results] == [2, 2] and ps.refetched == 2
    assert "read from a fresh copy of the data" in caplog.text


def test_an_epoch_of_unknown_length_under_parameter_servers(caplog):
    """The coordinator schedules a fixed number of steps: a known size gives it (k batches a
    step when the optimizer accumulates k), an unknown one is refused with what to do, and
    synchronous strategies read to the data's end."""
    import types

    import pytest

    from kerastrain.data import inputs as data
    from kerastrain.loop import modes
    built = types.SimpleNamespace(num_workers=2, is_parameter_server=True, is_multi_worker=False)
    ps = modes.for_strategy(built)
    with caplog.at_level("INFO", logger="kerastrain"):
        assert ps.epoch_length(10, 1) == 10 and ps.epoch_length(10, 4) == 3
    assert "one epoch is 3 steps (the data's batches / 4 accumulated per step), spread over " \
        "2 workers" in caplog.text
    with pytest.raises(ValueError, match=r"size of this dataset is unknown .*pass "
                                         r"`steps_per_epoch`\. Received: steps_per_epoch=None"):
        ps.epoch_length(data.UNKNOWN, 1)
    sync = modes.for_strategy(types.SimpleNamespace(is_parameter_server=False,
                                                    is_multi_worker=False))
    assert sync.epoch_length(10, 1) is None and sync.epoch_length(data.UNKNOWN, 1) is None


def test_a_fit_frees_its_data_iterators_when_it_returns(make_trainer, two_cpus, monkeypatch):
    """The iterators a fit reads are freed when it returns, not kept by the Trainer until
    the next fit: a kept distributed iterator goes on prefetching, and freeing it later
    waits for tf.data's threads (seconds, once its autotuning's period has grown; it moved
    one benchmark contender's cost into another's), or forever once the tf.data service it
    reads from has stopped."""
    import weakref

    made = []
    new_iterator = driver.SyncDriver._new_iterator

    def watched(self, train_input):
        new_iterator(self, train_input)
        made.append(weakref.ref(self._iterator))
    monkeypatch.setattr(driver.SyncDriver, "_new_iterator", watched)
    x = np.random.default_rng(0).normal(size=(512, helpers.FEATURES)).astype("float32")
    trainer = make_trainer(strategy={"name": "mirrored", **two_cpus})
    trainer.fit(x, (x[:, :1] > 0).astype("float32"), batch_size=64, epochs=2)
    assert len(made) == 2        # one per pass
    assert [r() for r in made] == [None, None]   # freed by reference counting, no collector

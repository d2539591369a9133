"""A task with no training progress ends with who stalled and its stacks (`kerastrain.loop.stalls`)."""

import threading

import pytest

from kerastrain.loop import stalls


def test_a_watch_without_beats_writes_the_line_and_the_stacks_then_exits_75(tmp_path):
    ended = threading.Event()
    codes = []

    def fake_exit(code):
        codes.append(code)
        ended.set()

    out = open(tmp_path / "err.txt", "w+")
    watch = stalls.StallWatch(0.3, what="training under test", exit=fake_exit, out=out)
    watch._beats = 1  # past the first loop: the bound is the timeout
    with watch:
        assert ended.wait(30), "the watch never fired"
    text = (tmp_path / "err.txt").read_text()
    assert codes == [stalls.STALLED] == [75]
    assert "kerastrain: stalled: this process made no progress training under test for" in text
    assert "(bound 0 s, set by stall_timeout)" in text
    assert "Thread 0x" in text and 'File "' in text, text  # every thread's Python stack


def test_beats_keep_it_quiet_and_the_auto_bound_follows_the_slowest_loop():
    watch = stalls.StallWatch("auto", exit=lambda code: pytest.fail("fired"))
    with watch:
        assert watch.bound() == stalls.FIRST_SECS  # tracing the first loop is not a stall
        watch._last -= 40.0
        watch.beat()  # the first loop: 40 s with its tracing
        assert watch.bound() == pytest.approx(20 * 40.0, abs=0.5)
        watch._last -= 3.0
        watch.beat()
        assert watch.bound() == stalls.FLOOR_SECS  # 20 x 3 s < 5 minutes
        watch._last -= 19.0
        watch.beat()
        assert watch.bound() == pytest.approx(20 * 19.0, abs=0.5)
    fixed = stalls.StallWatch(30)
    assert fixed.bound() == stalls.FIRST_SECS  # before the first loop: at least 10 minutes
    fixed._beats = 1
    assert fixed.bound() == 30


def test_connecting_to_a_cluster_is_watched_with_a_generous_floor(tmp_path, monkeypatch):
    """A task frozen before the job starts hangs every other one in TensorFlow's connect:
    bounded by the larger of 30 minutes and stall_timeout; off without a cluster or with
    stall_timeout=None."""
    assert stalls.connecting("auto", in_cluster=True).bound() == stalls.CONNECT_SECS == 1800
    assert stalls.connecting(4000.0, in_cluster=True).bound() == 4000.0
    assert stalls.connecting("auto", in_cluster=False).timeout is None
    assert stalls.connecting(None, in_cluster=True).timeout is None
    # It fires like any watch, saying what it waited for (a small floor here).
    monkeypatch.setattr(stalls, "CONNECT_SECS", 0.3)
    ended, codes = threading.Event(), []
    out = open(tmp_path / "err.txt", "w+")
    watch = stalls.connecting(0.1, in_cluster=True)
    watch._exit, watch._out = (lambda code: (codes.append(code), ended.set())), out
    with watch:
        assert ended.wait(30), "the watch never fired"
    text = (tmp_path / "err.txt").read_text()
    assert codes == [75]
    assert "made no progress connecting to the cluster for" in text
    assert "(bound 0 s, the larger of 0 s and stall_timeout, while connecting)" in text


@pytest.mark.parametrize("bad", [0, -1, True, "soon", float("nan")])
def test_a_bad_stall_timeout_is_refused(bad):
    with pytest.raises(ValueError, match=r"`stall_timeout` must be 'auto'.*Received: "
                                         r"stall_timeout="):
        stalls.check(bad)


def test_a_peer_tensorflow_calls_unhealthy_is_named_in_one_line_with_where_to_resume():
    from kerastrain.loop import driver
    error = RuntimeError(
        "Collective ops is aborted by: Error reported from /job:worker/task:1: The following "
        "tasks are unhealthy (stopped sending heartbeats):\n/job:worker/replica:0/task:1\n...")
    lost = driver.lost_peer(error, "/runs/a/checkpoints/ckpt-64")
    assert isinstance(lost, stalls.LostPeer) and isinstance(lost, RuntimeError)
    assert str(lost) == (
        "Lost a worker of this multi-worker job (worker:1: TensorFlow's heartbeats say it "
        "stopped answering). Every step needs every worker, so training stops here; the latest "
        "checkpoint is /runs/a/checkpoints/ckpt-64; run the job again (or `kerastrain launch "
        "--max-restarts N`) to resume from it.")


def test_auto_watches_only_where_a_peer_can_stall_a_task_and_seconds_apply_anywhere(
        make_trainer):
    """A process alone (here one device) is never stopped by "auto" (a slow validation or
    callback is not a stall, and a notebook must not lose its kernel); a number applies."""
    import helpers
    import kerastrain as kt
    auto = make_trainer(strategy="one_device")
    epochs = auto._new_controller()
    with epochs.stall_watch() as watch:
        assert watch.timeout is None and watch._thread is None
        assert epochs.beats.beat == watch.beat
    assert epochs.beats.beat is None
    fixed = make_trainer(strategy="one_device", stall_timeout=900)
    with fixed._new_controller().stall_watch() as watch:
        assert watch.timeout == 900 and watch._thread.is_alive()
    with pytest.raises(ValueError, match=r"Received: stall_timeout='soon'"):
        kt.Trainer(helpers.build_model, strategy="one_device", stall_timeout="soon")


def test_the_launcher_names_a_stall_that_faulthandlers_backstop_ended():
    """A call blocked while holding the GIL keeps the watch thread from acting; faulthandler's
    own watchdog then dumps the stacks and exits 1. The launcher says it was a stall, and
    where, not merely that the job failed."""
    import io
    import sys

    from kerastrain.cli import launch
    from kerastrain.cli.tasks import Task
    blocked = "print('Timeout (0:00:50)!'); print('Thread 0x1 (most recent call first):'); exit(1)"
    tasks = [Task("worker", 0, "{}", [sys.executable, "-c", blocked]),
             Task("worker", 1, "{}", [sys.executable, "-c", "import time; time.sleep(30)"])]
    out = io.StringIO()
    assert launch.Launcher(tasks, out=out, env={}).run() == 1
    assert ("[launch] a task stalled (exit 1, from faulthandler's backstop in worker:0: a call "
            "blocked while holding Python's GIL, so the stall watch could not act; its stacks "
            "are above)") in out.getvalue(), out.getvalue()
    assert "[worker:0] Timeout (0:00:50)!" in out.getvalue()


def test_a_fault_at_a_step_waits_for_that_checkpoint_to_be_complete(tmp_path):
    """`--fault "... at step N"` fires once the checkpoint state file names step N or later,
    which the chief writes when the save has returned: the `.index` file appears inside the
    save, and a worker frozen there left the chief blocked in TensorFlow holding the GIL
    (CI 2026-11-27: faulthandler's backstop, then a whole-job restart)."""
    from kerastrain.cli.faults import latest_step
    directory = tmp_path / "checkpoints"
    directory.mkdir()
    assert latest_step(str(tmp_path)) is None and latest_step(None) is None
    (directory / "ckpt-32.index").write_text("")      # a save under way
    assert latest_step(str(tmp_path)) is None
    (directory / "checkpoint").write_text(
        f'model_checkpoint_path: "{directory}/ckpt-32"\n'
        f'all_model_checkpoint_paths: "{directory}/ckpt-16"\n'
        f'all_model_checkpoint_paths: "{directory}/ckpt-32"\n')
    (directory / "ckpt-48.index").write_text("")      # the next save, under way
    assert latest_step(str(tmp_path)) == 32


def test_a_faults_line_comes_before_any_tasks_answer_to_it(monkeypatch):
    """The launcher says a fault before a task's answer to it can be printed: a chief that
    reports a killed ps at once (CI 2026-11-27: its "Lost contact" line came before "[launch]
    fault: killed ps:0", and the story read as if the chief failed first) is printed after."""
    import io
    import sys
    import threading

    from kerastrain.cli import faults as faults_lib
    from kerastrain.cli import launch
    from kerastrain.cli.tasks import Task
    tasks = [Task("chief", 0, "{}", [sys.executable, "-c", "pass"]),
             Task("ps", 0, "{}", [sys.executable, "-c", "pass"])]
    out = io.StringIO()
    launcher = launch.Launcher(tasks, out=out, env={})

    class Running:
        pid = -1

        def poll(self):
            return None

    tasks[1].process = Running()

    def kill_and_the_chief_answers(process, signum):
        # The chief's pump thread writes its line the moment the ps dies (as `_pump` does).
        def answer():
            with launcher._lock:
                out.write("[chief:0] kerastrain: error: Lost contact\n")
        pump = threading.Thread(target=answer)
        pump.start()
        pump.join(timeout=0.5)   # without the lock held across the kill, it is written now

    monkeypatch.setattr(faults_lib, "signal_group", kill_and_the_chief_answers)
    faults = faults_lib.Faults([faults_lib.parse_fault("kill ps:0 at 0s", tasks, False)],
                               tasks=tasks, say=launcher.say)
    faults._apply(faults.pending[0])
    for thread in threading.enumerate():
        if thread is not threading.current_thread() and not thread.daemon:
            thread.join(timeout=5)
    assert out.getvalue().splitlines() == [
        "[launch] fault: killed ps:0 (kill ps:0 at 0s)",
        "[chief:0] kerastrain: error: Lost contact"], out.getvalue()


def test_a_fault_on_a_ray_task_signals_it_without_holding_the_launchers_output():
    """A Ray task is signalled through its actor (a remote call, up to 30 s): the launcher's
    output lock is not held for it, so no task's output waits on it."""
    import io
    import sys

    from kerastrain.cli import faults as faults_lib
    from kerastrain.cli import launch
    from kerastrain.cli.tasks import Task
    tasks = [Task("chief", 0, "{}", [sys.executable, "-c", "pass"]),
             Task("worker", 0, "{}", [sys.executable, "-c", "pass"])]
    launcher = launch.Launcher(tasks, out=io.StringIO(), env={})
    held = []

    class RayTask:
        def poll(self):
            return None

        def signal_group(self, signum):
            held.append(launcher._lock.locked())

    tasks[1].process = RayTask()
    faults = faults_lib.Faults([faults_lib.parse_fault("kill worker:0 at 0s", tasks, False)],
                               tasks=tasks, say=launcher.say)
    faults._apply(faults.pending[0])
    assert held == [False]
    assert launcher.out.getvalue() == "[launch] fault: killed worker:0 (kill worker:0 at 0s)\n"


def test_fits_validation_loops_beat_the_watch_of_the_epochs(make_trainer, monkeypatch):
    """Fit's validation is made before the epochs' stall watch starts and runs under it: each
    of its loops is progress for that watch (a long validation is not a stall)."""
    import helpers
    from kerastrain.loop import stalls
    beats = []
    real_beat = stalls.StallWatch.beat
    monkeypatch.setattr(stalls.StallWatch, "beat",
                        lambda self: (beats.append(self), real_beat(self))[1])
    trainer = make_trainer(strategy="one_device", stall_timeout=900)
    x, y = helpers.arrays(64)
    trainer.fit(x, y, batch_size=16, epochs=1, steps_per_epoch=4, verbose=0)
    trained = len(beats)
    beats.clear()
    trainer.fit(x, y, batch_size=16, epochs=2, initial_epoch=1, steps_per_epoch=4, verbose=0,
                validation_data=helpers.arrays(64), validation_steps=4)
    assert len(beats) > trained, (len(beats), trained)   # the validation's loops beat too

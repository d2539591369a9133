"""SIGTERM: finish the current step, save at exactly that step, exit with a documented code."""

from __future__ import annotations

import logging
import os
import select
import shutil
import signal
import threading

logger = logging.getLogger("kerastrain")

EXIT_CODE = 143  # 128 + SIGTERM: what orchestrators expect from a terminated process


class Preempted(SystemExit):
    """Raised by `fit` after a SIGTERM, once the checkpoint at the step reached is written.

    It is a `SystemExit` with code 143, so an uncaught one ends the process cleanly
    (no traceback) with the code an orchestrator reads as "terminated, restart me".
    """

    def __init__(self, step: int, path: str | None):
        super().__init__(EXIT_CODE)
        self.step = step
        self.path = path

    def __str__(self):
        return (f"preempted (SIGTERM) at step {self.step}; checkpoint: {self.path}; "
                f"exit code {EXIT_CODE}")


class SigtermWatch:
    """While active, a SIGTERM sets `requested` and flips `stop_variable` at once. Once the
    step reached is saved, `preempted` holds the `Preempted` that `fit` raises
    (`actions.Preemption` sets it; under multi-worker mirrored TensorFlow's handler raises).

    Python runs signal handlers only when the main thread returns to the
    interpreter, which a compiled loop of many steps delays. The C-level handler
    writes the signal number to a wakeup fd; a thread reading it flips a variable
    that the compiled loop checks before each step, so the loop stops after the
    step in progress.
    """

    def __init__(self, stop_variable=None, install=True):
        self.stop_variable = stop_variable
        self.install = install
        self.requested = False
        self.preempted = None  # a `Preempted`, once the step reached is saved
        self._previous = None
        self._previous_fd = None
        self._thread = None
        self._pipe = None

    def _on_signal(self, signum, frame):
        self.requested = True

    def __enter__(self):
        if not self.install or threading.current_thread() is not threading.main_thread():
            return self  # signals go to the main thread only; nothing to watch from here
        self._previous = signal.signal(signal.SIGTERM, self._on_signal)
        r, w = os.pipe()
        os.set_blocking(w, False)
        self._pipe = (r, w)
        self._previous_fd = signal.set_wakeup_fd(w, warn_on_full_buffer=False)
        self._thread = threading.Thread(target=self._watch, name="kerastrain-sigterm",
                                        daemon=True)
        self._thread.start()
        return self

    def _watch(self):
        r = self._pipe[0]
        while True:
            select.select([r], [], [])
            data = os.read(r, 64)
            if not data or b"\xff" in data:
                return  # closed by __exit__
            if signal.SIGTERM in data:
                self.requested = True
                if self.stop_variable is not None:
                    self.stop_variable.assign(True)

    def __exit__(self, *exc):
        if self._thread is None:
            return False
        signal.set_wakeup_fd(self._previous_fd)
        signal.signal(signal.SIGTERM, self._previous)
        os.write(self._pipe[1], b"\xff")
        self._thread.join(timeout=5)
        for fd in self._pipe:
            os.close(fd)
        self._thread = None
        return False


def multi_worker_handler(cluster_resolver, checkpointer):
    """TensorFlow's PreemptionCheckpointHandler, set up for kerastrain's checkpoints.

    Every worker calls `agree(step)` after each compiled loop. After a SIGTERM on
    any worker, all agree (through TensorFlow's coordination service), save that
    same step and raise `Preempted`; only the chief's files are kept.

    Returns:
        (agree, release): call `release()` when `fit` ends.
    """
    import tensorflow as tf

    from kerastrain import _compat
    from kerastrain.io import outputs
    state = {}

    def exit_fn():
        manager = checkpointer.manager
        path = manager.latest_checkpoint if manager is not None else None
        logger.warning("SIGTERM in the cluster: all workers saved step %d%s; exiting with code "
                       "%d", state["step"], f" ({path})" if path else "", EXIT_CODE)
        raise Preempted(state["step"], path)

    previous_sigterm = signal.getsignal(signal.SIGTERM)
    scratch = None
    if checkpointer.manager is not None:
        target, directory = checkpointer.manager, None
    else:
        # Non-chief: TensorFlow writes this worker's part of each save beside the
        # directory given (`workertemp_<task>`); a private temp dir keeps model_dir untouched.
        scratch = outputs.new_scratch()
        target, directory = checkpointer.checkpoint, os.path.join(scratch, "checkpoints")
    handler = tf.distribute.experimental.PreemptionCheckpointHandler(
        cluster_resolver, target, checkpoint_dir=directory,
        termination_config=tf.distribute.experimental.TerminationConfig(exit_fn=exit_fn))

    def agree(step):
        state["step"] = step
        with _compat.without_deprecation_notes():   # TensorFlow's note on its own use
            handler.save_checkpoint_if_preempted(checkpoint_number=step)

    def release():
        # The handler installed its own SIGTERM handler and watcher threads; after
        # fit nobody would act on them, so hand SIGTERM back and stop the threads.
        _compat.stop_preemption_handler(handler)
        signal.signal(signal.SIGTERM, previous_sigterm)
        if scratch:
            shutil.rmtree(scratch, ignore_errors=True)

    return agree, release

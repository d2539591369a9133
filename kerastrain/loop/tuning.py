"""Speed choices kerastrain makes by itself; each is logged once, can be switched off, and
changes neither the order of examples nor the numbers computed.

- tf.data options on the pipelines kerastrain is given (`input_options`,
  `kerastrain.data.pipelines`);
- in-memory input read by index inside the compiled loop (`in_step_batches`,
  `kerastrain.data.instep`);
- `UNROLL` training steps per iteration of the compiled loop where that many are known
  to be left: on such input, and on parameter-server workers (`unroll_steps`, `loops.Step`);
- `steps_per_loop="auto"` sized from a measurement of the compiled call's fixed
  cost (`LoopSizer`);
- `jit_compile="auto"` (`resolve_jit_compile`), a rule, not a measurement.

All-reduce for mirrored is chosen in `kerastrain.distribute.strategies` (`choose_cross_device_ops`).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time

from kerastrain._options import option

logger = logging.getLogger("kerastrain")

# Training steps per iteration of a compiled loop (`unroll_steps`, off by default). Measured
# on the core MLP, 2 cores: NumPy input read in the loop, 2 -> 1.03x, 4 -> 1.05x, 8 -> 1.03x
# the loop of one step per iteration; ps workers, 4 -> 1.07x. The price (bench/first_fit.py,
# 2026-11-26): the first fit takes ~2 s longer on that MLP (the step traced and optimized 4
# more times), repaid after ~150,000 of its steps; docs/performance_history.md.
UNROLL = 4


@dataclasses.dataclass(frozen=True)
class TuningOptions:
    """What kerastrain tunes by itself (each field's doc is in its declaration)."""

    input_options: bool = option(
        True, "tf.data options on every pipeline that leaves them unset: a private pool of "
              "half the cores; autotuning off on hosts of up to 4 cores, else bounded; order kept")
    in_step_batches: bool = option(
        True, "one replica on one worker: NumPy arrays and from_tensor_slices(...).batch(b) "
              "pipelines read by index inside the compiled loop, without a tf.data iterator; "
              "same batches, same order")
    unroll_steps: bool = option(
        False, "4 training steps per iteration of the compiled loop where 4 are known to be "
               "left (input read inside the loop; parameter-server workers), so one step's "
               "last updates overlap the next step's first layers; same steps, same order. "
               "Off by default: it gains ~5% of the step time but traces the step 4 more "
               "times, which pays only on long runs of large steps")
    measure_steps_per_loop: bool = option(
        True, "steps_per_loop='auto' sized so a compiled call's fixed cost is ~1% of its time, "
              "measured on the first loops (synchronous strategies); else 100")

    def __post_init__(self):
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if not isinstance(value, bool):
                raise ValueError(f"`{f.name}` (a tuning option) must be true or false. "
                                 f"Received: {f.name}={value!r}")

    @classmethod
    def coerce(cls, value):
        """True (the defaults), False/None (all off), a mapping of fields, or an instance."""
        from kerastrain import _options
        coerced = _options.coerce(cls, value, "tuning")
        return coerced if coerced is not None else cls(
            **{f.name: False for f in dataclasses.fields(cls)})


# -- tf.data options ----------------------------------------------------------------

# -- steps_per_loop="auto" ------------------------------------------------------------

class LoopSizer:
    """Chooses `steps_per_loop` so the fixed cost of a loop is ~`overhead` of its time.

    Measured once per Trainer, on its first training loops. Zero-step calls (after
    one that traces) give the compiled call's fixed cost: dispatch, iterator
    hand-over, returning totals. Two loops of `probe` steps follow (the first
    creates the step's kernels, so only the second is timed) and give the cost of
    a step; the time the driver waits between loops (the actions: logging,
    callbacks) is added to the fixed cost. The answer is `fixed / (overhead * step)`
    steps, at most `most`, and at most `seconds` of training per loop so progress,
    logging and a stop request stay prompt. Loop sizes change no number a step
    computes: the same batches reach the same optimizer updates in the same order.

    Args:
        fallback: the size used when the measurement is switched off or unusable.
        clock: `() -> seconds` (tests pass a fake one).
    """

    def __init__(self, *, fallback=100, probe=16, overhead=0.01, most=1000, seconds=2.0,
                 clock=time.perf_counter):
        self.fallback, self.probe, self.overhead = fallback, probe, overhead
        self.most, self.seconds, self.clock = most, seconds, clock
        self.size = None       # decided size (None: still measuring)
        self.fixed = None      # seconds per compiled call without steps
        self.per_step = None   # seconds per step
        self._probes = []      # seconds of the full probe loops seen so far

    def calibrate(self, loop, iterator):
        """Time zero-step calls of `loop(iterator, 0)`: the fixed cost. Reads no data."""
        import tensorflow as tf
        if self.fixed is not None:
            return
        zero = tf.constant(0, tf.int32)
        int(loop(iterator, zero)[1])  # traces the loop: not timed
        times = []
        for _ in range(3):
            start = self.clock()
            int(loop(iterator, zero)[1])  # waits for the result, as the driver does
            times.append(self.clock() - start)
        self.fixed = sorted(times)[1]

    def next_size(self) -> int:
        if self.size is not None:
            return self.size
        return self.probe if self.fixed is not None else self.fallback

    def observe(self, asked, ran, seconds):
        """A loop asked for `asked` steps ran `ran` in `seconds`."""
        if self.size is None and self.fixed is not None and asked == ran == self.probe:
            self._probes.append(seconds)

    def observe_gap(self, seconds):
        """The driver waited `seconds` between the last loop and the next: the second
        probe's gap decides."""
        if self.size is not None or len(self._probes) < 2:
            return
        self.per_step = max(self._probes[1] - self.fixed, 0.0) / self.probe
        self.size = self.decide(self.fixed + seconds, self.per_step)
        logger.debug(
            "steps_per_loop='auto': %d (measured per loop %.2f ms of call and %.2f ms between "
            "loops, %.3f ms per step; switch off with tuning={'measure_steps_per_loop': "
            "False} for a constant %d)", self.size, self.fixed * 1e3, seconds * 1e3,
            self.per_step * 1e3, self.fallback)

    def decide(self, fixed, per_step) -> int:
        if per_step <= 0 or not math.isfinite(per_step) or not math.isfinite(fixed):
            return self.fallback
        wanted = math.ceil(fixed / (self.overhead * per_step))
        return int(max(1, min(wanted, self.most, math.floor(self.seconds / per_step) or 1)))


# -- jit_compile="auto" ---------------------------------------------------------------

def check_jit_compile(jit_compile, built):
    """`jit_compile=True` where the step holds what XLA cannot compile: a clear error now."""
    if jit_compile is True and built.places_variables:
        raise ValueError(
            f"`jit_compile=True` works with the 'default' and 'one_device' strategies; under "
            f"{built.name!r} a step holds cross-device or remote-variable operations "
            "XLA cannot compile. Remove it. Received: jit_compile=True")


def resolve_jit_compile(requested, model, *, places_variables, has_gpu):
    """The `jit_compile` a step uses, and why (a sentence for the log).

    "auto" is Keras's own rule (`Trainer._resolve_auto_jit_compile`: XLA where a GPU or
    TPU is present and every layer supports it) plus kerastrain's: not under a strategy
    that places variables (a step then holds cross-device or remote-variable ops XLA
    cannot compile). It is a rule, not a timing: XLA changes a step's numerics
    slightly, so a choice made by a noisy measurement would make reruns differ
    (on a shared 2-core CPU host XLA measured 0.6x to 1.3x the non-XLA loop).
    """
    if requested is None:  # the model's compile setting, as before
        jit = bool(getattr(model, "jit_compile", False)) and not places_variables
        return jit, "the model's compile setting"
    if requested != "auto":
        return bool(requested), "requested"
    if places_variables:
        return False, "auto: off under a strategy that places variables"
    if not has_gpu:
        return False, "auto: off on a host without GPUs (as Keras's rule)"
    if not _supports_jit(model):
        return False, "auto: off, a layer of the model does not support XLA"
    return True, "auto: on, a GPU is present and every layer supports XLA (as Keras's rule)"


def _supports_jit(model):
    from kerastrain import _compat
    return _compat.model_supports_jit(model)

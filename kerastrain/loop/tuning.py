"""Speed choices kerastrain makes by itself; each is logged once, can be switched off, and
changes neither the order of examples nor the numbers computed (but `jit_compile="auto"`,
asked for, which may choose XLA: a step's float rounding then differs, as with `True`).

- tf.data options on the pipelines kerastrain is given (`input_options`,
  `kerastrain.data.pipelines`);
- in-memory input read by index inside the compiled loop (`in_step_batches`,
  `kerastrain.data.in_step_batches`);
- `UNROLL` training steps per iteration of the compiled loop where that many are known
  to be left: on such input, and on parameter-server workers (`unroll_steps`, `loops.Step`);
- `steps_per_loop="auto"` sized from a measurement of the compiled call's fixed
  cost (`LoopSizer`);
- `jit_compile="auto"` (`resolve_jit_compile`, `JitTrial`): XLA where it can compile the
  step and measured at least 10% faster on the first loops.

All-reduce for mirrored is chosen in `kerastrain.distribute.strategies` (`choose_cross_device_ops`).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time

from kerastrain._options import option
from kerastrain._tracing import runs_eagerly

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


MEASURE = "measure"  # `resolve_jit_compile`'s answer where "auto" times both (`JitTrial`)


def resolve_jit_compile(requested, model, *, places_variables, measurable=True):
    """The `jit_compile` a step uses, and why (a sentence for the log): True, False, or
    `MEASURE` (`JitTrial` times a loop with XLA against one without and keeps the faster).

    "auto" is measured, not guessed, where XLA can run: one replica (under a strategy
    that places variables a step holds cross-device or remote-variable ops XLA cannot
    compile, measured: it fails), every layer supporting XLA (Keras's `supports_jit`),
    and a step the trial can run both ways (`measurable`: no gradient accumulation).
    """
    if runs_eagerly(model):  # as Keras: `run_eagerly` wins over `jit_compile`
        if requested is True:
            logger.warning("jit_compile=True is ignored: the model is compiled with "
                           "run_eagerly=True, whose steps run eagerly (as Keras's compile "
                           "disables jit_compile then)")
        return False, "run_eagerly=True: every step runs eagerly, as under Keras"
    if requested is None:  # the model's compile setting, as before
        jit = bool(getattr(model, "jit_compile", False)) and not places_variables
        return jit, "the model's compile setting"
    if requested != "auto":
        return bool(requested), "requested"
    if places_variables:
        return False, "auto: off under a strategy that places variables (XLA cannot compile " \
                      "their cross-device or remote-variable operations)"
    if not _supports_jit(model):
        return False, "auto: off, a layer of the model does not support XLA"
    if not measurable:
        return False, "auto: off, not measured with gradient accumulation"
    return MEASURE, ("auto: measured on the first training loops, with XLA against without; "
                     "XLA is kept if it is at least 10% faster (said when measured)")


class JitTrial:
    """`jit_compile="auto"`: which of two compiled training loops, the step compiled with
    XLA or not, trains faster here; measured once per Trainer on its first loops.

    Once the loop size is known (the `LoopSizer` has measured, or `steps_per_loop` is a
    number) and a second loop without XLA has given the time of a step, the XLA loop runs one
    step untimed (it compiles; a whole loop where the loop size was asked for, so callbacks
    see the same batches), then the two take turns `pairs` times each (in the order
    X, P, P, X, X, P... so a drifting host favours neither), in loops of about `seconds`
    of training (longer than the driver's loop size if need be; an epoch's end still cuts
    them). XLA is kept when its fastest loop's time per step is at most `margin` of the
    other's, in wall time and in this process's CPU time alike: XLA changes a step's float
    rounding, so it must pay clearly, and on a shared host wall time alone mistook noise
    for a gain (measured).
    Every trial loop trains for real: the same batches in the same order, each step
    compiled one way or the other. An XLA loop that fails (an op XLA cannot compile) ends
    the trial: off, with a warning, and no batch lost (the driver reads the data again
    from where that loop began).

    Args:
        step: the `Step`, whose `train_loop(jit)` gives each loop and whose `jit_compile`
            takes the answer (the loop later fits use).
    """

    def __init__(self, step, *, pairs=4, margin=0.9, seconds=0.25):
        self.step, self.margin, self.seconds = step, margin, seconds
        self.decided = None    # True / False once measured (or failed)
        self.per_step = {False: [], True: []}  # seconds per step of each timed loop
        self.cpu_per_step = {False: [], True: []}  # and CPU seconds
        # The timed loops, XLA or not: X, P, P, X, X, P, ... (after one untimed XLA step).
        self._plan = [k % 4 in (0, 3) for k in range(2 * pairs)]
        self._warm = True      # the next XLA loop is the untimed first one
        self._plain = None     # seconds per step without XLA, before the trial
        self._seen_plain = 0   # loops without XLA seen before the trial
        self._size = None      # steps per trial loop
        self._steps = 0        # the most steps a timed loop ran (said with the answer)

    def most(self, steps):
        """The most steps the driver's next loop may take: a trial loop's `seconds` of
        training, where the loop size alone (`steps`) would make it shorter and noisier."""
        if self.decided is not None or self._plain is None:
            return steps
        return max(steps, self._trial_size())

    def _trial_size(self):
        if self._size is None:
            self._size = max(2, math.ceil(self.seconds / max(self._plain, 1e-9)))
        return self._size

    def choose(self, n, sized, free=True):
        """`(jit, steps)` of the next loop, given the driver's `n` steps; `sized`: the
        loop size is decided; `free`: the size is kerastrain's to choose (not one asked for
        with `steps_per_loop=N`, nor 1 for callbacks that see every batch, whose cadence
        stays). `jit` None: not a trial loop (the driver's own)."""
        if self.decided is not None or not sized or n < 1 or self._plain is None:
            return None, n
        if not free:
            return (True if self._warm else self._plan[0]), n
        if self._warm:
            return True, 1
        return self._plan[0], min(n, self._trial_size())

    def observe(self, jit, ran, seconds, cpu_seconds=None):
        """A loop (`jit` None: not a trial's) ran `ran` steps in `seconds` (wall), using
        `cpu_seconds` of this process's CPU (all threads; a trial loop's is needed)."""
        if self.decided is not None or ran < 1:
            return
        if jit is None:
            # The first loop may have traced the loop: the second gives a step's time (an
            # upper bound: the call's fixed cost included).
            self._seen_plain += 1
            if self._seen_plain >= 2:
                self._plain = seconds / ran
            return
        if self._warm:
            self._warm = False
            return
        jit = self._plan.pop(0)
        self.per_step[jit].append(seconds / ran)
        self.cpu_per_step[jit].append(cpu_seconds / ran)
        self._steps = max(self._steps, ran)
        if not self._plan:
            self._decide()

    def _decide(self):
        # The fastest loop of each: a loop is slowed, never sped up, by what is not the step
        # (the host's other tenants; XLA compiling again for a new batch shape, such as a
        # pass's last, partial batch: measured, it made XLA look 1.07x the CPU of no XLA
        # where it is 0.65x).
        fastest = {jit: min(times) for jit, times in self.per_step.items()}
        wall = fastest[True] / fastest[False]
        cpu = min(self.cpu_per_step[True]) / min(self.cpu_per_step[False])
        # Faster, and not by taking more of the host's CPU (on a shared or busy host, wall
        # time alone misleads: other tenants' time is not the step's).
        self.decided = wall <= self.margin and cpu <= self.margin
        self.step.jit_compile = self.decided
        logger.info(  # once a Trainer, after the start-up line that said it would measure
            "jit_compile: %s (auto, measured over %d loops of up to %d steps each way: %.3f "
            "ms a step with XLA, %.3f ms without (the fastest loop of each): %.2fx wall, "
            "%.2fx CPU; XLA is kept at %.2fx or less in both; jit_compile=True/False fixes "
            "the choice)", self.decided, len(self.per_step[True]), self._steps,
            fastest[True] * 1e3, fastest[False] * 1e3, wall, cpu, self.margin)

    @property
    def compiling(self):
        """The next XLA loop is the first: one that fails is XLA's failure to compile."""
        return self._warm

    def failed(self, error):
        """The first XLA loop failed: off for good (the driver reads the data again)."""
        self.decided = self.step.jit_compile = False
        logger.warning("jit_compile: False (auto: the step compiled with XLA failed, so it "
                       "trains without; no step was lost: %s: %s)", type(error).__name__,
                       _first_reason(getattr(error, "message", str(error))))


def _first_reason(message, most=300):
    """The line of a TensorFlow error that says what failed (not "Graph execution error:",
    the node or the Python stack), cut to `most` characters."""
    lines = [line.strip() for line in str(message).splitlines() if line.strip()]
    told = [line for line in lines if not line.startswith(
        ("Graph execution error", "Detected at node", "File ", "The op is created at"))]
    reason = next((line for line in told if "unsupported" in line.lower()),
                  told[0] if told else (lines[0] if lines else "no message"))
    return reason if len(reason) <= most else reason[:most] + "..."


def _supports_jit(model):
    from kerastrain import _compat
    return _compat.model_supports_jit(model)

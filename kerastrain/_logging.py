"""The `kerastrain` logger: visible by default, yet routable and silenceable by users."""

import contextlib
import logging
import os
import re
import sys
import tempfile
import threading

logger = logging.getLogger("kerastrain")


def ensure_visible():
    """Print INFO lines to stderr unless the application configured logging itself.

    Decisions such as "started a local cluster" must reach a user who never set
    up logging; anyone who did (a root handler, or one on this logger) keeps control,
    and `logging.getLogger("kerastrain").setLevel(logging.WARNING)` silences it.
    """
    if logger.handlers or logging.getLogger().handlers:
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("kerastrain: %(message)s"))
    logger.addHandler(handler)
    # TensorFlow's absl may give the root logger a handler later; without this,
    # every line would then print twice.
    logger.propagate = False
    if logger.level == logging.NOTSET:
        logger.setLevel(logging.INFO)


@contextlib.contextmanager
def held_lines():
    """Hold this thread's `kerastrain` lines until the block ends, then log them in order.

    An epoch end's lines (a checkpoint saved) come after Keras's progress line for that
    epoch, printed by the callbacks at the end of the block, not before it or, with a
    progress bar, inside it.
    """
    records, thread = [], threading.get_ident()

    def hold(record):
        if record.thread != thread:
            return True
        records.append(record)
        return False
    logger.addFilter(hold)
    try:
        yield
    finally:
        logger.removeFilter(hold)
        for record in records:
            logger.handle(record)


# What TensorFlow's C++ side prints while it loads, before it reads TF_CPP_MIN_LOG_LEVEL
# (absl logs everything to stderr until initialised; TF 2.21 loads two libraries that each
# link absl and say it: its core, and the profiler plugin): start-up notes (I/W lines) and,
# on a machine without a GPU, cuInit's failure (once devices are first listed).
_STARTUP_NOISE = re.compile(
    r"^(WARNING: All log messages before absl::InitializeLog\(\) is called are written to "
    r"STDERR|[IW]\d{4} [\d:.]+ +\d+ \S+:\d+\] .*)$")
_NO_CUDA = re.compile(r"^E\d{4} [\d:.]+ +\d+ cuda_\w+\.cc:\d+\] failed call to cuInit.*$")
# A C++ line's severity, as TF_CPP_MIN_LOG_LEVEL counts it (absl's own notice is a warning).
_SEVERITY = re.compile(r"^(?:([IWEF])\d{4} [\d:.]+ +\d+ \S+:\d+\] |(WARNING): All log messages "
                       r"before absl::InitializeLog)")
_LEVELS = {"I": 0, "W": 1, "WARNING": 1, "E": 2, "F": 3}

_started = None   # set by a held start: {"gpus": [...], "cuda_failed": bool}
_devices_said = False
_level = 2        # TF_CPP_MIN_LOG_LEVEL the held start applies (kerastrain's, or the user's)


def hold_tensorflow_startup(level: int = 2):
    """Have TensorFlow, whoever imports it next, start with its C++ start-up lines held back.

    Called by `import kerastrain` unless the user set `TF_CPP_MIN_LOG_LEVEL` to 0 (they see
    everything TensorFlow says) or TensorFlow is already imported (what it printed stays
    printed). `level` is TF_CPP_MIN_LOG_LEVEL's value (kerastrain's 2, or the user's 1-3):
    the start-up lines it would hide, had TensorFlow read it before printing them, are
    dropped. Nothing is imported now: an import hook waits for `tensorflow`, whether the
    user's `import keras` or kerastrain loads it.
    """
    global _level
    _level = level
    if "tensorflow" not in sys.modules and not any(
            isinstance(finder, _HeldStart) for finder in sys.meta_path):
        sys.meta_path = [_HeldStart(), *sys.meta_path]


class _HeldStart:
    """A finder for `tensorflow` alone, once: its loader runs with the start-up held."""

    def find_spec(self, name, path=None, target=None):
        if name != "tensorflow":
            return None
        # Once (a new list: an import in another thread may be going through the old one).
        sys.meta_path = [f for f in sys.meta_path if f is not self]
        import importlib.util
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.loader is not None:
            spec.loader = _HeldLoader(spec.loader)
        return spec


class _HeldLoader:
    def __init__(self, loader):
        self.loader = loader

    def __getattr__(self, name):  # anything else a loader answers: TensorFlow's loader
        return getattr(self.loader, name)

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        # TensorFlow's own loader from here on (resources are read through it).
        module.__loader__ = module.__spec__.loader = self.loader

        def start():
            self.loader.exec_module(module)
            return module.config.list_physical_devices("GPU")  # where CUDA is tried
        _start_held(start)


def _hidden_by_level(line) -> bool:
    """A start-up line TF_CPP_MIN_LOG_LEVEL (`_level`) hides once TensorFlow has read it: the
    lines its libraries print while they load come before (twice, as two of them, its core
    and `_pywrap_profiler_plugin`, link absl of their own and each says them)."""
    match = _SEVERITY.match(line)
    return bool(match) and _LEVELS[match.group(1) or match.group(2)] < _level


def _start_held(start):
    """`start()` (which loads TensorFlow and lists its GPUs) with stderr's file descriptor
    captured; pass on every line but the start-up notes the log level hides, and cuInit's
    failure where no GPU was found (the devices line says it: `say_devices`)."""
    global _started
    sys.stderr.flush()
    try:
        saved = os.dup(2)
    except OSError:  # no stderr at all: nothing to keep quiet
        return start()
    gpus = None
    with tempfile.TemporaryFile() as capture:
        os.dup2(capture.fileno(), 2)
        try:
            gpus = start()
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            capture.seek(0)
            held = capture.read().decode("utf-8", "replace").splitlines()
            cuda_failed = False
            for line in held:
                if _STARTUP_NOISE.match(line) and _hidden_by_level(line):
                    continue
                if _NO_CUDA.match(line) and gpus == []:
                    cuda_failed = True
                    continue
                print(line, file=sys.stderr)
    _started = {"gpus": gpus, "cuda_failed": cuda_failed}
    return gpus


def start_tensorflow_quietly():
    """Import TensorFlow with its C++ start-up lines held back; one line on the devices instead.

    For the command line, which calls it before anything imports TensorFlow (`import
    kerastrain` set up the hold: `hold_tensorflow_startup`). A user who set
    `TF_CPP_MIN_LOG_LEVEL=0` sees TensorFlow exactly as it prints. Otherwise TensorFlow's
    notes and warnings are hidden from then on (level 2, or the user's level); errors still
    print, except cuInit's failure on a machine where no GPU is found, which the devices
    line says in its own words. (kerastrain sets level 2 when imported, unless the user set
    it.)
    """
    import tensorflow as tf
    ensure_visible()
    if _started is None:  # not held: the user asked to see TensorFlow, or it ran already
        return _devices_line(tf.config.list_physical_devices("GPU"), cuda_failed=False)
    return say_devices()


def say_devices():
    """The devices line, once a process, where TensorFlow's start-up was held back (it says
    what the held lines would have: no GPU, and why). Logged before the strategy's line."""
    global _devices_said
    if _started is None or _devices_said:
        return None
    _devices_said = True
    return _devices_line(_started["gpus"], _started["cuda_failed"])


def _devices_line(gpus, cuda_failed):
    from kerastrain import _host
    cores = _host.usable_cores()
    if gpus:
        line = f"devices: {len(gpus)} GPU(s) ({', '.join(g.name for g in gpus)}) and the CPU"
    else:
        why = ("no CUDA device or driver answered" if cuda_failed else
               "none visible to TensorFlow")
        line = f"devices: the CPU ({cores} core(s) for this process); no GPU ({why})"
    logger.info(line)
    return line


# Speed decisions made for the user, said in one line per fit at INFO (`tuning_summary`);
# each in full at DEBUG as it is made.
_tuning_notes: list[str] = []
FULL_ACCOUNT = "the full account: kerastrain run -v, or logging.getLogger('kerastrain').setLevel('DEBUG')"


def tuning(short, message, *args):
    """Log a tuning decision: `message % args` at DEBUG, `short` in the next summary line."""
    logger.debug(message, *args)
    if short not in _tuning_notes:
        _tuning_notes.append(short)


def tuning_summary(say=True):
    """The one INFO line of what was tuned since the last summary (none at DEBUG, where
    each decision was already said in full, nor when `say` is False)."""
    notes = list(_tuning_notes)
    _tuning_notes.clear()
    if not (say and notes) or logger.isEnabledFor(logging.DEBUG):
        return
    # "training data: a", "training data: b", "validation data: a", ... -> one clause a role
    roles, rest = {}, []
    for note in notes:
        role, sep, what = note.partition(" data: ")
        if sep:
            roles.setdefault(role, []).append(what)
        else:
            rest.append(note)
    clauses = [f"{role} data: {', '.join(whats)}" for role, whats in roles.items()]
    if len(clauses) == 2 and roles.get("training") == roles.get("validation"):
        clauses = [f"training and validation data: {', '.join(roles['training'])}"]
    logger.info("tuning: %s (%s)", "; ".join(clauses + rest), FULL_ACCOUNT)

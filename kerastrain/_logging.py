"""The `kerastrain` logger: visible by default, yet routable and silenceable by users."""

import logging
import sys

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

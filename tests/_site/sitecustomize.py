"""Loaded first by every Python process a test starts (tests/_site is on its PYTHONPATH,
`helpers.child_env`).

Keras imports scikit-learn at start-up whenever it is installed (`keras.wrappers`): 1.1 s of
CPU in each of the suite's few hundred processes on the 2-core test machine (measured with
`python -X importtime`), though only the digits recipe reads anything from it. Processes that
do not say they need it (`KERASTRAIN_TEST_SKLEARN=1`) start as they would where scikit-learn
is not installed; Keras works the same either way.
"""

import os
import sys

if not os.environ.get("KERASTRAIN_TEST_SKLEARN"):
    sys.modules.setdefault("sklearn", None)   # `import sklearn` raises ImportError

if os.environ.get("KERASTRAIN_TEST_PROCLOG"):   # tools: which processes the suite starts
    import atexit
    import resource
    import time

    _start = time.monotonic()

    def _log():
        usage = resource.getrusage(resource.RUSAGE_SELF)
        with open(os.environ["KERASTRAIN_TEST_PROCLOG"], "a") as f:
            f.write(f"{usage.ru_utime + usage.ru_stime:.2f}\t{time.monotonic() - _start:.2f}\t"
                    f"{'tensorflow' in sys.modules}\t{os.environ.get('PYTEST_CURRENT_TEST', '')}"
                    f"\t{' '.join(sys.argv)[:200]}\n")
    atexit.register(_log)

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

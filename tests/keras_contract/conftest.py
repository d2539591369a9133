"""Routes `keras.Model.fit` / `evaluate` / `predict` through kerastrain for the tests of
this folder (each module names its strategy in `STRATEGY`).

- One device runs in every suite run; mirrored (twice the time, over the suite's 10-minute
  budget on a 2-core machine) with `KERASTRAIN_CONTRACT_MIRRORED=1`.
- `KERASTRAIN_CONTRACT=plain` runs the same tests on Keras alone, to see what passes there.
- Tests that fail under plain Keras on this install are deselected (`known.PLAIN_FAILS`).
- Tests listed in `known.DIFFERS[strategy]` are expected to fail through kerastrain, each
  with the reason it differs (strict: one that starts passing must leave the list);
  `KERASTRAIN_CONTRACT=all` runs them as ordinary tests.
"""

import os

import pytest

import known
import routing

_MODE = os.environ.get("KERASTRAIN_CONTRACT", "")
collect_ignore = [] if os.environ.get("KERASTRAIN_CONTRACT_MIRRORED") else [
    "test_trainer_mirrored.py"]


def pytest_collection_modifyitems(config, items):
    kept, dropped = [], []
    for item in items:
        strategy = getattr(item.module, "STRATEGY", None)
        name = item.name
        if strategy is None:
            kept.append(item)
        elif name in known.PLAIN_FAILS:
            dropped.append(item)
        else:
            kept.append(item)
            reason = known.DIFFERS.get(strategy, {}).get(name)
            if reason and _MODE not in ("plain", "all"):
                item.add_marker(pytest.mark.xfail(reason=reason, strict=True))
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept


@pytest.fixture(autouse=True)
def _through_kerastrain(request):
    strategy = getattr(request.module, "STRATEGY", None)
    if strategy is None or _MODE == "plain":
        yield
        return
    with routing.Router(strategy).routing():
        yield

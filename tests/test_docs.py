"""Every Python example in the strategy, data and parameter-server docs runs as written."""

import re
from pathlib import Path

import pytest

import helpers

DOCS = [Path(helpers.REPO) / "docs" / name
        for name in ("strategies.md", "data.md", "parameter_servers.md", "optimizers.md")]
BLOCKS = [block for doc in DOCS
          for block in re.findall(r"```python\n(.+?)```", doc.read_text(), flags=re.S)]


def test_every_strategy_has_an_example():
    text = "\n".join(BLOCKS)
    for name in ("one_device", "mirrored", "central_storage", '"ps"', "multi_worker_mirrored"):
        assert name in text


@pytest.mark.multiprocess
@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_strategy_example_runs(index):
    proc = helpers.run_python(BLOCKS[index])
    assert proc.returncode == 0, BLOCKS[index] + proc.stdout[-2000:] + proc.stderr[-4000:]

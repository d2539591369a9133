"""Every Python example of the README and of the strategy, data and ps docs runs as written.

The examples that train inside their own process run one after another in one Python process,
each in fresh globals (TensorFlow starts once for all of them, with the CPU split in two as
in a test process; the parameter-server ones last, as they connect the process to a cluster);
the examples that start processes of their own
(TF_CONFIG clusters) run alone. Each example is still its own test, with its own output.
"""

import json
import re
from pathlib import Path

import pytest

import helpers

DOCS = [Path(helpers.REPO) / "README.md"] + [
    Path(helpers.REPO) / "docs" / name
    for name in ("strategies.md", "data.md", "parameter_servers.md", "optimizers.md")]
BLOCKS = [block for doc in DOCS
          for block in re.findall(r"```python\n(.+?)```", doc.read_text(), flags=re.S)]
# TensorFlow's C++ lines (start-up notes, cuInit's failure): not on a user's screen.
STARTUP = re.compile(r"absl::InitializeLog|^[IWE]\d{4} [\d:.]+ +\d+ \S+:\d+\]", re.M)
EXPOSED = "reachable from the network"   # kerastrain's warning for servers open to all
ALONE = [i for i, block in enumerate(BLOCKS) if "subprocess" in block]
TOGETHER = sorted(set(range(len(BLOCKS))) - set(ALONE), key=lambda i: ('"ps"' in BLOCKS[i], i))

RUNNER = """
import json, os, sys, traceback
import kerastrain
kerastrain.isolate_network()          # as the ps examples do, before any thread starts
os.dup2(1, 2)
kerastrain.configure_cpu_devices(2)   # as a test process does: examples ask for 2 CPUs
for index, code in json.loads(sys.argv[1]):
    print(f"@@ example {index} starts", flush=True)
    try:
        exec(compile(code, f"<docs example {index}>", "exec"), {"__name__": "__main__"})
    except BaseException:
        traceback.print_exc()
        print(f"@@ example {index} failed", flush=True)
    else:
        print(f"@@ example {index} ran", flush=True)
"""


def _as_printed(args, cwd=helpers.REPO):
    """Run Python as a user would: without TF_CPP_MIN_LOG_LEVEL (tests set it elsewhere)."""
    import subprocess
    import sys
    env = helpers.child_env()
    env.pop("TF_CPP_MIN_LOG_LEVEL", None)
    return subprocess.run([sys.executable, *args], env=env, capture_output=True, text=True,
                          timeout=420, cwd=cwd)


def test_every_strategy_has_an_example():
    text = "\n".join(BLOCKS)
    for name in ("one_device", "mirrored", "central_storage", '"ps"', "multi_worker_mirrored"):
        assert name in text


@pytest.fixture(scope="module")
def together():
    """The output of each example that ran in the shared process, by index. A process that
    outlives its time still gives what it printed: the example it stopped in shows where."""
    import subprocess
    try:
        proc = _as_printed(["-c", RUNNER, json.dumps([[i, BLOCKS[i]] for i in TOGETHER])])
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode("utf-8", "replace") if isinstance(e.stdout, bytes) else e.stdout
        proc = subprocess.CompletedProcess(e.cmd, "timed out after 420 s", out or "", "")
    outputs = dict(re.findall(r"@@ example (\d+) starts\n(.*?)(?=@@ example \d+ starts|\Z)",
                              proc.stdout, flags=re.S))
    return {int(i): out for i, out in outputs.items()}, proc


@pytest.mark.multiprocess
@pytest.mark.parametrize("index", TOGETHER)
def test_example_runs_in_a_shared_process(index, together):
    outputs, proc = together
    out = outputs.get(index, "(never started; the process ended with code "
                             f"{proc.returncode}:\n{proc.stdout[-3000:]}")
    assert out.rstrip().endswith(f"@@ example {index} ran"), BLOCKS[index] + out[-4000:]
    assert EXPOSED not in out, out   # the example keeps TensorFlow's servers off the network
    assert not STARTUP.search(out), out[:3000]


@pytest.mark.multiprocess
@pytest.mark.parametrize("index", ALONE)
def test_example_that_starts_processes_runs(index):
    proc = _as_printed(["-c", BLOCKS[index]])
    assert proc.returncode == 0, BLOCKS[index] + proc.stdout[-2000:] + proc.stderr[-4000:]
    assert EXPOSED not in proc.stdout + proc.stderr, proc.stderr[-4000:]
    # Its own processes too (they inherit kerastrain's log level, not the user's).
    assert not STARTUP.search(proc.stdout + proc.stderr), proc.stderr[:3000]


def test_examples_with_servers_isolate_the_network_first():
    """Run as printed, an example that starts TensorFlow servers keeps them off the network:
    `isolate_network()` comes right after `import kerastrain`, before anything starts threads."""
    servers = [block for block in BLOCKS if re.search(r'"ps"|multi_worker|TF_CONFIG', block)]
    assert len(servers) >= 4
    for block in servers:
        lines = [line for line in block.splitlines() if line.strip()]
        assert lines[0].startswith("import kerastrain") and "isolate_network()" in lines[1], block


def _port_blocks():
    text = (Path(helpers.REPO) / "docs" / "getting_started.md").read_text()
    section = text.split("## Port a `model.fit` script", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```python\n(.+?)```", section, flags=re.S)


@pytest.mark.multiprocess
def test_the_porting_guide_runs_as_printed_and_its_rerun_trains_nothing(tmp_path):
    """getting_started's port of a keras.io script: the kerastrain version runs as printed (in a
    folder of its own: it writes runs/port), and run again it knows the run is over."""
    keras_io, ported = _port_blocks()
    assert "model.fit(x, y, batch_size=64" in keras_io and "kt.Trainer(model" in ported
    runs = [_as_printed(["-c", ported], cwd=tmp_path) for _ in range(2)]
    for proc in runs:
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    first, again = (proc.stdout + proc.stderr for proc in runs)
    assert not STARTUP.search(first), first[:3000]
    assert (tmp_path / "runs" / "port" / "checkpoints").is_dir()
    assert "Epoch 1/20" in first and "Epoch 1/" not in again
    assert "nothing left to train" in again, again[-3000:]
    # Run again, the model object holds what the first run trained (restored, not retrained).
    scores = [proc.stdout.splitlines()[-1] for proc in runs]   # `print(model.evaluate(...))`
    assert scores[0] == scores[1] and scores[0].startswith("["), scores

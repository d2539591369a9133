"""TensorBoard event files, a real TensorBoard server, chief-only writing, console output."""

import glob
import json
import os
import re
import subprocess
import sys
import time
import urllib.request

import keras
import numpy as np
import pytest

import helpers
import kerastrain as kt
from helpers import read_scalars
from kerastrain.io import monitor as monitor_lib
from kerastrain.io import summaries

EPOCHS, N = 2, 96  # 6 steps per epoch


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    model_dir = tmp_path_factory.mktemp("run")
    schedule = keras.optimizers.schedules.ExponentialDecay(0.01, decay_steps=3, decay_rate=0.5)
    trainer = kt.Trainer(
        lambda: helpers.build_model(optimizer=keras.optimizers.Adam(schedule)),
        helpers.global_batch_dataset_fn(N), strategy="default", model_dir=model_dir, verbose=0,
        tensorboard={"log_every_steps": 2})
    history = trainer.fit(epochs=EPOCHS, validation_dataset_fn=helpers.global_batch_dataset_fn(48))
    return model_dir, history.history, schedule


def test_event_files_hold_every_logged_step_and_equal_history_at_epoch_ends(run):
    model_dir, history, _ = run
    train = read_scalars(str(model_dir / "logs" / "train"))
    assert {"loss", "accuracy", "learning_rate", "examples_per_second", "step_time_seconds",
            "epoch_loss", "epoch_accuracy"} <= set(train)
    assert [s for s, _ in train["loss"]] == [2, 4, 6, 8, 10, 12]
    values = dict(train["loss"])
    np.testing.assert_allclose([values[6], values[12]], history["loss"], rtol=1e-6)
    np.testing.assert_allclose([v for _, v in train["epoch_accuracy"]], history["accuracy"],
                               rtol=1e-6)
    assert all(v > 0 for _, v in train["examples_per_second"])
    validation = read_scalars(str(model_dir / "logs" / "validation"))
    assert [s for s, _ in validation["loss"]] == [6, 12]
    np.testing.assert_allclose([v for _, v in validation["epoch_loss"]], history["val_loss"],
                               rtol=1e-6)
    # Off by default: no histograms, graph, config text or profile.
    assert "config" not in train and not glob.glob(str(model_dir / "logs/train/plugins/*"))


def test_learning_rate_scalar_follows_the_schedule_exactly(run):
    model_dir, _, schedule = run
    lr = read_scalars(str(model_dir / "logs" / "train"))["learning_rate"]
    # The rate the last step before each logged step used: schedule(step - 1).
    for step, value in lr:
        assert value == pytest.approx(float(schedule(step - 1)), rel=1e-6)


def test_real_tensorboard_server_serves_the_scalars(run):
    model_dir, history, _ = run
    port = kt.cluster.free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "tensorboard.main", "--logdir", str(model_dir / "logs"),
         "--host", "127.0.0.1", "--port", str(port), "--load_fast", "false"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        url = f"http://127.0.0.1:{port}/data/plugin/scalars/scalars?run=train&tag=epoch_loss"
        deadline, points = time.monotonic() + 90, None
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(url, timeout=5) as response:
                    points = json.loads(response.read())
                if len(points) == EPOCHS:
                    break
            except OSError:
                pass
            time.sleep(1)
        assert points is not None, "TensorBoard did not answer within 90 s"
        assert [p[1] for p in points] == [0, 1]  # [wall_time, step, value]
        np.testing.assert_allclose([p[2] for p in points], history["loss"], rtol=1e-6)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/data/runs", timeout=5) as r:
            assert set(json.loads(r.read())) == {"train", "validation"}
    finally:
        server.terminate()
        server.wait(timeout=30)


def test_optional_outputs_when_enabled(tmp_path, caplog):
    trainer = kt.Trainer(helpers.build_model, helpers.global_batch_dataset_fn(N),
                         strategy="default", model_dir=tmp_path, verbose=0,
                         tensorboard={"histograms_every_epochs": 1, "write_graph": True,
                                      "write_config": True, "profile_steps": (2, 4)})
    with caplog.at_level("INFO", logger="kerastrain"):
        trainer.fit(epochs=2)
    from tensorboard.backend.event_processing import event_accumulator
    acc = event_accumulator.EventAccumulator(str(tmp_path / "logs" / "train"),
                                             size_guidance={"tensors": 0})
    acc.Reload()
    tags = acc.Tags()
    assert tags["graph"]
    assert "config" in tags["tensors"]
    assert any(re.search(r"dense(_\d+)?/kernel$", t) for t in tags["tensors"])
    # The trace read back: the model's forward and backward ops ran while it recorded.
    from tensorflow.tsl.profiler.protobuf import xplane_pb2
    [trace] = glob.glob(str(tmp_path / "logs/train/plugins/profile/*/*.xplane.pb"))
    space = xplane_pb2.XSpace()
    with open(trace, "rb") as f:
        space.ParseFromString(f.read())
    [host] = [plane for plane in space.planes if plane.name == "/host:CPU"]
    names = {host.event_metadata[e.metadata_id].name for line in host.lines for e in line.events}
    assert any("dense" in n and "gradient_tape" not in n for n in names), sorted(names)[:20]
    assert any("dense" in n and "gradient_tape" in n for n in names), sorted(names)[:20]
    # One line says where it went and how to see it (the plugin is an optional extra).
    import importlib.util
    [said] = [r.getMessage() for r in caplog.records if r.getMessage().startswith("profile:")]
    assert said.startswith("profile: steps 2 to 4 traced into ") and "plugins/profile" in said
    assert ("pip install 'kerastrain[profile]'" in said) == (
        importlib.util.find_spec("tensorboard_plugin_profile") is None)


def test_tensorboard_false_and_no_model_dir_write_nothing(tmp_path):
    kt.Trainer(helpers.build_model, helpers.global_batch_dataset_fn(N), strategy="default",
               model_dir=tmp_path, tensorboard=False, verbose=0).fit(epochs=1)
    assert not os.path.exists(tmp_path / "logs")
    with pytest.raises(ValueError, match=r"Unknown tensorboard option\(s\) \['log_every'\]"):
        kt.Trainer(helpers.build_model, strategy="default", tensorboard={"log_every": 5})
    with pytest.raises(ValueError, match=r"profile_steps=\(5, 2\)"):
        monitor_lib.TensorBoardOptions(profile_steps=(5, 2))


def test_pluggable_writers_receive_the_same_scalars(tmp_path):
    class Recorder(summaries.MetricWriter):
        def __init__(self):
            self.calls = []

        def write_scalars(self, step, scalars):
            self.calls.append((step, dict(scalars)))

    recorder = Recorder()
    csv_path = tmp_path / "metrics.csv"
    trainer = kt.Trainer(helpers.build_model, helpers.global_batch_dataset_fn(N),
                         strategy="default", verbose=0, tensorboard={"log_every_steps": 3},
                         writers=[recorder, summaries.CSVWriter(str(csv_path))])
    history = trainer.fit(epochs=2).history
    steps = [s for s, scalars in recorder.calls if "loss" in scalars]
    assert steps == [3, 6, 9, 12]
    epoch_rows = [scalars["epoch_loss"] for _, scalars in recorder.calls if "epoch_loss" in scalars]
    np.testing.assert_allclose(epoch_rows, history["loss"], rtol=1e-6)
    rows = csv_path.read_text().splitlines()
    assert rows[0] == "step,name,value" and any(r.startswith("12,loss,") for r in rows)
    with pytest.raises(TypeError, match="MetricWriter instances"):
        kt.Trainer(helpers.build_model, strategy="default", writers=[print])


def test_monitor_throughput_with_a_fake_clock():
    times = iter([0.0, 2.0, 3.0])
    written = []

    class W(summaries.MetricWriter):
        def write_scalars(self, step, scalars):
            written.append((step, scalars))

    monitor = monitor_lib.Monitor(W(), monitor_lib.TensorBoardOptions(log_every_steps=10),
                                learning_rate_fn=lambda s: 0.1, weights_fn=dict,
                                clock=lambda: next(times))
    monitor.start(0)
    assert monitor.steps_to_boundary(0) == 10 and monitor.steps_to_boundary(7) == 3
    monitor.after_loop(10, 640.0, lambda: {"loss": 1.0})   # 640 examples in 2 s
    monitor.after_loop(20, 640.0, lambda: {"loss": 0.5})   # 640 examples in 1 s
    assert [s for s, _ in written] == [10, 20]
    assert written[0][1]["examples_per_second"] == 320.0
    assert written[1][1]["examples_per_second"] == 640.0
    assert written[1][1]["step_time_seconds"] == 0.1


def test_console_one_line_per_epoch_on_a_pipe_and_silence_at_zero(capfd):
    trainer = kt.Trainer(helpers.build_model, helpers.global_batch_dataset_fn(N),
                         strategy="default", steps_per_loop=2)
    trainer.fit(epochs=2, verbose=1)  # capfd is a pipe, not a terminal
    out = capfd.readouterr().out
    lines = [line for line in out.splitlines() if "loss" in line]
    assert len(lines) == 2 and all("accuracy" in line and "6/6" in line for line in lines), out
    trainer.fit(epochs=2, verbose=0)
    assert capfd.readouterr().out == ""


@pytest.mark.multiprocess
def test_multi_worker_only_the_chief_writes(tmp_path, tf_config_cluster):
    cluster = tf_config_cluster(worker=2)
    procs = []
    for i in range(2):
        # A log step at each epoch's end: the chief alone writes, yet every worker must
        # end its loops there too (a loop that reads on to the data's end on one worker
        # only waits forever for the others' collectives).
        job = json.dumps({"strategy": "multi_worker_mirrored", "epochs": 2,
                          "model_dir": str(tmp_path / f"dir{i}"), "verbose": "auto",
                          "tensorboard": {"log_every_steps": 6}})
        scratch = tmp_path / f"tmp{i}"
        scratch.mkdir()
        procs.append(cluster.start("worker", i, ["tests/_worker.py", job, str(tmp_path / f"w{i}")],
                                   env={"TMPDIR": str(scratch)}))
    outs = [p.communicate(timeout=120)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), "\n".join(o[-3000:] for o in outs)
    # The chief keeps logs, checkpoints and exports ...
    assert glob.glob(str(tmp_path / "dir0/logs/train/events.out.tfevents.*"))
    assert glob.glob(str(tmp_path / "dir0/checkpoints/ckpt-12.index"))
    assert os.path.exists(tmp_path / "dir0/export/saved_model/saved_model.pb")
    assert os.path.exists(tmp_path / "dir0/export/model.keras")
    # ... the other worker took part in every save in a temp dir, removed at once.
    assert not os.path.exists(tmp_path / "dir1")
    assert os.listdir(tmp_path / "tmp1") == [] and os.listdir(tmp_path / "tmp0") == []
    assert "6/6 - " in outs[0] and "- loss:" in outs[0]
    assert "- loss:" not in outs[1]  # non-chief tasks are silent by default


def test_the_graph_reaches_tensorboard_and_the_users_writers_together(tmp_path):
    class GraphRecorder(summaries.MetricWriter):
        def __init__(self):
            self.graphs = []

        def write_graph(self, graph):
            self.graphs.append(graph)

    mine = GraphRecorder()
    trainer = kt.Trainer(helpers.build_model, helpers.global_batch_dataset_fn(N),
                         strategy="default", model_dir=tmp_path, verbose=0, writers=[mine],
                         tensorboard={"write_graph": True, "log_every_steps": 0})
    trainer.fit(epochs=1)
    # Both writers, behind one MultiWriter, received the graph.
    assert len(mine.graphs) == 1 and mine.graphs[0].get_operations()
    from tensorboard.backend.event_processing import event_accumulator
    acc = event_accumulator.EventAccumulator(str(tmp_path / "logs" / "train"))
    acc.Reload()
    assert acc.Tags()["graph"]


def read_hparams(logdir):
    """The HParams session a run wrote in `logdir` itself, read with TensorBoard's own reader
    and its hparams plugin's parser: {name: value}."""
    from tensorboard.backend.event_processing import event_accumulator
    from tensorboard.plugins.hparams import metadata
    acc = event_accumulator.EventAccumulator(str(logdir))
    acc.Reload()
    content = acc.PluginTagToContent(metadata.PLUGIN_NAME)[metadata.SESSION_START_INFO_TAG]
    info = metadata.parse_session_start_info_plugin_data(content)
    return {name: getattr(value, value.WhichOneof("kind")) for name, value in info.hparams.items()}


def test_hparams_from_python_show_in_tensorboards_table_beside_the_runs_metrics(tmp_path):
    import numpy as np
    hparams = {"learning_rate": 0.01, "units": 8, "optimizer": "adam", "batchnorm": True,
               "dropout": np.float32(0.5)}
    trainer = kt.Trainer(helpers.build_model, helpers.arrays(), verbose=0,
                         model_dir=str(tmp_path), tensorboard={"hparams": hparams})
    trainer.fit(epochs=1, batch_size=16)
    assert read_hparams(tmp_path / "logs") == {**hparams, "dropout": 0.5}
    # The table's metric columns: the session's own runs hold the scalars.
    assert "loss" in read_scalars(str(tmp_path / "logs" / "train"))
    with pytest.raises(ValueError, match=r"`hparams` must map names to numbers, strings or "
                                         r"booleans.*not allowed: \{'layers': \[8, 8\]\}"):
        monitor_lib.TensorBoardOptions(hparams={"units": 8, "layers": [8, 8]})
    with pytest.raises(ValueError, match=r"Received: hparams=\[1, 2\]"):
        monitor_lib.TensorBoardOptions(hparams=[1, 2])


def test_each_recipe_run_logs_its_values_flattened_so_set_variants_compare(tmp_path, capsys):
    from kerastrain.cli import command as cli
    recipe = os.path.join(helpers.REPO, "recipes", "quickstart.yaml")
    for name, epochs in (("a", 1), ("b", 2)):
        sets = [f"trainer.epochs={epochs}", "trainer.steps_per_epoch=2", "trainer.verbose=0",
                f"trainer.model_dir={tmp_path / name}", "data.train.args.num_examples=256",
                "data.validation.args.num_examples=64", "strategy=default"]
        assert cli.main(["run", recipe, *[a for s in sets for a in ("--set", s)]]) == 0, \
            capsys.readouterr()
    a, b = read_hparams(tmp_path / "a" / "logs"), read_hparams(tmp_path / "b" / "logs")
    assert (a["trainer.epochs"], b["trainer.epochs"]) == (1, 2)
    assert a["strategy.name"] == "default" and a["trainer.model_dir"] == str(tmp_path / "a")
    assert a["data.train.args.num_examples"] == 256
    assert {k for k in a if a[k] != b[k]} == {"trainer.epochs", "trainer.model_dir"}


# TensorFlow's C++ start-up lines (docs/monitoring.md#tensorflows-own-start-up-lines), each
# printed twice by `import tensorflow` on this machine when nothing holds them back.
STARTUP_NOISE = ("absl::InitializeLog", "oneDNN", "cuInit", "cuda drivers", "cudart", "TF-TRT")

A_FIRST_SCRIPT = """
import os
import kerastrain as kt     # first, before keras and tensorflow, as docs/monitoring.md asks
import keras
import numpy as np

def build():
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    return model

x = np.random.default_rng(0).random((64, 4), dtype="float32")
y = x.sum(axis=1, keepdims=True)
for strategy in ({"name": "mirrored", "cpu_devices": 2}, "one_device"):
    print(f"user: {strategy}", flush=True)
    trainer = kt.Trainer(build, strategy=strategy, seed=0, verbose=2, tensorboard=False,
                         model_dir=os.path.join(os.environ["RUNS"], str(len(strategy))))
    trainer.fit(x, y, batch_size=16, epochs=3)
os.write(2, b"user: stderr is the user's again\\n")
"""


def _epochs_in_order(lines, epochs, steps, saved):
    """Each epoch's lines: `Epoch k/N`, its progress line, then its checkpoint's (`saved`)
    line, before the next epoch's; kerastrain's other lines anywhere else."""
    keras_or_checkpoint = [line for line in lines
                           if re.match(r"Epoch \d|\d+/\d+ - |kerastrain: checkpoint", line)]
    expected = [pattern for k in range(1, epochs + 1) for pattern in (
        rf"Epoch {k}/{epochs}$", rf"{steps}/{steps} - .*loss", saved.format(step=k * steps))]
    assert len(keras_or_checkpoint) == len(expected), "\n".join(lines)
    for line, pattern in zip(keras_or_checkpoint, expected):
        assert re.match(pattern, line), (pattern, "\n".join(lines))


@pytest.mark.multiprocess
def test_a_script_importing_kerastrain_first_shows_only_its_lines_each_epochs_in_order(tmp_path):
    """A new user's script, no TF_CPP_MIN_LOG_LEVEL set: none of TensorFlow's C++ start-up
    lines, the devices line instead; each epoch's checkpoint line after its progress line
    (under mirrored the background write's line came after the next `Epoch k/N`), under
    mirrored and one device; the user's own output to stderr still shows."""
    env = helpers.child_env(RUNS=str(tmp_path))
    env.pop("TF_CPP_MIN_LOG_LEVEL", None)
    proc = subprocess.run([sys.executable, "-c", A_FIRST_SCRIPT], env=env, cwd=helpers.REPO,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=300)
    lines = proc.stdout.splitlines()
    assert proc.returncode == 0, proc.stdout[-4000:]
    assert not [line for line in lines if any(s in line for s in STARTUP_NOISE)
                or re.match(r"[EWIF]\d{4} ", line)], lines[:12]
    theirs = [line for line in lines if not line.startswith(("kerastrain: ", "user: "))]
    assert not [line for line in theirs if not re.match(r"Epoch \d|\d+/\d+ - ", line)], theirs
    assert lines[1].startswith("kerastrain: devices: the CPU"), lines[:3]
    assert len([line for line in lines if "devices:" in line]) == 1, lines
    assert lines[-1] == "user: stderr is the user's again"
    mirrored, one_device = "\n".join(lines).split("user: one_device")
    background = r"kerastrain: checkpoint at step {step}: .*ckpt-{step} \(being written in the"
    _epochs_in_order(mirrored.splitlines(), 3, 4, background)
    _epochs_in_order(one_device.splitlines(), 3, 4, background)


@pytest.mark.multiprocess
def test_kerastrain_run_under_ps_says_each_checkpoint_after_its_epochs_progress_line(tmp_path):
    """The command line, under parameter servers (saves in the foreground): each epoch's
    `checkpoint saved` line after its progress line, none of TensorFlow's start-up lines."""
    env = helpers.child_env()
    env.pop("TF_CPP_MIN_LOG_LEVEL", None)
    sets = ["trainer.epochs=2", f"trainer.model_dir={tmp_path}", "trainer.verbose=2",
            "data.train.args.num_examples=1024", "data.validation.args.num_examples=256",
            "tensorboard=false"]
    proc = subprocess.run(
        [sys.executable, "-m", "kerastrain.cli", "run", "recipes/parameter_server.yaml",
         *[a for s in sets for a in ("--set", s)]], env=env, cwd=helpers.REPO,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300)
    lines = proc.stdout.splitlines()
    assert proc.returncode == 0, proc.stdout[-4000:]
    assert not [line for line in lines if any(s in line for s in STARTUP_NOISE)], lines[:12]
    _epochs_in_order(lines, 2, 4, r"kerastrain: checkpoint saved at step {step}: .*ckpt-{step}$")


@pytest.mark.multiprocess
def test_a_user_who_set_tf_cpp_min_log_level_sees_tensorflow_as_they_asked():
    """The way to see everything (docs/monitoring.md): kerastrain keeps the user's setting
    and holds nothing back."""
    proc = helpers.run_python(
        "import os, kerastrain, keras; print(os.environ['TF_CPP_MIN_LOG_LEVEL'])",
        env={"TF_CPP_MIN_LOG_LEVEL": "1"}, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "1", proc.stderr[-2000:]
    assert "absl::InitializeLog" in proc.stderr


def test_a_held_start_drops_only_tensorflows_start_up_notes(capfd, monkeypatch):
    """What TensorFlow prints while it loads: its start-up notes dropped; any other line, a
    real error included, passed on; cuInit's failure dropped only where no GPU was found
    (the devices line says it), passed on if the start failed."""
    from kerastrain import _logging
    monkeypatch.setattr(_logging, "_started", None)
    notes = [b"WARNING: All log messages before absl::InitializeLog() is called are written "
             b"to STDERR",
             b"I0000 00:00:1795836952.324434   21748 port.cc:153] oneDNN custom operations "
             b"are on.",
             b"I0000 00:00:1795836952.324753   21748 cudart_stub.cc:31] Could not find cuda "
             b"drivers on your machine, GPU will not be used."]
    cuinit = (b"E0000 00:00:1795836959.342544   22005 cuda_platform.cc:52] failed call to "
              b"cuInit: INTERNAL: CUDA error: Failed call to cuInit: UNKNOWN ERROR (303)")
    real = b"E0000 00:00:1795836959.342544   22005 kernel.cc:1] a real error"

    def start(gpus):
        os.write(2, b"\n".join([*notes, real, cuinit, *notes]) + b"\n")
        if gpus is None:
            raise ImportError("TensorFlow failed")
        return gpus

    assert _logging._start_held(lambda: start([])) == []
    assert capfd.readouterr().err.splitlines() == [real.decode()]
    assert _logging._started == {"gpus": [], "cuda_failed": True}
    with pytest.raises(ImportError):
        _logging._start_held(lambda: start(None))
    assert capfd.readouterr().err.splitlines() == [real.decode(), cuinit.decode()]

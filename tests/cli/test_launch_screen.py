"""What `kerastrain launch` prints: kerastrain's lines and the user's, not TensorFlow's C++ notes.

TensorFlow prints its start-up lines (absl's notice, oneDNN, cudart_stub, cuInit) twice per
process, before it reads TF_CPP_MIN_LOG_LEVEL: its core and `_pywrap_profiler_plugin` link
absl of their own. The launched tasks held them back only when TF_CPP_MIN_LOG_LEVEL was
unset; a shell or harness setting it (the tests' helpers set 2) let them through in every
task, and again after every restart. The chief of a ps job prints blocks of gRPC errors about
a worker the launcher is restarting: one launcher line says it instead.
"""

import json
import os
import re
import signal
import subprocess

import pytest

import helpers
from test_clusters import PS_RECIPE, QUICKSTART, Launch, _sets
from kerastrain.cli import launch as launch_lib
from kerastrain.cli import outages as outages_lib
from kerastrain.cli.tasks import Task

# Any of TensorFlow's start-up lines, or a C++ log line (`E0000 00:00:... file.cc:12] ...`),
# or a line of a gRPC error block.
NOISE = re.compile(r"absl::InitializeLog|oneDNN|cuInit|cuda drivers|cudart|TF-TRT|"
                   r"^\[[\w:]+\] [IWEF]\d{4} |GRPC|Error received from peer|"
                   r"ERROR:tensorflow|could happen if the remote target")


def _noise(text):
    return [line for line in text.splitlines() if NOISE.search(line)]


class _Process:
    def __init__(self, pid, code=None):
        self.pid, self.code = pid, code

    def poll(self):
        return self.code


def _task(job, index, port, pid, code=None):
    spec = {"chief": ["127.0.0.1:1000"], "worker": ["127.0.0.1:2000", "127.0.0.1:2001"]}
    config = json.dumps({"cluster": spec, "task": {"type": job, "index": index}})
    task = Task(job, index, config, [])
    task.process = _Process(pid, code)
    return task


CHIEF_BLOCK = [
    "ERROR:tensorflow:Worker /job:worker/replica:0/task:1 failed with UnavailableError():Socket "
    "closed",
    "Additional GRPC error information from remote target /job:worker/replica:0/task:1 while "
    "calling /tensorflow.eager.EagerService/Enqueue:",
    ':UNKNOWN:Error received from peer  {grpc_message:"Socket closed", grpc_status:14}',
    "E0000 00:00:1795848378.795365   21585 context.cc:873] Failed to register function "
    "remotely due to failed to connect to all addresses; last error: UNKNOWN: "
    "ipv4:127.0.0.1:2001: Failed to connect to remote host: Connection refused",
    "This could happen if the remote target has been disconnected from the client.",
]


def test_the_chiefs_grpc_errors_about_a_restarting_worker_become_one_line():
    """Blocks naming worker:1, dead and restarted, are held; its `serving` line says the
    outage once, with how long, who ran its steps and how many lines were held. A block
    about a live worker, and the chief's own lines, pass on."""
    now = [0.0]
    said = []

    def clock():
        return now[0]
    chief, worker0, worker1 = _task("chief", 0, 1000, 10), _task("worker", 0, 2000, 11), \
        _task("worker", 1, 2001, 12, code=-9)
    outages = outages_lib.Outages([chief, worker0, worker1], said.append, clock=clock)
    outages.went_down(worker1, restarting=True)
    now[0] = 1.0
    assert [outages.feed("chief:0", line) for line in CHIEF_BLOCK] == [[]] * 5
    saved = "kerastrain: checkpoint saved at step 8: ..."
    assert outages.feed("chief:0", saved) == [saved]
    alive = CHIEF_BLOCK[0].replace("task:1", "task:0")
    assert [outages.feed("chief:0", line) for line in (alive, CHIEF_BLOCK[1])] == [
        [alive], [CHIEF_BLOCK[1]]]
    worker1.process = _Process(13)
    now[0] = 2.0
    outages.heard(worker1, "kerastrain: serving worker:1 on port 2001 of ...")
    # Back, but the chief's channel may still be backing off: its errors are held until they
    # have stopped for QUIET_SECS, then the outage is said.
    assert outages.feed("chief:0", CHIEF_BLOCK[3]) == [] and said == []
    now[0] += outages_lib.QUIET_SECS
    outages.tick()
    assert said == ["worker:1 (pid 12) was unreachable for 2.0 s while it restarted; its steps "
                    "ran on worker:0 (6 line(s) of TensorFlow's gRPC errors about it on chief:0 "
                    "held back; `kerastrain launch -v` shows them)"]
    outages.at_end("chief:0 exited")
    assert len(said) == 1


def test_a_block_with_a_status_context_between_its_lines_is_held_whole():
    """TensorFlow's coordinator logs a remote function's error with its whole status: the
    node it ran in (`\t [[{{node ...}}]]`) may stand between the header and the gRPC lines.
    Every line of it is held while the worker is down (a CI run showed the gRPC lines after
    such a line on the screen); a gRPC line that names the dead worker is held even when
    what came before it was not."""
    said = []
    chief, worker1 = _task("chief", 0, 1000, 10), _task("worker", 1, 2001, 12, code=-9)
    outages = outages_lib.Outages([chief, worker1], said.append)
    outages.went_down(worker1, restarting=True)
    block = ["ERROR:tensorflow:Remote function on worker /job:worker/replica:0/task:1/device:"
             "CPU:0 failed with UnavailableError():Socket closed",
             "\t [[{{node while/loop_body_control/_57/_34}}]] "
             "[type.googleapis.com/tensorflow.DerivedStatus='']",
             "From /job:ps/replica:0/task:0:",
             "Additional GRPC error information from remote target /job:worker/replica:0/task:1/"
             "device:CPU:0 while calling /tensorflow.eager.EagerService/RunComponentFunction:",
             ':UNKNOWN:Error received from peer  {grpc_message:"Socket closed", grpc_status:14}',
             "Encountered when executing an operation using EagerExecutor. This error cancels "
             "all future operations and poisons their output tensors. [Op:__inference_loop_1]",
             "It is treated as a transient connectivity failure for now."]
    assert [outages.feed("chief:0", line) for line in block] == [[]] * len(block)
    mine = "kerastrain: checkpoint saved at step 64: ..."
    assert outages.feed("chief:0", mine) == [mine]
    assert [outages.feed("chief:0", line) for line in block[3:5]] == [[], []]
    assert outages.feed("chief:0", mine) == [mine]
    outages.at_end("chief:0 exited")
    assert said == ["worker:1 (pid 12) was still restarting (0.0 s) when chief:0 exited; no "
                    "other worker was up: the chief waited for it (9 line(s) of TensorFlow's "
                    "gRPC errors about it on chief:0 held back; `kerastrain launch -v` shows "
                    "them)"]


def test_a_worker_that_dies_without_the_launcher_knowing_yet_is_looked_up():
    """The chief hears of a death before the launcher's poll: the block waits (at most
    `DECIDE_SECS`) for the process to be seen gone, then is held and said at the end."""
    said = []
    chief, worker1 = _task("chief", 0, 1000, 10), _task("worker", 1, 2001, 12, code=-9)
    outages = outages_lib.Outages([chief, worker1], said.append)
    assert outages.feed("chief:0", CHIEF_BLOCK[3]) == []
    # A multi-worker peer's block names the worker in its second line only.
    ring = ("E0000 00:00:1795848900.220668   17050 ring_alg.cc:291] Aborting RingReduce with "
            "UNAVAILABLE: Socket closed")
    assert outages.feed("worker:0", ring) == []
    assert outages.feed("worker:0", CHIEF_BLOCK[1]) == []
    assert outages.feed("worker:0", ring) == [] and outages.flush("worker:0") == [ring]
    assert outages.feed("worker:0", ring) == [] and outages.feed("worker:0", "x") == [ring, "x"]
    # TensorFlow's coordination service names it as /job:worker/task:1, then on lines of
    # their own.
    unhealthy = ["E0000 00:00:1795850432.900201   27719 base_collective_executor.cc:252] "
                 "BaseCollectiveExecutor::StartAbort UNAVAILABLE: Error reported from "
                 "/job:worker/task:1: The following tasks are unhealthy (stopped sending "
                 "heartbeats):", "/job:worker/replica:0/task:1", "The tasks have crashed. Check "
                 "the task logs for an earlier error, or scheduler events (e.g. preemption, "
                 "eviction) to debug further. [type.googleapis.com/tensorflow.Coordination"
                 "ServiceError='']"]
    assert [outages.feed("worker:0", line) for line in unhealthy] == [[]] * 3
    outages.at_end("chief:0 exited")
    assert said == ["worker:1 (pid 12) exited: 6 line(s) of TensorFlow's gRPC errors about it "
                    "on chief:0, worker:0 held back; `kerastrain launch -v` shows them"]


def test_launch_verbose_shows_everything_raw():
    tasks = [_task("chief", 0, 1000, 10), _task("worker", 0, 2000, 11)]
    raw = launch_lib.Launcher(tasks, env={"TF_CPP_MIN_LOG_LEVEL": "2"}, verbose=True)
    assert raw.env["TF_CPP_MIN_LOG_LEVEL"] == "0" and raw.outages is None
    dry = subprocess.run(["python", "-m", "kerastrain.cli", "launch", QUICKSTART, "--workers",
                          "1", "-v", "--dry-run"], capture_output=True, text=True,
                         env=helpers.child_env(), cwd=helpers.REPO)
    assert f"run {QUICKSTART} -v" in dry.stdout, dry.stdout + dry.stderr


def test_a_users_log_level_hides_the_start_up_lines_it_would_have_hidden(capfd, monkeypatch):
    """The lines TensorFlow prints before reading TF_CPP_MIN_LOG_LEVEL, filtered by it: at 2
    notes and warnings dropped, at 1 notes only (absl's notice is a warning)."""
    from kerastrain import _logging
    notes = ["WARNING: All log messages before absl::InitializeLog() is called are written to "
             "STDERR", "I0000 00:00:1795836952.324434   21748 port.cc:153] oneDNN custom "
             "operations are on."]
    monkeypatch.setattr(_logging, "_started", None)
    for level, shown in ((2, []), (1, [notes[0]])):
        monkeypatch.setattr(_logging, "_level", level)
        _logging._start_held(lambda: os.write(2, ("\n".join(notes * 2) + "\n").encode()) and [])
        assert capfd.readouterr().err.splitlines() == shown * 2


@pytest.mark.multiprocess
def test_a_multi_worker_launch_and_its_restart_print_no_tensorflow_start_up_lines(tmp_path):
    """TF_CPP_MIN_LOG_LEVEL=2 in the launcher's environment (as the tests' helpers set it):
    every task, started and restarted, shows only kerastrain's lines and Keras's."""
    run = Launch([QUICKSTART, "--workers", "2", "--max-restarts", "1",
                  "--fault", "kill worker:1 at step 16", *_sets([
                      "trainer.epochs=1", "data.train.args.num_examples=8192",
                      "data.validation.args.num_examples=256", "trainer.verbose=2",
                      "checkpoints.every_steps=16", "tensorboard=false",
                      f"trainer.model_dir={tmp_path}"])])
    assert run.finish() == 0, run.text[-6000:]
    assert "restarting every task (1/1)" in run.text
    assert run.text.count("kerastrain: devices: the CPU") == 4, run.text
    assert not _noise(run.text), _noise(run.text)


@pytest.mark.multiprocess
def test_a_ps_worker_killed_and_restarted_is_one_launcher_line_not_grpc_errors(tmp_path):
    """worker:1 killed once a checkpoint of step 64 exists: the chief's gRPC error blocks
    about it are replaced by one line saying how long it was away and who ran its steps."""
    run = Launch([PS_RECIPE, "--workers", "2", "--ps", "1", "--fault", "kill worker:1 at step 64",
                  *_sets(["trainer.epochs=3", "data.train.args.num_examples=65536",
                          "data.validation.args.num_examples=256", "trainer.verbose=2",
                          "trainer.steps_per_loop=4", "checkpoints.every_steps=64",
                          "tensorboard=false", f"trainer.model_dir={tmp_path}"])])
    assert run.finish() == 0, run.text[-6000:]
    assert "[launch] worker:1 exited with signal SIGKILL; restarting it (1/3)" in run.text
    pid = re.search(r"started worker:1 \(pid (\d+)\)", run.text).group(1)
    assert re.search(rf"\[launch\] worker:1 \(pid {pid}\) was (unreachable for \d+\.\d s while "
                     r"it restarted|still restarting \(\d+\.\d s\) when chief:0 exited); its "
                     r"steps ran on worker:0", run.text), run.text[-4000:]
    assert "step 768," in run.wait_for(r"\[chief:0\] kerastrain: done:").string
    assert not _noise(run.text), _noise(run.text)

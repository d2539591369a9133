"""Under parameter servers every example is trained on exactly once per pass of the data.

A layer inside the model counts the ids of every batch it trains on (`_visits_worker.py`),
so these tests see what the workers trained, not what the input pipeline produced.
"""

import json
import os
import random
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

import helpers

pytestmark = pytest.mark.multiprocess

N, BATCH = 512, 16          # 32 global batches a pass
PER_PASS = N // BATCH


def _run(job, out, timeout=600):
    proc = helpers.run_python(["tests/_visits_worker.py", json.dumps(job), str(out)],
                              timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return json.loads(out.with_suffix(".json").read_text()), proc.stderr


def _problems(result):
    """What is wrong with one case's per-epoch id counts ([] when every id is exact)."""
    case, epochs = result["case"], np.asarray(result["per_epoch"])
    batches = case["steps_per_epoch"] * case.get("accumulation", 1)  # read per epoch
    label = (f"{case['form']} steps_per_loop={case['steps_per_loop']} "
             f"steps_per_epoch={case['steps_per_epoch']} {case.get('model', '')}")
    if batches < PER_PASS:
        # Consecutive epochs take consecutive, disjoint parts of a pass.
        per_pass = PER_PASS // batches
        wrong = [e for e, counts in enumerate(epochs)
                 if set(np.unique(counts)) - {0, 1} or counts.sum() != batches * BATCH]
        passes = epochs[:len(epochs) // per_pass * per_pass].reshape(-1, per_pass, N).sum(1)
        wrong += [f"pass {p}" for p, counts in enumerate(passes) if (counts != 1).any()]
    else:
        wrong = [(e, int((counts == 0).sum()), int(counts.max())) for e, counts in
                 enumerate(epochs) if (counts != batches // PER_PASS).any()]
    return [f"{label}: epochs (index, never trained, most trained) {wrong}"] if wrong else []


def _grid():
    """steps_per_loop x steps_per_epoch, each pair once, its input form alternating so that
    each form meets every loop length and every epoch length (every pair of the three
    factors is covered; the form decides how a worker reads, the two lengths where loops
    cut passes). Each epoch is scheduled anew and checked on its own: half-pass epochs run
    three times (the second straddles two passes), one-pass epochs twice (a new pass each),
    an epoch of 256 steps (eight passes, each id checked to be trained 8 times) once. One
    step per loop is not run for eight passes: 256 loops that cross pass ends as the 16-
    and 32-step epochs already do."""
    forms = ("numpy", "context_fn")
    return [{"form": forms[(i + j) % 2], "steps_per_loop": spl, "steps_per_epoch": spe,
             "epochs": {16: 3, 32: 2, 256: 1}[spe]}
            for i, spl in enumerate(("auto", 1, 4, 16)) for j, spe in enumerate((16, 32, 256))
            if not (spl == 1 and spe == 256)]


def _check_pairs(grid):
    """Every pair of the grid's three factors is in it (the one excluded pair aside)."""
    pairs = [("form", "steps_per_loop"), ("form", "steps_per_epoch"),
             ("steps_per_loop", "steps_per_epoch")]
    for a, b in pairs:
        seen = {(case[a], case[b]) for case in grid}
        assert len(seen) == len({c[a] for c in grid}) * len({c[b] for c in grid}) - (
            1 if (a, b) == pairs[2] else 0), (a, b, seen)
    # The worst case before exact visits (one loop taking a whole one-pass epoch) is there.
    assert {"form": "context_fn", "steps_per_loop": "auto", "steps_per_epoch": 32,
            "epochs": 2} in grid


def test_every_example_once_per_pass_for_any_loop_and_epoch_length(tmp_path):
    """2 workers, steps_per_loop auto/1/4/16 x epochs of 16, 32 and 256 steps (half a pass,
    one pass, eight passes), with NumPy arrays or a dataset_fn(ctx) (`_grid`); global-batch
    datasets; a
    model with its own train_step; gradient accumulation; the case that failed worst before
    exact visits (one loop taking the whole epoch: half the ids twice, half never) is run
    three times. One process, one cluster, every case in turn."""
    cases = _grid()
    _check_pairs(cases)
    cases += [{"form": "context_fn", "steps_per_loop": "auto", "steps_per_epoch": 32,
               "epochs": 2}] * 2
    cases += [{"form": form, "steps_per_loop": "auto", "steps_per_epoch": 32, "epochs": 1}
              for form in ("dataset", "global_fn")]
    # A model's own train_step (ModelStep) and 2 batches per update read positions too.
    cases += [{"form": "context_fn", "steps_per_loop": 4, "steps_per_epoch": 16, "epochs": 2,
               "own_step": True, "model": "own train_step"},
              {"form": "numpy", "steps_per_loop": "auto", "steps_per_epoch": 8, "epochs": 3,
               "accumulation": 2, "model": "accumulation 2"}]
    # Data of unknown size and an infinite stream: consecutive batches of the stream.
    cases += [{"form": "unknown", "steps_per_loop": 4, "steps_per_epoch": 32, "epochs": 2},
              {"form": "infinite", "steps_per_loop": 4, "steps_per_epoch": 16, "epochs": 2}]
    # One fit call per epoch: each fit goes on from the data position the last one left.
    cases.append({"form": "context_fn", "steps_per_loop": 4, "steps_per_epoch": 32, "epochs": 3,
                  "fit_per_epoch": True})
    # Opting out (shard="off"): each worker back on its own pipeline; only the log is checked.
    cases.append({"form": "context_fn", "steps_per_loop": 4, "steps_per_epoch": 16, "epochs": 1,
                  "shard": "off"})
    results, log = _run({"n": N, "cases": cases}, tmp_path / "grid")
    problems = [p for r in results if "shard" not in r["case"] for p in _problems(r)]
    assert not problems, "\n".join(problems)
    assert [r["global_step"] for r in results] == [
        c["steps_per_epoch"] * c["epochs"] for c in cases]
    # Loops of any length (cut at log steps: 100, 200) share at most two traces each.
    assert max(r["traces"] for r in results) <= 2, [(r["case"], r["traces"]) for r in results]
    assert max(r["traces"] for r in results) == 2   # some loop was cut: the check bites
    # The one-line account says what holds, per form.
    assert "training data: every worker reads the whole data, in one device's order, and " \
        "trains the positions the coordinator gives each loop: every batch once per pass" in log
    assert "training data: dataset_fn(ctx) is called once per input pipeline (2 in all); every " \
        "worker reads every pipeline, taking their batches in turn" in log
    assert "every batch once per pass of the data (its size is unknown: an epoch is " \
        "`steps_per_epoch` batches of the repeated data" in log
    assert "every batch of the data's (infinite) stream once, in order" in log
    assert "shards its own data: kerastrain leaves sharding to it; each worker reads its own " \
        "shard (shard='off' asked for it, exact visits off): within an epoch examples may " \
        "repeat or be skipped" in log
    # No worker failed, so no loop found its worker past its positions (a later fit
    # starting the data again at position 0 put every loop there, run again one at a time).
    assert "fresh copy of the data" not in log
    print({f"{r['case']['form']}/{r['case']['steps_per_loop']}/{r['case']['steps_per_epoch']}":
           r["seconds"] for r in results})


def test_sigterm_mid_epoch_then_resume_trains_every_example_of_the_epoch_once(tmp_path):
    """The coordinator is stopped at a random point; the rerun resumes the epoch where the
    data stood: over the whole run every id is trained exactly `passes` times, and the
    checkpoint it saved names the step its variables hold (its step counter and place in the
    epochs agree)."""
    import tensorflow as tf

    marker = tmp_path / "started"
    case = {"form": "context_fn", "steps_per_loop": 4, "steps_per_epoch": 96, "epochs": 3,
            "batch": 4, "model_dir": str(tmp_path / "run"), "started_marker": str(marker),
            "marker_epoch": 1, "sleep_per_loop": 0.05}
    job = json.dumps({"n": 128, "cases": [case]})   # 32 batches a pass: 3 passes an epoch
    args = [sys.executable, "tests/_visits_worker.py", job, str(tmp_path / "out")]
    env = helpers.child_env(TF_CPP_MIN_LOG_LEVEL="2")
    first = subprocess.Popen(args, env=env, cwd=helpers.REPO, stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 180
    while not marker.exists():
        assert first.poll() is None and time.monotonic() < deadline
        time.sleep(0.05)
    time.sleep(random.uniform(0.1, 1.0))   # into the second epoch (24 loops of >= 0.05 s)
    first.send_signal(signal.SIGTERM)
    stderr = first.communicate(timeout=180)[1]
    assert first.returncode == 143, stderr[-3000:]
    step = int(re.search(r"SIGTERM: stopped after step (\d+)", stderr).group(1))
    assert 96 <= step < 288, stderr[-3000:]
    in_flight = re.search(r"stop requested: (\d+) loop\(s\) in flight \((\d+) steps\) finish "
                          r"first, so the variables hold every batch they read and none is "
                          r"trained again on resume", stderr)
    # The checkpoint's name, its step counter and its place in the epochs all agree.
    path = tf.train.latest_checkpoint(str(tmp_path / "run" / "checkpoints"))
    assert path.endswith(f"ckpt-{step}"), (path, step)
    saved = tf.train.load_checkpoint(path)

    def value(name):
        return int(saved.get_tensor(f"{name}/.ATTRIBUTES/VARIABLE_VALUE"))
    assert value("global_step") == step
    assert value("epoch") * 96 + value("step_in_epoch") == step
    again = subprocess.run(args, env=env, cwd=helpers.REPO, capture_output=True, text=True,
                           timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]
    assert f"resumed from {path}: step {step}" in again.stderr, again.stderr[-3000:]
    assert re.search(r"the data continues at pass \d+, batch \d+ of 32: no batch of the epoch "
                     r"is skipped", again.stderr), again.stderr[-3000:]
    (result,) = json.loads((tmp_path / "out.json").read_text())
    assert result["global_step"] == 288
    # The layer's counts were checkpointed with the model: over both runs, every id was
    # trained exactly 9 times (3 epochs of 3 passes), none skipped and none repeated.
    counts = np.asarray(result["total"])
    assert (counts == 9).all(), (np.unique(counts, return_counts=True), in_flight)


LOOP, LOOP_BATCH = 8, 8     # the killed and frozen workers' tests: steps a loop, its batch


def _chief_training_beside_two_workers(tmp_path, tf_config_cluster, **case):
    """A TF_CONFIG cluster of processes (ps, two workers) and its chief, once the chief has
    started training (2 epochs of one pass of 2048 ids, loops of `LOOP` steps)."""
    cluster = tf_config_cluster(chief=1, worker=2, ps=1)
    servers = [cluster.serve(task, index, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
               for task, index in (("ps", 0), ("worker", 0), ("worker", 1))]
    marker = tmp_path / "started"
    case = {"form": "numpy", "steps_per_loop": LOOP, "steps_per_epoch": 256, "epochs": 2,
            "batch": LOOP_BATCH, "started_marker": str(marker), **case}
    chief = helpers.Child(["tests/_visits_worker.py", json.dumps({"n": 2048, "cases": [case]}),
                           str(tmp_path / "out")], env={"TF_CONFIG": cluster.tf_config("chief", 0)})
    deadline = time.monotonic() + 240
    while not marker.exists():
        assert chief.process.poll() is None and time.monotonic() < deadline, chief.text
        time.sleep(0.05)
    return cluster, servers, chief


def _assert_only_the_loop_in_flight_repeated(tmp_path, chief):
    """The job ends at its exact last step; no id skipped; the ids trained twice are at most
    the steps of the one loop the lost worker was running, as many as the log reports."""
    assert chief.finish(timeout=400) == 0, chief.text[-5000:]
    (result,) = json.loads((tmp_path / "out.json").read_text())
    assert result["global_step"] == 512
    extra = np.asarray(result["total"]) - 2      # 2 epochs of one pass each
    assert extra.min() == 0, "ids never trained: %s" % np.flatnonzero(extra < 0)[:20]
    assert extra.sum() <= LOOP * LOOP_BATCH, np.unique(extra, return_counts=True)
    reported = re.findall(r"so (\d+) step\(s\) \(their batches\) were trained twice", chief.text)
    repeated = sum(int(r) for r in reported)
    # The count of a step that was cut between the model's update and the step counter's
    # may differ by that one batch.
    assert abs(extra.sum() - repeated * LOOP_BATCH) <= LOOP_BATCH, \
        (extra.sum(), reported, chief.text[-3000:])


def test_a_worker_killed_mid_epoch_repeats_only_its_loop_in_flight_and_says_so(
        tmp_path, tf_config_cluster):
    """A TF_CONFIG cluster of processes; worker 1 is killed (SIGKILL, not restarted) at a
    random point. The coordinator runs its loop again on worker 0, at the same positions:
    no id is skipped, and the ids trained twice are those of that loop's steps that had
    run, as many as the log reports."""
    _, servers, chief = _chief_training_beside_two_workers(tmp_path, tf_config_cluster)
    time.sleep(random.uniform(1.0, 3.0))
    servers[2].kill()
    _assert_only_the_loop_in_flight_repeated(tmp_path, chief)


def test_a_frozen_worker_named_then_restarted_repeats_only_its_loop_in_flight(
        tmp_path, tf_config_cluster):
    """Worker 1 stopped (SIGSTOP) at a random point. The chief names it once it has answered
    nothing for `frozen_worker_timeout`; then this test does what `kerastrain launch` does
    on that line: kills it and starts it again at its address. Its loop runs again on
    worker 0 at the same positions: no id is skipped, the ids trained twice are those of
    the steps that loop had run, as many as the log says, and the job is not restarted."""
    cluster, servers, chief = _chief_training_beside_two_workers(
        tmp_path, tf_config_cluster, strategy={"frozen_worker_timeout": 6})
    time.sleep(random.uniform(0.5, 2.0))
    servers[2].send_signal(signal.SIGSTOP)
    frozen = time.monotonic()
    # No launcher here: the line says nobody ends it, and the steps move once it is ended.
    chief.wait_for(r"kerastrain: worker:1 answered nothing for \d+ s \(frozen\?\): its steps "
                   r"run on worker:0 once it is ended; nothing here can end it", timeout=60)
    assert time.monotonic() - frozen < 6 + 20
    servers[2].kill()
    servers[2].wait()
    cluster.serve("worker", 1, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _assert_only_the_loop_in_flight_repeated(tmp_path, chief)
    assert chief.text.count("answered nothing") == 1
    assert "failed with UnavailableError" not in chief.text and "stalled" not in chief.text

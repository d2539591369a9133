"""From a laptop to a cluster: TF_CONFIG errors, `kerastrain launch`, manifests, failures."""

import json
import os
import re
import signal
import sys
import threading
import time

import numpy as np
import pytest
import yaml

import helpers
from kerastrain.cli import command as cli
from kerastrain.distribute import cluster
from kerastrain.cli import manifests
from kerastrain.cli.interrupts import Interrupts

RECIPES = os.path.join(helpers.REPO, "recipes")
QUICKSTART = os.path.join(RECIPES, "quickstart.yaml")
PS_RECIPE = os.path.join(RECIPES, "parameter_server.yaml")


# -- TF_CONFIG --------------------------------------------------------------------------

MALFORMED = [
    ("bad JSON", '{"cluster": {"worker": ["127.0.0.1:1"]', QUICKSTART,
     "`TF_CONFIG` is not valid JSON"),
    ("missing task", '{"cluster": {"worker": ["127.0.0.1:1", "127.0.0.1:2"]}}', QUICKSTART,
     "`TF_CONFIG['task']['type']` must name a job of the cluster (['worker']). Received: task={}"),
    ("index out of range", '{"cluster": {"worker": ["127.0.0.1:1", "127.0.0.1:2"]}, '
                           '"task": {"type": "worker", "index": 2}}', QUICKSTART,
     "`TF_CONFIG['task']['index']` must be between 0 and 1 for job 'worker'"),
    ("ps strategy, no ps tasks", '{"cluster": {"worker": ["127.0.0.1:1"]}, '
                                 '"task": {"type": "worker", "index": 0}}', PS_RECIPE,
     "The recipe's strategy is 'ps' but TF_CONFIG has no `ps` tasks"),
    ("ps cluster, no chief", '{"cluster": {"worker": ["127.0.0.1:1"], "ps": ["127.0.0.1:2"]}, '
                             '"task": {"type": "worker", "index": 0}}', PS_RECIPE,
     "A parameter-server cluster needs a `chief` task"),
    ("ps cluster, mirrored recipe", '{"cluster": {"chief": ["127.0.0.1:3"], "worker": '
                                    '["127.0.0.1:1"], "ps": ["127.0.0.1:2"]}, "task": '
                                    '{"type": "chief", "index": 0}}',
     os.path.join(RECIPES, "mirrored.yaml"),
     "TF_CONFIG describes a parameter-server cluster (1 ps task(s)) but the recipe's strategy "
     "is 'mirrored'"),
    ("unknown job", '{"cluster": {"master": ["127.0.0.1:1"]}, '
                    '"task": {"type": "master", "index": 0}}', QUICKSTART,
     "unknown job names ['master']"),
    ("two chiefs", '{"cluster": {"chief": ["127.0.0.1:1", "127.0.0.1:2"]}, '
                   '"task": {"type": "chief", "index": 0}}', QUICKSTART,
     "A cluster has at most one chief"),
]


@pytest.mark.parametrize("name,tf_config,recipe,message", MALFORMED,
                         ids=[case[0] for case in MALFORMED])
def test_malformed_tf_config_is_a_clear_error_before_any_server_starts(
        monkeypatch, capsys, name, tf_config, recipe, message):
    monkeypatch.setenv("TF_CONFIG", tf_config)
    assert cli.main(["run", recipe]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err, err


def test_local_cluster_ports_never_collide(monkeypatch):
    # The cause of "Unable to parse request" from a worker: two servers given one port.
    mine = [cluster.free_port() for _ in range(20)]
    assert len(set(mine)) == 20
    with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
        ephemeral = int(f.read().split()[0])
    assert all(port < ephemeral for port in mine)  # clients' local ports never take them
    # Another process (a test beside this one, another launch) cannot reserve them.
    proc = helpers.run_python(f"from kerastrain.distribute import cluster; "
                              f"print([cluster._reserve(p) for p in {mine}])")
    assert proc.stdout.strip() == str([False] * 20), proc.stderr
    # A port some server listens on (every interface, as TensorFlow's) is skipped.
    import socket
    with socket.socket() as busy:
        busy.bind(("0.0.0.0", 0))
        busy.listen()
        taken = busy.getsockname()[1]
        choices = iter([taken, mine[0], taken + 1 if taken + 1 not in mine else taken + 2])
        monkeypatch.setattr(cluster, "_candidate", lambda: next(choices))
        got = cluster.free_port()
    assert got not in (taken, mine[0])


def test_choosing_ports_leaves_a_seeded_scripts_random_stream_alone():
    # Keras seeds its initializers from Python's `random` (`keras.utils.set_random_seed`
    # seeds it): a local ps cluster's ports drawn from it gave other initial weights on each
    # run of a seeded script, as many draws as ports turned out taken.
    import random
    random.seed(0)
    expected = random.random()
    random.seed(0)
    cluster.free_port()
    assert random.random() == expected


@pytest.mark.multiprocess
def test_a_multi_worker_task_that_ends_normally_prints_no_error_about_peers(tf_config_cluster):
    # The coordination service lives in worker:0; a task alive when it exits logged
    # "StartAbort UNAVAILABLE: Failed to send RPC to coordination service".
    codes, outputs = tf_config_cluster(worker=2).run_workers(
        "tests/_end_together_worker.py", "together", "", timeout=120)
    assert codes == [0, 0], outputs
    ended = [float(re.search(r"ended at ([0-9.]+)", out).group(1)) for out in outputs]
    assert ended[0] >= ended[1], outputs  # the leader last
    assert not [line for out in outputs for line in out.splitlines()  # cuInit: no GPU here
                if re.match(r"E\d{4} ", line) and "cuInit" not in line or "StartAbort" in line]


def test_tf_config_from_slurm(monkeypatch):
    monkeypatch.setenv("SLURM_PROCID", "2")
    monkeypatch.setenv("SLURM_STEP_NUM_TASKS", "4")
    monkeypatch.setenv("SLURM_STEP_NODELIST", "gpu[07-10]")
    monkeypatch.setenv("SLURM_STEP_TASKS_PER_NODE", "1(x4)")
    mwm = json.loads(cluster.tf_config_from_slurm("multi_worker_mirrored"))
    assert mwm == {"cluster": {"worker": [f"gpu{n:02d}:8888" for n in range(7, 11)]},
                   "task": {"type": "worker", "index": 2}}
    ps = json.loads(cluster.tf_config_from_slurm("ps", num_ps=1))
    assert ps["cluster"] == {"chief": ["gpu07:8888"], "ps": ["gpu08:8888"],
                             "worker": ["gpu09:8888", "gpu10:8888"]}
    assert ps["task"] == {"type": "worker", "index": 0}
    monkeypatch.delenv("SLURM_PROCID")
    with pytest.raises(ValueError, match="needs to run inside a Slurm job step"):
        cluster.tf_config_from_slurm("multi_worker_mirrored")


# -- launch --dry-run and manifests ---------------------------------------------------------

def test_launch_dry_run_prints_each_task_and_starts_nothing(capsys):
    assert cli.main(["launch", PS_RECIPE, "--workers", "2", "--ps", "1", "--evaluator",
                     "--set", "trainer.epochs=1", "--dry-run"]) == 0
    out = capsys.readouterr().out
    configs = {m.group(1): json.loads(m.group(2))
               for m in re.finditer(r"^\[(\w+:\d)\] TF_CONFIG='(.+)'$", out, re.M)}
    assert sorted(configs) == ["chief:0", "evaluator:0", "ps:0", "worker:0", "worker:1"]
    training = configs["chief:0"]["cluster"]
    assert sorted(training) == ["chief", "ps", "worker"]   # the evaluator is left out
    assert configs["evaluator:0"]["cluster"]["evaluator"]
    ports = [a for job in configs["evaluator:0"]["cluster"].values() for a in job]
    assert len(set(ports)) == 5 and all(a.startswith("127.0.0.1:") for a in ports)
    for name, config in configs.items():
        assert config["task"] == {"type": name.split(":")[0], "index": int(name[-1])}
        if name != "evaluator:0":
            assert config["cluster"] == training
    assert out.count(f"-m kerastrain.cli run {PS_RECIPE} --set trainer.epochs=1") == 5


def test_kubernetes_manifest_structure(capsys):
    assert cli.main(["export", "k8s", "recipes/parameter_server.yaml", "--workers", "3", "--ps",
                     "2", "--image", "registry.example/train:1", "--volume", "runs-claim"]) == 0
    job = yaml.safe_load(capsys.readouterr().out)
    assert job["apiVersion"] == "kubeflow.org/v1" and job["kind"] == "TFJob"
    assert job["metadata"]["name"] == "parameter-server"
    specs = job["spec"]["tfReplicaSpecs"]
    assert {k: v["replicas"] for k, v in specs.items()} == {"Chief": 1, "Worker": 3, "PS": 2}
    for spec in specs.values():
        assert spec["restartPolicy"] == "OnFailure"
        pod = spec["template"]["spec"]
        (container,) = pod["containers"]
        assert container["name"] == "tensorflow" and container["image"] == \
            "registry.example/train:1"
        # The recipe's runs/parameter_server would be each pod's own disk: on the claim instead.
        assert container["command"] == ["kerastrain", "run", "recipes/parameter_server.yaml",
                                        "--set", "trainer.model_dir=/kerastrain-shared/"
                                        "parameter_server"]
        assert container["volumeMounts"] == [{"name": "shared",
                                              "mountPath": "/kerastrain-shared"}]
        assert pod["volumes"] == [{"name": "shared",
                                   "persistentVolumeClaim": {"claimName": "runs-claim"}}]
        # The training operator sets TF_CONFIG per replica; the manifest must not.
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert "TF_CONFIG" not in env
        assert env["KERASTRAIN_HEARTBEAT"] == manifests.HEARTBEAT
        assert container["livenessProbe"]["exec"]["command"][:2] == ["python", "-c"]


def test_an_exported_job_that_would_fail_in_every_task_is_refused_saying_what_to_do(capsys):
    # Each of these printed a manifest or script whose every task failed at start (a ps
    # recipe without ps replicas: "TF_CONFIG has no `ps` tasks"), or that Slurm rejects.
    for args, said in [
            (["k8s", "recipes/parameter_server.yaml", "--workers", "2"],
             "the recipe's strategy is 'ps', which needs parameter servers: pass --ps N"),
            (["k8s", "recipes/multi_worker.yaml", "--workers", "2", "--ps", "1"],
             "--ps 1 gives parameter servers to a recipe whose strategy is "
             "'multi_worker_mirrored', which does not use them: drop --ps"),
            (["slurm", "recipes/multi_worker.yaml", "--nodes", "0"],
             "`--nodes` must be an int >= 1 (one worker each), or MIN:MAX with 1 <= MIN <= "
             "MAX (elastic). Received: --nodes 0")]:
        assert cli.main(["export", *args, "--volume", "runs"] if args[0] == "k8s" else
                        ["export", *args]) == 2, args
        assert said in capsys.readouterr().err, args
    # `launch` refuses them too, before any task starts (each failed at start, said once).
    for args, said in [
            (["recipes/parameter_server.yaml", "--workers", "2"],
             "launch: the recipe's strategy is 'ps', which needs parameter servers: pass --ps"),
            (["recipes/multi_worker.yaml", "--workers", "2", "--ps", "1"],
             "launch: --ps 1 gives parameter servers to a recipe whose strategy is "
             "'multi_worker_mirrored'")]:
        assert cli.main(["launch", *args, "--dry-run"]) == 2, args
        assert said in capsys.readouterr().err, args
    # An `auto` recipe takes its strategy from TF_CONFIG: parameter servers are its choice.
    assert cli.main(["export", "k8s", "recipes/quickstart.yaml", "--workers", "2", "--ps",
                     "1", "--volume", "runs"]) == 0
    assert "PS" in yaml.safe_load(capsys.readouterr().out)["spec"]["tfReplicaSpecs"]


@pytest.mark.parametrize("recipe", ["multi_worker", "parameter_server", "embeddings"])
def test_each_cluster_recipe_exports_a_job_that_keeps_its_work(recipe, capsys, tmp_path):
    """A local model_dir is refused (a rescheduled chief would start over); a URL stays as
    it is; the default image is what the project's Dockerfile builds; the probe's check
    passes on a fresh heartbeat file and fails on a stale one."""
    import subprocess
    import sys
    path = f"recipes/{recipe}.yaml"
    shape = ["--workers", "2"] + ([] if recipe == "multi_worker" else ["--ps", "1"])
    assert cli.main(["export", "k8s", path, *shape]) == 2
    err = capsys.readouterr().err
    assert re.search(r"export k8s: trainer.model_dir 'runs/\w+' is a path on each pod's own "
                     r"disk.*Pass --volume CLAIM.*gs://bucket/run.*Received: model_dir=", err), err
    assert cli.main(["export", "k8s", path, *shape, "--set",
                     "trainer.model_dir=gs://bucket/runs/a"]) == 0
    job = yaml.safe_load(capsys.readouterr().out)
    assert list(job["spec"]["tfReplicaSpecs"]) == (
        ["Worker"] if recipe == "multi_worker" else ["Chief", "Worker", "PS"])
    for spec in job["spec"]["tfReplicaSpecs"].values():
        (container,) = spec["template"]["spec"]["containers"]
        assert container["command"][-2:] == ["--set", "trainer.model_dir=gs://bucket/runs/a"]
        assert container["image"] == f"kerastrain:{__import__('kerastrain').__version__}"
        probe = container["livenessProbe"]["exec"]["command"]
    dockerfile = open(os.path.join(helpers.REPO, "Dockerfile")).read()
    assert "docker build -t kerastrain:" + __import__("kerastrain").__version__ in dockerfile
    assert "COPY recipes ./recipes" in dockerfile
    heartbeat = tmp_path / "alive"
    code = probe[-1].replace(repr(manifests.HEARTBEAT), repr(str(heartbeat)))
    from kerastrain.loop import stalls
    stalls.start_heartbeat(str(heartbeat), every=3600)
    deadline = time.monotonic() + 30
    while not heartbeat.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0
    os.utime(heartbeat, (time.time() - 120, time.time() - 120))  # a frozen task's file
    assert subprocess.run([sys.executable, "-c", code]).returncode == 1


def test_the_slurm_script_checkpoints_before_its_time_limit_and_requeues(capsys):
    assert cli.main(["export", "slurm", "recipes/multi_worker.yaml", "--nodes", "4"]) == 0
    script = capsys.readouterr().out
    assert "#SBATCH --nodes=4" in script
    assert "#SBATCH --signal=B:USR1@120" in script and "#SBATCH --requeue" in script
    assert "trap requeue USR1" in script and 'scontrol requeue "$SLURM_JOB_ID"' in script
    assert 'kill -TERM "$tasks"' in script
    assert "srun kerastrain run recipes/multi_worker.yaml --set " \
           "strategy.cluster_resolver=slurm &" in script
    assert cli.main(["export", "slurm", "recipes/multi_worker.yaml", "--set",
                     "trainer.model_dir=/tmp/run"]) == 2
    assert "a node's /tmp is not" in capsys.readouterr().err


# -- real local clusters ----------------------------------------------------------------------

# As a shell starts a background job (`cmd &`, CI runners): with SIGINT ignored, which Python
# then keeps ignored unless the program installs its own handler.
SIGINT_IGNORED = ("sh", "-c", 'trap "" INT; exec "$@"', "sh")


class Launch(helpers.Child):
    """`kerastrain launch ...` as a child process whose output is read as it comes."""

    def __init__(self, args, env=None, prefix=SIGINT_IGNORED):
        super().__init__(["-m", "kerastrain.cli", "launch", *args], env=env, prefix=prefix)

    def pids(self):
        return [int(p) for p in re.findall(r"\[launch\] started \S+ \(pid (\d+)\)", self.text)]


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is gone for every purpose here; the launcher reaps its children.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except OSError:
        return False


def _epoch_losses(text, task="chief:0"):
    return [float(m) for m in re.findall(rf"^\[{task}\] \d+/\d+ - .* - loss: ([0-9.]+)", text,
                                         re.M)]


PS_LONG = ["trainer.epochs=3", "data.train.args.num_examples=12288",
           "data.validation.args.num_examples=512", "trainer.steps_per_loop=4",
           "trainer.verbose=2", "checkpoints.every_steps=12", "tensorboard.log_every_steps=0"]


def _sets(items):
    return [a for item in items for a in ("--set", item)]


@pytest.mark.multiprocess
def test_a_ps_job_survives_a_killed_worker_then_a_killed_ps_and_every_process_exits(tmp_path):
    """worker:1 killed at a random early checkpoint: the launcher restarts it
    and the job goes on. ps:0 killed later (the launcher's fault plan, once a checkpoint of
    step 96 exists): the chief says it lost the cluster, the launcher restarts every task,
    training resumes from the checkpoint and ends at the exact step, every process gone.
    (One job for both faults: each ps launch starts four TensorFlow processes.)"""
    run = Launch([PS_RECIPE, "--workers", "2", "--ps", "1", "--max-restarts", "1",
                  "--fault", "kill ps:0 at step 96",
                  *_sets(PS_LONG + [f"trainer.model_dir={tmp_path}"])])
    # A random step, chosen by the checkpoint it follows, so that the kill lands at least 60
    # steps before the fault plan's (a delay in seconds did not: on a fast host the chief
    # reached step 96 within it, and the worker was killed after ps:0).
    first = np.random.RandomState().choice([12, 24, 36])
    run.wait_for(rf"\[chief:0\] kerastrain: checkpoint saved at step {first}\b")
    worker = int(re.search(r"started worker:1 \(pid (\d+)\)", run.text).group(1))
    os.kill(worker, signal.SIGKILL)
    assert run.finish(timeout=420) == 0, run.text[-6000:]
    before_ps, after_ps = run.text.split("[launch] fault: killed ps:0", 1)
    assert "[launch] worker:1 exited with signal SIGKILL; restarting it (1/3)" in before_ps
    assert "Lost contact with the parameter-server cluster" in after_ps, after_ps[-6000:]
    assert "restarting every task (1/1): training resumes from the last checkpoint" in after_ps
    assert re.search(r"\[chief:0\] kerastrain: resumed from .*ckpt-\d+: step \d+", after_ps)
    done = run.wait_for(r"\[chief:0\] kerastrain: done:").string
    assert "step 144," in done   # 3 epochs of 12,288 examples / 256 = 48 steps (1 after resuming)
    losses = _epoch_losses(after_ps)
    assert losses and losses[-1] < _epoch_losses(before_ps)[0], run.text[-6000:]
    assert "[launch] job finished: chief:0 exited with 0" in run.text
    time.sleep(1)
    assert not [p for p in run.pids() if _alive(p)]


@pytest.mark.multiprocess
def test_a_frozen_ps_worker_is_named_within_its_bound_ended_restarted_and_the_job_finishes(
        tmp_path):
    """worker:1 stopped (SIGSTOP) mid-epoch. The chief names it once its status requests have
    missed their deadlines for `frozen_worker_timeout` (5 s here, 30 by default), whatever
    `stall_timeout` ("auto": 5 minutes); the launcher kills it and starts it again, its loop
    runs on worker:0, and the job ends at the exact step, with no restart of the job, no
    TensorFlow error record about the worker and no process left."""
    run = Launch([PS_RECIPE, "--workers", "2", "--ps", "1", *_sets([
        "trainer.epochs=3", "data.train.args.num_examples=8192",
        "data.validation.args.num_examples=512", "trainer.steps_per_loop=4",
        "trainer.verbose=2", "checkpoints.every_steps=8", "tensorboard=false",
        "strategy.frozen_worker_timeout=5", f"trainer.model_dir={tmp_path}"])])
    run.wait_for(r"\[chief:0\] kerastrain: checkpoint saved at step 16\b")
    worker = int(re.search(r"started worker:1 \(pid (\d+)\)", run.text).group(1))
    os.kill(worker, signal.SIGSTOP)
    frozen = time.monotonic()
    named = run.wait_for(r"\[chief:0\] kerastrain: worker:1 answered nothing for (\d+) s "
                         r"\(frozen\?\): its steps now run on worker:0; kerastrain launch ends "
                         r"it and starts it again \(frozen_worker_timeout=5\)", timeout=60)
    # Its requests go every second with a deadline of 5 / 3 s: named 5 to 7 s after the
    # freeze on an idle machine; the margin is for a busy one.
    assert time.monotonic() - frozen < 5 + 20, run.text[-4000:]
    assert 5 <= int(named.group(1)) <= 11, named.group(0)
    assert run.finish(timeout=240) == 0, run.text[-6000:]
    assert f"[launch] worker:1 answers the chief no request: ending it (pid {worker})" in run.text
    assert "[launch] worker:1 exited with signal SIGKILL; restarting it (1/3)" in run.text
    assert run.text.count("answered nothing") == 1
    assert "stalled" not in run.text and "restarting every task" not in run.text
    assert "failed with UnavailableError" not in run.text   # TensorFlow's block about it
    assert "step 96," in run.wait_for(r"\[chief:0\] kerastrain: done:").string  # 3 x 32 steps
    assert "[launch] job finished: chief:0 exited with 0" in run.text
    pids = run.pids()
    deadline = time.monotonic() + 10
    while [p for p in pids if _alive(p)] and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [p for p in pids if _alive(p)], run.text[-3000:]


def _interrupt_and_check(run, signum=signal.SIGINT, code=130):
    """Send `signum`; the launcher must exit with `code` and leave no task alive."""
    run.process.send_signal(signum)
    assert run.finish(timeout=60) == code, run.text[-4000:]
    pids = run.pids()
    deadline = time.monotonic() + 10
    while [p for p in pids if _alive(p)] and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [p for p in pids if _alive(p)], run.text[-4000:]
    return pids


@pytest.mark.multiprocess
def test_ctrl_c_stops_every_task_within_seconds(tmp_path):
    run = Launch([PS_RECIPE, "--workers", "2", "--ps", "1",
                  *_sets(PS_LONG + [f"trainer.model_dir={tmp_path}"])])
    run.wait_for(r"\[chief:0\] kerastrain: strategy: ps")
    assert len(run.pids()) == 4
    _interrupt_and_check(run)
    assert "[launch] interrupted: stopping every task" in run.text


def test_ctrl_c_before_any_task_starts(tmp_path):
    recipe = tmp_path / "slow.yaml"
    recipe.write_text("model: {builder: _slow_import:build}\n"
                      "data: {train: {builder: helpers:arrays}}\nstrategy: multi_worker_mirrored\n")
    run = Launch([str(recipe), "--workers", "2"])
    run.wait_for(r"^slow import: started")
    assert _interrupt_and_check(run) == []
    assert "[launch] interrupted before any task started" in run.text


def test_a_signal_another_thread_took_still_interrupts_a_main_thread_blocked_in_c():
    # The kernel may hand a process-directed SIGINT to any thread (NumPy's OpenBLAS pool is
    # there once a recipe imports NumPy), and one landing just before a blocking call is only
    # noted: CPython runs the handler when the main thread's call (a recipe module sleeping or
    # downloading in its import) returns. Here the helper thread takes it and the main thread
    # sleeps 30 s: the watcher must wake it (0.2 s) long before the sleep would end.
    def take_it_once_main_sleeps():
        wchan = f"/proc/self/task/{threading.main_thread().native_id}/wchan"
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and "nanosleep" not in open(wchan).read():
            time.sleep(0.01)
        signal.pthread_kill(threading.get_ident(), signal.SIGINT)

    taker = threading.Thread(target=take_it_once_main_sleeps)
    with Interrupts() as interrupts:
        interrupts.watch()
        start = time.monotonic()
        with pytest.raises(KeyboardInterrupt):
            taker.start()
            time.sleep(30)
        waited = time.monotonic() - start
    taker.join()
    assert waited < 10, f"the main thread heard SIGINT only after {waited:.1f} s"
    assert interrupts.exit_code == 130


class LaunchStub(helpers.Child):
    """tests/_launch_stub.py: a Launcher over plain-Python stand-in tasks, SIGINT ignored."""

    def __init__(self, mode, tmp_path):
        super().__init__(["tests/_launch_stub.py", mode, str(tmp_path)], prefix=SIGINT_IGNORED)

    pids = Launch.pids


def test_ctrl_c_while_tasks_start(tmp_path):
    # The stub sends itself SIGINT inside Popen of the first task: after the fork, before
    # the launcher holds the process. The task must still be stopped.
    run = LaunchStub("starting", tmp_path)
    assert run.finish(timeout=60) == 130, run.text
    pids = run.pids()
    assert len(pids) == 1 and not _alive(pids[0]), run.text
    assert "[launch] interrupted: stopping every task" in run.text


@pytest.mark.parametrize("signum,code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_ctrl_c_or_sigterm_while_training(tmp_path, signum, code):
    run = LaunchStub("training", tmp_path)
    for index in range(3):
        run.wait_for(rf"^\[worker:{index}\] training")
    assert len(_interrupt_and_check(run, signum, code)) == 3


def test_no_task_outlives_a_launcher_killed_with_sigkill(tmp_path):
    # SIGKILL (an OOM killer, a CI timeout) leaves the launcher no moment to stop its tasks,
    # each in a session of its own: they end with it (PR_SET_PDEATHSIG).
    run = LaunchStub("training", tmp_path)
    for index in range(3):
        run.wait_for(rf"^\[worker:{index}\] training")
    pids = run.pids()
    run.process.kill()
    run.finish(timeout=10)
    deadline = time.monotonic() + 10
    while [p for p in pids if _alive(p)] and time.monotonic() < deadline:
        time.sleep(0.1)
    assert len(pids) == 3 and not [p for p in pids if _alive(p)], run.text


def test_ctrl_c_during_a_restart(tmp_path):
    run = LaunchStub("restart", tmp_path)
    run.wait_for(r"restarting every task \(1/1\)")
    pids = _interrupt_and_check(run)
    assert len(pids) >= 3, run.text  # the first attempt's three, and any of the second's


PARITY_RECIPE = """\
# Two launched workers must train exactly like one device (same global batches).
model:
  builder: helpers:build_model
data:
  train:
    builder: helpers:global_batch_dataset_fn
    args: {n: 96}
strategy: multi_worker_mirrored
trainer: {epochs: 2, seed: 0, verbose: 2, model_dir: MODEL_DIR}
tensorboard: false
"""


def assert_export_matches_one_device(model_dir):
    """The job's export holds the weights 2 epochs of `PARITY_RECIPE`'s model and data give on
    one device (same global batches), to 1e-5."""
    import keras

    import kerastrain as kt
    reference = kt.Trainer(helpers.build_model, helpers.global_batch_dataset_fn(96),
                           strategy="one_device", seed=0, verbose=0)
    reference.fit(epochs=2)
    exported = keras.saving.load_model(model_dir / "export" / "model.keras")
    for got, want in zip(exported.get_weights(), reference.model.get_weights()):
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)


@pytest.mark.multiprocess
def test_launched_multi_worker_mirrored_matches_one_device(tmp_path):
    recipe = tmp_path / "parity.yaml"
    recipe.write_text(PARITY_RECIPE.replace("MODEL_DIR", str(tmp_path / "run")))
    run = Launch([str(recipe), "--workers", "2", "--evaluator"])
    assert run.finish() == 0, run.text[-6000:]
    assert "[worker:0] kerastrain: strategy: multi_worker_mirrored" in run.text
    # The side-car evaluator evaluated the final checkpoint, then stopped by itself.
    assert re.search(r"\[evaluator:0\] kerastrain: evaluator: step 12: loss [0-9.]+, "
                     r"accuracy", run.text), run.text[-4000:]
    assert "[evaluator:0] kerastrain: evaluator: the chief has finished" in run.text
    assert list((tmp_path / "run" / "logs" / "evaluator").glob("events.out.tfevents.*"))
    assert_export_matches_one_device(tmp_path / "run")
    assert not [p for p in run.pids() if _alive(p)]


def _two_workers_after_a_checkpoint(model_dir, *sets, options=()):
    """A 2-worker multi-worker launch (2 epochs of 64 steps, a checkpoint every 16, one
    restart allowed), once worker:0 has saved: (the launch, worker:1's pid)."""
    run = Launch([QUICKSTART, "--workers", "2", "--max-restarts", "1", *options, *_sets([
        "trainer.epochs=2", "data.train.args.num_examples=16384", *sets,
        "data.validation.args.num_examples=512", "trainer.verbose=2",
        "checkpoints.every_steps=16", "tensorboard=false", f"trainer.model_dir={model_dir}"])])
    run.wait_for(r"\[worker:0\] kerastrain: checkpoint saved at step")
    return run, int(re.search(r"started worker:1 \(pid (\d+)\)", run.text).group(1))


@pytest.mark.multiprocess
def test_a_frozen_then_a_killed_multi_worker_task_each_restart_the_job_which_resumes(tmp_path):
    """Each worker a host of its own (`--network multihost`). worker:1 frozen (SIGSTOP: a hung
    host, a paused VM) by the launcher's fault plan after the first checkpoint: worker:0 waits
    in a collective, says within its stall_timeout that it stalled, with its stacks, and exits
    75; the launcher names the frozen task, kills it and restarts the job. Later worker:1 is
    killed: the launcher does not wait for collectives to time out, it stops the job at once
    and restarts it. The job resumes each time and ends at the exact step count. (One job for
    both faults: each launch and restart starts TensorFlow in every task.)"""
    run, worker = _two_workers_after_a_checkpoint(
        tmp_path, "trainer.stall_timeout=6", options=[
            "--network", "multihost", "--max-restarts", "2",
            "--fault", "freeze worker:1 at step 16 for 300s",
            "--fault", "kill worker:1 at step 80"])
    assert run.finish() == 0, run.text[-6000:]
    frozen, killed = run.text.split("[launch] fault: killed worker:1", 1)
    assert re.search(r"\[launch\] started worker:1 \(pid \d+\) on host worker-1 "
                     r"\(198\.18\.0\.\d+\)", frozen)
    assert "[launch] fault: froze worker:1 for 300 s (freeze worker:1 at step 16 for 300s)" \
        in frozen
    stalled = re.search(r"\[worker:0\] kerastrain: stalled: worker:0 made no progress training "
                        r"under multi_worker_mirrored for \d+ s \(bound 6 s, set by "
                        r"stall_timeout\)", frozen)
    # TensorFlow's heartbeats may notice first (their timeout races the 6 s): one line too.
    lost = re.search(r"\[worker:0\] kerastrain: error: Lost a worker of this multi-worker job "
                     r"\(worker:1: ", frozen)
    assert stalled or lost, frozen[:8000]
    if stalled:
        assert re.search(r"\[worker:0\] (Thread|Current thread) 0x", frozen)  # its stacks
    assert f"frozen here: worker:1 (stopped, pid {worker})" in frozen, frozen[:8000]
    assert "restarting every task (1/2)" in frozen
    assert re.search(r"\[worker:0\] kerastrain: resumed from .*ckpt-\d+", frozen)
    assert "[launch] worker:1 exited with signal SIGKILL; the job cannot go on without it" \
        in killed
    assert "restarting every task (2/2)" in killed
    assert re.search(r"\[worker:0\] kerastrain: resumed from .*ckpt-(8\d|9\d|1\d\d)", killed)
    assert "step 128," in run.wait_for(r"\[worker:0\] kerastrain: done:").string
    assert not [p for p in run.pids() if _alive(p)]


def test_a_launched_script_runs_on_the_training_tasks_and_ps_workers_serve(tmp_path):
    """`kerastrain launch train.py`: the script on every multi-worker task; under ps on the
    chief, the coordinator, while workers and ps tasks serve (their TF_CONFIG says which)."""
    from kerastrain.cli import tasks as tasks_lib
    script = str(tmp_path / "train.py")
    runs = [sys.executable, "-m", "kerastrain.cli.script", script]
    serves = [sys.executable, "-m", "kerastrain.cli.script", "--serve"]
    mw = tasks_lib.tasks_for(tasks_lib.cluster_spec(2), script)
    assert [(t.name, t.command) for t in mw] == [("worker:0", runs), ("worker:1", runs)]
    ps = tasks_lib.tasks_for(tasks_lib.cluster_spec(2, ps=1), script)
    assert [(t.name, t.command) for t in ps] == [
        ("chief:0", runs), ("worker:0", serves), ("worker:1", serves), ("ps:0", serves)]
    assert [json.loads(t.tf_config)["task"] for t in ps][1] == {"type": "worker", "index": 0}
    from kerastrain.cli import script as script_lib
    assert script_lib.main([]) == 2   # usage, nothing run

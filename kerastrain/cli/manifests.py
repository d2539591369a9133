"""Manifests that run a recipe on real clusters: a Kubeflow TFJob, a Slurm batch script.

The same command runs on every task (`kerastrain run RECIPE`); the cluster
manager provides `TF_CONFIG` (the Kubeflow training operator sets it for each
replica of a TFJob), and each task's role follows from it.
"""

from __future__ import annotations

import re
import shlex

import yaml


def _name(text):
    """A Kubernetes object name (DNS-1123 label) from a recipe file name."""
    stem = re.sub(r"\.ya?ml$", "", text.rsplit("/", 1)[-1])
    name = re.sub(r"[^a-z0-9-]+", "-", stem.lower()).strip("-")
    return (name or "kerastrain")[:63]


from kerastrain import __version__
from kerastrain._options import is_int

IMAGE = f"kerastrain:{__version__}"  # what the Dockerfile builds (docs/clusters.md)
MOUNT = "/kerastrain-shared"  # where `--volume` mounts the shared claim in every replica
HEARTBEAT = "/tmp/kerastrain-alive"  # touched by every task (`heartbeat`), read by the probe
HEARTBEAT_SECS = 10
# A frozen task stops touching it: after 3 probes over 90 s the kubelet restarts the container
# (a task that hangs while running is ended by its stall watch, `kerastrain.loop.stalls`).
_PROBE = ("import os, sys, time; sys.exit(time.time() - os.path.getmtime("
          f"{HEARTBEAT!r}) > 60)")


def shared_model_dir(model_dir, volume=None, *, target="k8s"):
    """The `trainer.model_dir` every task of an exported job uses: a URL, or a path on the
    shared volume. A path on a task's own disk (or none) would lose the work when the chief's
    pod is rescheduled: a ValueError that says what to do."""
    from kerastrain.io import files
    if model_dir and files.is_url(model_dir):
        return model_dir
    if volume:
        if model_dir and model_dir.startswith(MOUNT + "/"):
            return model_dir
        leaf = (model_dir or "run").rstrip("/").rsplit("/", 1)[-1]
        return f"{MOUNT}/{leaf}"
    where = "no trainer.model_dir" if not model_dir else (
        f"trainer.model_dir {model_dir!r} is a path on each pod's own disk")
    raise ValueError(
        f"export {target}: {where}, so a chief that is rescheduled or restarted starts again at "
        "step 0 and the export is lost with its pod. Pass --volume CLAIM (a ReadWriteMany "
        f"PersistentVolumeClaim, mounted at {MOUNT} in every replica; model_dir goes under it) "
        "or --set trainer.model_dir=gs://bucket/run (any URL TensorFlow reads). Received: "
        f"model_dir={model_dir!r}")


def tfjob(recipe_path, *, workers, ps=0, chief=False, evaluator=False,
          image=IMAGE, name=None, namespace=None, sets=(), model_dir=None, volume=None,
          cpu="2", memory="4Gi", gpus=0, restart_policy="OnFailure", strategy="auto") -> dict:
    """A `kubeflow.org/v1` TFJob running the recipe on every replica.

    Parameter-server jobs get a Chief (the coordinator). The recipe file must be
    inside the image (the Dockerfile copies `recipes/`) at `recipe_path`. `model_dir` is
    the recipe's (after `sets`): a URL stays; with `volume` (a claim name) it goes under
    the claim's mount; a local path without a volume is refused (`shared_model_dir`).
    Each container touches a heartbeat file; a liveness probe restarts one that stops.
    """
    if workers < 1:
        raise ValueError(f"`workers` must be >= 1. Received: workers={workers}")
    check_ps_for(strategy, ps)
    shared = shared_model_dir(model_dir, volume)
    command = ["kerastrain", "run", recipe_path]
    for item in sets:
        command += ["--set", item]
    if shared != model_dir:
        command += ["--set", f"trainer.model_dir={shared}"]
    resources = {"cpu": str(cpu), "memory": str(memory)}
    if gpus:
        resources["nvidia.com/gpu"] = str(gpus)

    def replicas(count):
        container = {
            "name": "tensorflow",  # the container name the training operator looks for
            "image": image,
            "command": list(command),  # a copy each: no YAML anchors in the output
            "env": [{"name": "PYTHONUNBUFFERED", "value": "1"},
                    {"name": "KERASTRAIN_HEARTBEAT", "value": HEARTBEAT}],
            "resources": {"requests": dict(resources), "limits": dict(resources)},
            "livenessProbe": {"exec": {"command": ["python", "-c", _PROBE]},
                              "initialDelaySeconds": 120, "periodSeconds": 30,
                              "failureThreshold": 3},
        }
        spec = {"containers": [container]}
        if volume:
            container["volumeMounts"] = [{"name": "shared", "mountPath": MOUNT}]
            spec["volumes"] = [{"name": "shared",
                                "persistentVolumeClaim": {"claimName": volume}}]
        return {"replicas": count, "restartPolicy": restart_policy, "template": {"spec": spec}}

    specs = {}
    if chief or ps:
        specs["Chief"] = replicas(1)
    specs["Worker"] = replicas(workers)
    if ps:
        specs["PS"] = replicas(ps)
    if evaluator:
        specs["Evaluator"] = replicas(1)
    metadata = {"name": name or _name(recipe_path)}
    if namespace:
        metadata["namespace"] = namespace
    return {"apiVersion": "kubeflow.org/v1", "kind": "TFJob", "metadata": metadata,
            "spec": {"runPolicy": {"cleanPodPolicy": "Running"}, "tfReplicaSpecs": specs}}


def check_ps_for(strategy, ps, command="export k8s"):
    """Parameter servers exactly where the recipe's strategy (`strategy.name`) uses them: a
    mismatch would fail in every task at start ("TF_CONFIG has no `ps` tasks")."""
    if strategy == "ps" and ps < 1:
        raise ValueError(f"{command}: the recipe's strategy is 'ps', which needs parameter "
                         f"servers: pass --ps N (N >= 1). Received: --ps {ps}")
    if ps and strategy not in ("ps", "auto"):
        raise ValueError(f"{command}: --ps {ps} gives parameter servers to a recipe whose "
                         f"strategy is {strategy!r}, which does not use them: drop --ps, or "
                         f"--set strategy.name=ps. Received: --ps {ps}")


# A TFJob's first lines: what it does when workers come and go (docs/clusters.md).
K8S_SIZE_NOTE = """\
# A TFJob of a fixed size: not elastic. Kubeflow's elasticPolicy is the PyTorchJob's; a
# TFJob's replicas are not resized while it runs (`kerastrain launch --workers MIN:MAX` is
# elastic on one machine). What holds here: a pod that fails is restarted
# (restartPolicy: OnFailure) at its address; under parameter servers the chief runs a lost
# worker's steps on the others and takes it back; under multi-worker mirrored the job goes
# on from model_dir's last checkpoint. To change the number of workers, delete the TFJob and
# apply one exported with another --workers: it resumes at the checkpoint's step with the
# recipe's global batch (each worker takes its share), so the step count stays exact.
"""


def dump(manifest) -> str:
    """The manifest as YAML, after `K8S_SIZE_NOTE` for a TFJob."""
    text = yaml.safe_dump(manifest, sort_keys=False, default_flow_style=False)
    return (K8S_SIZE_NOTE if manifest.get("kind") == "TFJob" else "") + text


def _node_range(nodes):
    """`--nodes`: N, or MIN:MAX (Slurm's `--nodes=MIN-MAX`)."""
    text = str(nodes)
    low, sep, high = text.partition(":")
    if not sep and is_int(nodes, 1) or text.isdigit() and int(text) >= 1:
        return int(text), int(text)
    if sep and low.isdigit() and high.isdigit() and 1 <= int(low) <= int(high):
        return int(low), int(high)
    raise ValueError("export slurm: `--nodes` must be an int >= 1 (one worker each), or MIN:MAX "
                     f"with 1 <= MIN <= MAX (elastic). Received: --nodes {nodes}")


def _slurm_size_note(low, high):
    if low == high:
        return (f"# A fixed size: {low} node(s). `kerastrain export slurm --nodes MIN:MAX` lets "
                "Slurm start it (and\n# start it again when requeued) on what it can give.\n")
    return (f"# Elastic: Slurm starts the job on {low} to {high} nodes, as many as it can give, "
            "and each task's\n# TF_CONFIG is built from the nodes it got. A requeued job (time "
            "limit, preemption, a\n# failed node where Slurm requeues) starts again at the size "
            "Slurm gives then, from the last\n# checkpoint, with the recipe's global batch (each "
            "worker takes its share): the step count\n# stays exact. Not supported: resizing a "
            "running allocation (a lost node ends the step).\n")


def slurm_script(recipe_path, *, nodes, sets=(), time_limit="01:00:00", model_dir=None,
                 warn_secs=120) -> str:
    """An sbatch script: one multi-worker-mirrored worker per node, TF_CONFIG from Slurm.

    Slurm signals the batch shell `warn_secs` before the time limit (and on preemption
    with a grace time); the script passes SIGTERM to the tasks, which save a checkpoint at
    the step they reached and exit 143, then requeues the job, which resumes from it.
    `model_dir` must be on a file system every node mounts: none, or one in a node's
    /tmp, is refused.
    """
    low, high = _node_range(nodes)
    if not model_dir or model_dir.split("/")[1:2] in (["tmp"], ["dev"]) or \
            model_dir.startswith("/var/tmp"):
        raise ValueError(
            "export slurm: trainer.model_dir must be on a file system every node mounts (a "
            "project or home directory usually is; a node's /tmp is not), or the requeued job "
            "starts again at step 0. Set it in the recipe or with --set trainer.model_dir=PATH. "
            f"Received: model_dir={model_dir!r}")
    sets = list(sets) + ["strategy.cluster_resolver=slurm"]
    command = " ".join(shlex.quote(a) for a in ["kerastrain", "run", recipe_path] + [
        x for item in sets for x in ("--set", item)])
    return f"""#!/bin/bash
#SBATCH --job-name={_name(recipe_path)}
#SBATCH --nodes={low if low == high else f"{low}-{high}"}
#SBATCH --ntasks-per-node=1
#SBATCH --time={time_limit}
#SBATCH --signal=B:USR1@{warn_secs}
#SBATCH --requeue
#SBATCH --open-mode=append
# One task per node. `strategy.cluster_resolver=slurm` makes each task build its TF_CONFIG
# from Slurm's variables (SLURM_PROCID, SLURM_STEP_NODELIST, ...), ports from 8888.
# {warn_secs} s before the time limit Slurm sends USR1 to this script: the tasks get SIGTERM,
# save a checkpoint at the step they reached (in {model_dir}) and exit; the job is requeued
# and resumes from that checkpoint.
{_slurm_size_note(low, high)}requeue() {{
    echo "kerastrain: time limit near: checkpointing, then requeueing job $SLURM_JOB_ID"
    kill -TERM "$tasks" 2>/dev/null
    wait "$tasks"
    scontrol requeue "$SLURM_JOB_ID"
    exit 0
}}
trap requeue USR1
srun {command} &
tasks=$!
wait "$tasks"
"""

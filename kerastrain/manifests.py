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


def tfjob(recipe_path, *, workers, ps=0, chief=False, evaluator=False,
          image="kerastrain:latest", name=None, namespace=None, sets=(),
          cpu="2", memory="4Gi", gpus=0, restart_policy="OnFailure") -> dict:
    """A `kubeflow.org/v1` TFJob running the recipe on every replica.

    Parameter-server jobs get a Chief (the coordinator). The recipe file must be
    inside the image (or on a mounted volume) at `recipe_path`, and
    `trainer.model_dir` on storage every replica can reach.
    """
    if workers < 1:
        raise ValueError(f"`workers` must be >= 1. Received: workers={workers}")
    command = ["kerastrain", "run", recipe_path]
    for item in sets:
        command += ["--set", item]
    resources = {"cpu": str(cpu), "memory": str(memory)}
    if gpus:
        resources["nvidia.com/gpu"] = str(gpus)

    def replicas(count):
        container = {
            "name": "tensorflow",  # the container name the training operator looks for
            "image": image,
            "command": list(command),  # a copy each: no YAML anchors in the output
            "env": [{"name": "PYTHONUNBUFFERED", "value": "1"}],
            "resources": {"requests": dict(resources), "limits": dict(resources)},
        }
        return {"replicas": count, "restartPolicy": restart_policy,
                "template": {"spec": {"containers": [container]}}}

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


def dump(manifest) -> str:
    return yaml.safe_dump(manifest, sort_keys=False, default_flow_style=False)


def slurm_script(recipe_path, *, nodes, sets=(), time_limit="01:00:00") -> str:
    """An sbatch script: one multi-worker-mirrored worker per node, TF_CONFIG from Slurm."""
    sets = list(sets) + ["strategy.cluster_resolver=slurm"]
    command = " ".join(shlex.quote(a) for a in ["kerastrain", "run", recipe_path] + [
        x for item in sets for x in ("--set", item)])
    return f"""#!/bin/bash
#SBATCH --job-name={_name(recipe_path)}
#SBATCH --nodes={nodes}
#SBATCH --ntasks-per-node=1
#SBATCH --time={time_limit}
# One task per node. `strategy.cluster_resolver=slurm` makes each task build its TF_CONFIG
# from Slurm's variables (SLURM_PROCID, SLURM_STEP_NODELIST, ...), ports from 8888.
srun {command}
"""

"""What a sweep leaves for comparing trials: TensorBoard's HParams table, the table of the best
trials it prints, and `best.yaml`, the recipe with the best trial's values.

The HParams records are written without TensorFlow (the sweep process never loads it): the
protocol buffers of `tensorboard.plugins.hparams` (`hparams_config_pb` at the sweep's root,
`hparams_pb` per trial in `trial-N/hparams`) through TensorBoard's own event-file writer.
"""

from __future__ import annotations

import glob
import json
import math
import os
import socket
import time

from tensorboard.compat.proto import event_pb2, summary_pb2
from tensorboard.plugins.hparams import summary_v2 as hp
from tensorboard.summary.writer.record_writer import RecordWriter

from kerastrain.cli import recipes
from kerastrain.cli.tune import space as space_lib

HPARAMS = "hparams"   # each trial's HParams session: trial-N/hparams


def _write(directory, summaries):
    """A new event file in `directory` holding `summaries` ((step, Summary) pairs), replacing
    the event files a run of the sweep before wrote there. (TensorBoard's `EventFileWriter`
    would import TensorFlow to make the folder: its `RecordWriter` writes the same records.)"""
    os.makedirs(directory, exist_ok=True)
    for old in glob.glob(os.path.join(directory, "events.out.tfevents.*")):
        os.remove(old)
    now = time.time()
    path = os.path.join(directory, f"events.out.tfevents.{now:.0f}.{socket.gethostname()}."
                                   f"{os.getpid()}.kerastrain-tune")
    writer = RecordWriter(open(path, "wb"))
    events = [event_pb2.Event(wall_time=now, file_version="brain.Event:2")] + [
        event_pb2.Event(wall_time=now, step=step, summary=summary) for step, summary in summaries]
    for event in events:
        writer.write(event.SerializeToString())
    writer.close()


def _domain(param):
    if param.kind == "int":
        return hp.IntInterval(param.low, param.high)
    if param.kind == "float":
        return hp.RealInterval(float(param.low), float(param.high))
    kinds = {type(c) for c in param.choices}
    return hp.Discrete(list(param.choices)) if len(kinds) == 1 and None not in param.choices \
        else None


def write_config(sweep_dir, space, metrics):
    """The experiment at the sweep's root: each param with its domain, `state`, and the
    trials' epoch metrics (`metrics`: their names) plus `epochs`."""
    hparams = [hp.HParam(p.key, _domain(p)) for p in space.params] + [
        hp.HParam("state", hp.Discrete(["complete", "pruned", "failed"]))]
    shown = [hp.Metric(m) for m in sorted(set(metrics) | {space.metric})] + [hp.Metric("epochs")]
    if not glob.glob(os.path.join(sweep_dir, "events.out.tfevents.*")):   # once a sweep
        _write(sweep_dir, [(0, hp.hparams_config_pb(hparams=hparams, metrics=shown))])


def write_session(directory, values, state, epochs):
    """A trial's row: its values and state, and its last epoch's metrics (`epochs`: epoch ->
    logs) at that epoch, in `directory/hparams`."""
    row = {k: v for k, v in values.items() if v is not None}
    row["state"] = state
    summaries = [(0, hp.hparams_pb(row, trial_id=os.path.basename(directory)))]
    if epochs:
        last = max(epochs)
        values = dict(epochs[last], epochs=float(last))
        summaries.append((last, summary_pb2.Summary(value=[
            summary_pb2.Summary.Value(tag=k, simple_value=float(v))
            for k, v in sorted(values.items())])))
    _write(os.path.join(directory, HPARAMS), summaries)


def short_names(keys) -> dict:
    """key -> its last part (`learning_rate`), or the whole key where last parts clash."""
    last = [k.rsplit(".", 1)[-1] for k in keys]
    return {k: (n if last.count(n) == 1 else k) for k, n in zip(keys, last)}


def shown(value) -> str:
    return f"{value:.4g}" if isinstance(value, float) else json.dumps(value)


def table(trials, space, counts) -> list:
    """Lines of the best trials: rank, trial, objective, epochs, each value."""
    names = short_names([p.key for p in space.params])
    head = ["rank", "trial", space.metric, "epochs"] + list(names.values())
    rows = [[str(i + 1), str(t.number), shown(t.value),
             str(max(t.intermediate_values, default=0))] +
            [shown(t.params.get(k)) for k in names] for i, t in enumerate(trials)]
    widths = [max(len(r[i]) for r in [head] + rows) for i in range(len(head))]
    lines = [f"kerastrain tune: {counts}; best {space.direction[:3]} {space.metric}:"]
    lines += ["  " + "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip()
              for r in [head] + rows]
    return lines


def runs(launch):
    """The command that runs a trial's recipe: `kerastrain run`, or launch with its flags."""
    if launch is None:
        return "kerastrain run"
    return f"kerastrain launch --workers {launch['workers']}" + (
        f" --ps {launch['ps']}" if launch["ps"] else "") + (" --chief" if launch["chief"] else "")


def best_recipe(recipe_path, sets, best, sweep_dir, metric, launch=None) -> str:
    """`best.yaml`: the recipe (its includes merged, the sweep's `--set`s applied) with the best
    trial's values and a model_dir of its own, headed by where it came from. Checked here as
    `kerastrain run` will check it."""
    tree, positions = recipes.read(recipe_path, sets)
    # A folder of this trial's own: a later best (the sweep resumed with more trials) trains in
    # another, never resuming this one's checkpoints with other values.
    values = dict(best.params, **{"trainer.model_dir": os.path.join(
        sweep_dir, f"best-trial-{best.number}")})
    tree, positions = space_lib.with_values(tree, positions, values)
    recipes.check(tree, positions)
    epochs = max(best.intermediate_values, default=0)
    value = f"{best.value:.6g}" if math.isfinite(best.value) else str(best.value)
    head = [
        f"# The best trial of the sweep in {sweep_dir}: trial {best.number}, {metric} {value} "
        f"after {epochs} epoch{'s' if epochs != 1 else ''}",
        f"# ({best.user_attrs.get('directory', '')}).",
        f"# It is {recipe_path}" + (f" with --set {' --set '.join(sets)}" if sets else "") +
        " (includes merged) and these values:",
        *[f"#   {k}: {shown(v)}" for k, v in best.params.items()],
        f"# `{runs(launch)}` on this file trains it afresh in trainer.model_dir below;",
        "# builders are imported from the working directory first, as for the recipe it came from.",
    ]
    return "\n".join(head) + "\n" + recipes.dump(tree)


def write_kept(path, text):
    """Write `path` whole; a different file already there (an earlier best, or one edited
    since) is kept as `path.previous-N` first."""
    if os.path.exists(path):
        with open(path) as f:
            if f.read() == text:
                return path
        n = 1
        while os.path.exists(f"{path}.previous-{n}"):
            n += 1
        os.rename(path, f"{path}.previous-{n}")
    with open(path + ".tmp", "w") as f:
        f.write(text)
    os.replace(path + ".tmp", path)
    return path

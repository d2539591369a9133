"""What a ported `model.fit(...)` call says that a recipe says too: `callbacks:`, checked
before TensorFlow starts and built after it, and `data.validation_split`.

    callbacks:
      - {name: EarlyStopping, monitor: val_loss, patience: 3, restore_best_weights: true}
      - {name: CSVLogger, filename: history.csv}     # relative: under trainer.model_dir
      - TerminateOnNaN
      - {name: mypkg.callbacks:MyCallback, every: 10}

Each item is a `keras.callbacks` class name or a `package.module:Class` import path, with the
class's keyword arguments beside `name`. A path a Keras callback writes (`ModelCheckpoint`'s
`filepath`, `CSVLogger`'s `filename`, `TensorBoard`'s `log_dir`, `OrbaxCheckpoint`'s
`directory`) is, when relative, under `trainer.model_dir` (without one: the working
directory); only the chief keeps what they write: on other tasks of a cluster those paths go
to a scratch directory of the process, removed when it ends (as their part of kerastrain's
own checkpoints; `kerastrain.io.outputs` holds that rule). The callbacks run on every task, as `Trainer.fit(callbacks=...)` runs them.
With a model_dir, where a rerun resumes, `CSVLogger` appends unless told otherwise.
"""

from __future__ import annotations

import difflib
import inspect
import os
from typing import Mapping

# The `keras.callbacks` classes a recipe may name, with their arguments, and those it may not
# (with why). Listed here because importing Keras starts TensorFlow; `tests/cli/
# test_recipe_fit_options.py` checks both lists against Keras.
KERAS = {
    "BackupAndRestore": ("backup_dir", "save_freq", "double_checkpoint", "delete_checkpoint"),
    "CSVLogger": ("filename", "separator", "append"),
    "EarlyStopping": ("monitor", "min_delta", "patience", "verbose", "mode", "baseline",
                      "restore_best_weights", "start_from_epoch"),
    "ModelCheckpoint": ("filepath", "monitor", "verbose", "save_best_only", "save_weights_only",
                        "mode", "save_freq", "initial_value_threshold"),
    "OrbaxCheckpoint": ("directory", "monitor", "verbose", "save_best_only", "mode", "save_freq",
                        "initial_value_threshold", "max_to_keep", "save_on_background",
                        "save_weights_only"),
    "ReduceLROnPlateau": ("monitor", "factor", "patience", "verbose", "mode", "min_delta",
                          "cooldown", "min_lr"),
    "RemoteMonitor": ("root", "path", "field", "headers", "send_as_json"),
    "SwapEMAWeights": ("swap_on_epoch",),
    "TensorBoard": ("log_dir", "histogram_freq", "write_graph", "write_images",
                    "write_steps_per_second", "update_freq", "profile_batch", "embeddings_freq",
                    "embeddings_metadata"),
    "TerminateOnNaN": ("raise_error",),
}
REQUIRED = {"BackupAndRestore": ("backup_dir",), "CSVLogger": ("filename",),
            "ModelCheckpoint": ("filepath",), "OrbaxCheckpoint": ("directory",)}
_FUNCTIONS = ("it takes Python functions, which a recipe cannot hold: write a callback class "
              "in your package and name it by import path 'package.module:Class'")
REFUSED = {
    "Callback": "the base class does nothing: name your subclass by import path "
                "'package.module:Class'",
    "CallbackList": "it is not a callback: list the callbacks themselves under callbacks",
    "History": "fit adds one itself (and returns it)",
    "ProgbarLogger": "the progress bar follows trainer.verbose",
    "LambdaCallback": _FUNCTIONS,
    "LearningRateScheduler": _FUNCTIONS + " (or give model.compile.optimizer a learning_rate "
                                          "schedule)",
}
# The argument naming what a callback writes, and its Keras default where it has one.
WRITES = {"ModelCheckpoint": "filepath", "CSVLogger": "filename", "TensorBoard": "log_dir",
          "OrbaxCheckpoint": "directory"}
_DEFAULT_PATH = {"TensorBoard": "logs"}
KINDS = ("a keras.callbacks class name (EarlyStopping, ModelCheckpoint, ...), an import path "
         "'package.module:Class', or {name: ..., **its arguments}")


def _describe(value):
    return repr(value) if not isinstance(value, bool) else ("true" if value else "false")


def check_callbacks(value, *, model_dir, tensorboard, resolve):
    """A recipe's `callbacks:` as a tuple of `{name, **arguments}` mappings, and the problems
    found: `[(path, message)]`, a path such as `("callbacks", 0, "name")`. No TensorFlow:
    Keras's classes are checked by the lists above; `resolve(import_path)` gives a user's
    class, to check its arguments (None: not imported, its form only), or raises `Bad`."""
    if value is None:
        return (), []
    if not isinstance(value, list):
        return (), [(("callbacks",), f"expected a list of callbacks, each {KINDS}. Received: "
                                     f"{_describe(value)}")]
    specs, problems = [], []
    for i, item in enumerate(value):
        path = ("callbacks", i)
        spec = {"name": item} if isinstance(item, str) else item
        if not isinstance(spec, Mapping) or not isinstance(spec.get("name"), str):
            problems.append((path, f"expected {KINDS}. Received: {_describe(item)}"))
            continue
        spec = dict(spec)
        found = _check_one(path, spec, resolve)
        found += _check_place(path, spec, model_dir=model_dir, tensorboard=tensorboard)
        problems += found
        specs.append(spec)
    return tuple(specs), problems


def _check_one(path, spec, resolve):
    name, args = spec["name"], [k for k in spec if k != "name"]
    if ":" in name:
        return _check_class(path, name, args, resolve)
    if name in REFUSED:
        return [(path + ("name",), f"{name} cannot be given in a recipe: {REFUSED[name]}")]
    if name not in KERAS:
        names = list(KERAS) + list(REFUSED)
        close = difflib.get_close_matches(name, names, n=1) or [
            n for n in KERAS if n.lower() == name.lower()]
        hint = f" Did you mean {close[0]!r}?" if close else ""
        return [(path + ("name",), f"unknown callback {name!r}.{hint} Give a keras.callbacks "
                                   f"class name ({', '.join(KERAS)}) or an import path "
                                   "'package.module:Class'")]
    return _check_arguments(path, name, args, KERAS[name], REQUIRED.get(name, ()))


def _check_class(path, name, args, resolve):
    from kerastrain._options import Bad
    try:
        cls = resolve(name)
    except Bad as e:
        return [(path + ("name",), f"expected {e.args[0]}. Received: {name!r}")]
    if cls is None:
        return []  # not imported (validate --no-import): its form only
    if not isinstance(cls, type):
        return [(path + ("name",), f"expected a callback class (a keras.callbacks.Callback "
                                   f"subclass); {name!r} is a {type(cls).__name__}")]
    try:
        params = inspect.signature(cls).parameters
    except (TypeError, ValueError):
        return []
    if any(p.kind == p.VAR_KEYWORD for p in params.values()):
        return []
    named = tuple(n for n, p in params.items() if p.kind in (p.POSITIONAL_OR_KEYWORD,
                                                               p.KEYWORD_ONLY))
    required = tuple(n for n in named if params[n].default is params[n].empty)
    return _check_arguments(path, name, args, named, required)


def _check_arguments(path, name, args, named, required):
    problems = []
    for key in args:
        if key not in named:
            close = difflib.get_close_matches(str(key), named, n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            problems.append((path + (key,), f"{name} takes no argument {key!r}.{hint} Its "
                                            f"arguments: {', '.join(named) or 'none'}"))
    missing = [n for n in required if n not in args]
    if missing:
        problems.append((path, f"{name} needs argument(s) {', '.join(missing)}: give them "
                               f"beside its name, e.g. {{name: {name}, {missing[0]}: ...}}"))
    return problems


def _check_place(path, spec, *, model_dir, tensorboard):
    """What cannot work beside the rest of the recipe: a second place for the run's state, a
    TensorBoard callback writing into the directory of kerastrain's own logs."""
    name = spec["name"]
    if name == "BackupAndRestore" and model_dir is not None:
        return [(path, "BackupAndRestore keeps a run's state in its backup_dir, and "
                       "trainer.model_dir's checkpoints already do (a rerun resumes from them): "
                       "remove the callback, or remove trainer.model_dir to keep only the "
                       f"backup. Received: trainer.model_dir={model_dir!r}")]
    if name == "TensorBoard" and model_dir is not None and tensorboard is not False:
        log_dir = spec.get("log_dir", _DEFAULT_PATH[name])
        if isinstance(log_dir, str) and os.path.normpath(os.path.join(
                model_dir, log_dir)) == os.path.normpath(os.path.join(model_dir, "logs")):
            return [(path + ("log_dir",), "trainer.model_dir/logs is where kerastrain writes "
                                          "its own TensorBoard logs (tensorboard:); give the "
                                          "callback another log_dir (e.g. keras_logs), or set "
                                          f"tensorboard: false. Received: log_dir={log_dir!r}"
                                          + ("" if "log_dir" in spec else " (Keras's default)"))]
    return []


def import_paths(specs) -> dict:
    """Dotted key -> import path of each user class among `specs` (`config.import_paths`)."""
    return {f"callbacks[{i}].name": spec["name"] for i, spec in enumerate(specs)
            if ":" in spec["name"]}


# -- after TensorFlow starts ---------------------------------------------------------------

def build_callbacks(specs, trainer, resolve):
    """The recipe's callbacks, made with their arguments (paths they write placed as the
    module docstring says).

    Raises:
        ValueError: a class that is not a Keras callback, or arguments it refuses.
    """
    import keras
    made = []
    for i, spec in enumerate(specs):
        options = dict(spec)
        name = options.pop("name")
        cls = resolve(name) if ":" in name else getattr(keras.callbacks, name)
        if not (isinstance(cls, type) and issubclass(cls, keras.callbacks.Callback)):
            raise ValueError(f"callbacks[{i}].name: {name!r} is not a keras.callbacks.Callback "
                             "subclass; a recipe's callbacks must be. Received: "
                             f"{getattr(cls, '__name__', cls)!r}")
        if name == "CSVLogger" and trainer.model_dir is not None:
            options.setdefault("append", True)  # a rerun resumes: keep the earlier epochs' rows
        argument = WRITES.get(name)
        if argument and (argument in options or name in _DEFAULT_PATH):
            options[argument] = _place(options.get(argument, _DEFAULT_PATH.get(name)), trainer)
        try:
            made.append(cls(**options))
        except (TypeError, ValueError) as e:
            raise ValueError(f"callbacks[{i}]: {name} refused its arguments: {e}. Received: "
                             f"{dict(spec)}") from None
    return made


def _place(path, trainer):
    """Where a path a callback writes goes: the chief rule's (`outputs.Outputs.place`: on the
    chief, a relative one under model_dir; on other tasks, into this process's scratch
    directory), for the trainer's model_dir and task."""
    from kerastrain.io import outputs
    return outputs.Outputs(trainer.model_dir, trainer.is_chief).place(path)


# -- data.validation_split ----------------------------------------------------------------

def check_split_applies(data, train):
    """`data.validation_split` takes NumPy data only, as model.fit's `validation_split`.

    Raises:
        ValueError: the training builder returned data of another form.
    """
    if data.validation_split is None:
        return
    from kerastrain.data import inputs as data_lib
    form = data_lib.input_form(train)
    if form != "numpy":
        raise ValueError(
            "data.validation_split holds out the last fraction of NumPy arrays (x, y), as "
            f"model.fit's validation_split does, but {data.train.builder} returned "
            f"{_FORMS.get(form, form)}, which makes its own batches. Give a data.validation "
            "builder instead, or have the builder return arrays. Received: "
            f"data.validation_split={data.validation_split}")


_FORMS = {"dataset": "a tf.data.Dataset", "context_fn": "a dataset_fn(ctx)",
          "global_fn": "a function returning a dataset", "python": "a generator or PyDataset"}

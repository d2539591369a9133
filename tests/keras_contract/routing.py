"""Keras's own trainer tests, run through kerastrain: the routing plugin.

The installed keras wheel ships `keras/src/trainers/trainer_test.py`, Keras's contract for
`fit`, `evaluate` and `predict`. `load_keras_tests(strategy)` loads that file as it is, with
two changes only, both made here and nowhere in the file's text:

- its models mix Keras's TensorFlow `Trainer` into a layer (`class ExampleModel(Trainer,
  layers.Dense)`); kerastrain trains `keras.Model`s, so `Trainer` is made a `keras.Model`
  subclass whose `__init__` does what the mixin's did, and which leaves the layer's own
  `call` (and `from_config`, `build_from_config`, `quantize`) in front of `Model`'s;
- `keras.Model.fit` / `evaluate` / `predict` go to one `kerastrain.Trainer(model,
  strategy=...)` per model object, made at its first call, with the arguments the test gave.

Everything else (the tests' assertions, their callbacks, their data) is Keras's.
"""

from __future__ import annotations

import ast
import contextlib
import importlib.util
import inspect
import os
import sys
import threading
import types
import weakref

import keras
from keras.src.backend.tensorflow.trainer import TensorFlowTrainer

import kerastrain

KERAS_TESTS = os.path.join(os.path.dirname(keras.__file__), "src", "trainers", "trainer_test.py")
_ORIGINAL = {name: getattr(keras.Model, name) for name in ("fit", "evaluate", "predict")}
# Names `keras.Model` defines that a mixed-in layer defines too: under the mixin the layer's
# came first (the mixin defines none of them), so they are put back in front.
_LAYER_FIRST = ("call", "build_from_config", "from_config", "quantize")


class ModelTrainer(keras.Model):
    """Stands in for the tests' `Trainer` mixin: a `keras.Model`, initialised as the mixin
    was (`Trainer.__init__(self)` after the layer's own `__init__`)."""

    def __init__(self, *args, **kwargs):
        TensorFlowTrainer.__init__(self)

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        model_side = set(keras.Model.__mro__) | {ModelTrainer}
        for name in _LAYER_FIRST:
            if name in vars(cls):
                continue
            for klass in cls.__mro__[1:]:
                if klass in model_side or name not in vars(klass):
                    continue
                setattr(cls, name, vars(klass)[name])
                break


class Router:
    """One `kerastrain.Trainer` per model object; `fit`, `evaluate` and `predict` of a
    `keras.Model` go to it while `routing()` is active."""

    def __init__(self, strategy):
        self.strategy = strategy
        self._trainers = {}  # id(model) -> (weakref to the model, its Trainer)
        self._inside = threading.local()

    def trainer(self, model):
        ref, trainer = self._trainers.get(id(model), (None, None))
        if ref is None or ref() is not model:
            trainer = kerastrain.Trainer(model, strategy=self.strategy, checkpoint=False,
                                         tensorboard=False)
            self._trainers[id(model)] = (weakref.ref(model), trainer)
        return trainer

    def close(self):
        for _, trainer in self._trainers.values():
            trainer.close()
        self._trainers.clear()

    def _route(self, name):
        original = _ORIGINAL[name]
        signature = inspect.signature(original)
        router = self

        def routed(model, *args, **kwargs):
            if getattr(router._inside, "active", False):  # kerastrain's own use of Keras
                return original(model, *args, **kwargs)
            given = signature.bind(model, *args, **kwargs).arguments
            given.pop("self")
            given.update(given.pop("kwargs", {}))
            if name == "evaluate":  # Keras's defaults where kerastrain's differ
                given.setdefault("return_dict", False)
            given.setdefault("verbose", "auto")
            router._inside.active = True
            try:
                return getattr(router.trainer(model), name)(**given)
            finally:
                router._inside.active = False

        routed.__name__ = name
        return routed

    @contextlib.contextmanager
    def routing(self):
        for name in _ORIGINAL:
            setattr(keras.Model, name, self._route(name))
        try:
            yield self
        finally:
            for name, original in _ORIGINAL.items():
                setattr(keras.Model, name, original)
            self.close()


def _jax_stub():
    """The file imports jax at its top for its JAX-only tests, skipped on TensorFlow."""
    if "jax" not in sys.modules and importlib.util.find_spec("jax") is None:
        sys.modules["jax"] = types.ModuleType("jax")


def load_keras_tests(module_name):
    """Keras's trainer tests as a module whose `Trainer` is `ModelTrainer`."""
    _jax_stub()
    with open(KERAS_TESTS) as f:
        source = f.read()
    module = types.ModuleType(module_name)
    module.__file__ = KERAS_TESTS
    sys.modules[module_name] = module
    # The file imports TensorFlowTrainer as `Trainer`: run its imports, rebind the name,
    # then run the rest (its classes and tests).
    tree = ast.parse(source, KERAS_TESTS)
    first_class = next(i for i, node in enumerate(tree.body) if isinstance(node, ast.ClassDef))
    head = ast.Module(body=tree.body[:first_class], type_ignores=[])
    rest = ast.Module(body=tree.body[first_class:], type_ignores=[])
    exec(compile(head, KERAS_TESTS, "exec"), module.__dict__)
    module.Trainer = ModelTrainer
    exec(compile(rest, KERAS_TESTS, "exec"), module.__dict__)
    return module

"""Models kerastrain refuses, each with why and what to do: not compiled (to fit or
evaluate), `run_eagerly` where steps cannot run eagerly, stateful RNNs under replicas."""

from __future__ import annotations

from kerastrain import _compat


def check_compiled(model, *, training):
    """`fit` and `evaluate` need a compiled model, as Keras's do; `fit` an optimizer too.

    Compiled without a loss is fine where the model adds its own (an "endpoint" layer's
    `add_loss`, as on keras.io); without any, Keras's compute_loss says "No loss to compute".
    A model with its own train_step may keep its optimizers itself (a GAN's two).

    Raises:
        ValueError: the model is not compiled, or (to train) has no optimizer.
    """
    from kerastrain.step import loops
    compiled = getattr(model, "compiled", False)
    if compiled and not (training and getattr(model, "optimizer", None) is None
                         and not loops.overrides(model, "train_step")):
        return
    raise ValueError(
        f"The model is not compiled, so kerastrain does not know what to "
        f"{'minimise' if training else 'evaluate'}. Call `model.compile(optimizer=..., "
        "loss=...)` (in your model function, or on the model before this call), or pass "
        "`Trainer(..., optimizer='adam', loss='mse')`; `predict` needs no compile. Received: "
        f"model {model.name!r} with compiled={compiled}, optimizer="
        f"{getattr(model, 'optimizer', None)!r}")


def check_stateful(instance, built, policy):
    """A stateful RNN keeps one state per row of a fixed batch, carried from batch to batch.
    Split over replicas, each replica's share has other rows than the state (TensorFlow
    fails deep in the step, as Keras's `fit` does under the same strategy); the kind of
    strategy may refuse it on one replica too (`policy.stateful_refused`: under parameter
    servers workers train batches in no set order on one state, and the user's object could
    not hold it afterwards, made before the cluster connected)."""
    replicas = built.strategy.num_replicas_in_sync
    stateful = [layer.name for layer in _compat.all_layers(instance)
                if getattr(layer, "stateful", False)]
    if stateful and (replicas > 1 or policy.stateful_refused):
        why = (f"each of the {replicas} replicas trains a share of the batch, which does not "
               "match them") if replicas > 1 else policy.stateful_refused
        raise ValueError(
            f"The model {instance.name!r} has stateful recurrent layers ({', '.join(stateful)}), "
            f"whose states hold one row per example of a fixed batch, carried from batch to "
            f"batch; under {built.name!r} {why}. Train it on one device "
            f"(strategy='one_device'), or make the layers stateless. Received: stateful "
            f"layers under strategy={built.name!r}")


def check_eager(instance, built, policy):
    """`run_eagerly=True` (Keras's debugging mode) runs every step eagerly on this task's
    replicas; where steps are functions TensorFlow runs elsewhere, it cannot (the kind of
    strategy says why: `policy.eager_refused`)."""
    why = policy.eager_refused
    if not getattr(instance, "run_eagerly", False) or why is None:
        return
    raise ValueError(
        f"The model is compiled with `run_eagerly=True` (Keras's debugging mode), which the "
        f"{built.name!r} strategy cannot honour: {why}. Debug the model eagerly under the "
        "'one_device' or 'mirrored' strategy, then compile it without `run_eagerly` for "
        f"{built.name!r}. Received: run_eagerly=True for model {instance.name!r} under "
        f"strategy={built.name!r}")

"""Mixed precision: the Keras dtype policy the model is built under, and loss scaling.

`mixed_precision="mixed_float16"` or `"mixed_bfloat16"` builds the model's layers
to compute in 16 bits with float32 variables. float16's narrow range needs loss
scaling: Keras's `compile` wraps the optimizer of a mixed_float16 model in a
`LossScaleOptimizer`, and kerastrain's step (`kerastrain.step.replica`) multiplies the
objective by `optimizer.scale_loss`, so the optimizer's `apply` divides the
gradients by the scale, skips the update when any is not finite and lowers the
scale. bfloat16 has float32's range and needs none.
"""

from __future__ import annotations

import contextlib
import logging

import keras

logger = logging.getLogger("kerastrain")


@contextlib.contextmanager
def policy(mixed_precision, model):
    """Build the model under the Keras dtype policy `mixed_precision` (None: as it is).

    The global policy is set only while the model is built, then put back, so
    models the program builds later are not changed behind its back.
    """
    if mixed_precision is None:
        yield
        return
    if isinstance(model, keras.Model):
        if model.dtype_policy.name != mixed_precision:
            raise ValueError(
                f"`mixed_precision={mixed_precision!r}` sets the dtype policy the model is "
                "built under, but the model was given already built, with policy "
                f"{model.dtype_policy.name!r}. Pass a function that builds and compiles the "
                f"model (`Trainer(build_model, ..., mixed_precision={mixed_precision!r})`). "
                f"Received: model={model.name!r}")
        yield
        return
    with global_policy(mixed_precision):
        yield


def ensure_loss_scaling(model, mixed_precision):
    """A mixed_float16 model's optimizer scales the loss (Keras's compile does it; checked)."""
    if mixed_precision is None:
        return
    optimizer = model.optimizer
    scaled = isinstance(optimizer, keras.optimizers.LossScaleOptimizer)
    if mixed_precision == "mixed_float16" and not scaled:
        raise ValueError(
            "A mixed_float16 model needs loss scaling, and its optimizer "
            f"{type(optimizer).__name__} is not a keras.optimizers.LossScaleOptimizer. Compile "
            "with `auto_scale_loss=True` (Keras's default) or wrap the optimizer yourself. "
            f"Received: optimizer={optimizer!r}")
    logger.info("mixed precision: %s (layers compute in %s, variables float32)%s",
                mixed_precision, model.dtype_policy.compute_dtype,
                "; dynamic loss scaling" if scaled else "")


@contextlib.contextmanager
def global_policy(policy):
    """While active, Keras's global dtype policy is `policy` (a model copied under its own)."""
    previous = keras.mixed_precision.dtype_policy()
    keras.mixed_precision.set_dtype_policy(policy)
    try:
        yield
    finally:
        keras.mixed_precision.set_dtype_policy(previous)

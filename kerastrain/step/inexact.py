"""What a step over several replicas cannot make exact, said once when it is traced.

kerastrain weighs each replica's loss by its share of the global batch's examples, which makes
the summed gradient the one-device gradient for every loss Keras averages over examples. A loss
that divides by something else per replica (its unmasked entries, its sample weights) is not
averaged over examples; Keras fit under the same strategy weighs replicas alike, so kerastrain
trains it as Keras does there, and says so.
"""

from __future__ import annotations

import logging

import tensorflow as tf

from kerastrain import _compat

logger = logging.getLogger("kerastrain")


def say_losses(model, y_pred, replicas, weighted=False):
    """One line when the loss averages over unmasked entries only (a Keras mask on an
    output, as `Embedding(mask_zero=True)` gives sequence outputs, or a loss's
    `ignore_class`): each replica then averages over its own share's unmasked entries,
    and its weight is its share of the batch's examples, not of the unmasked entries,
    so the step differs slightly from one device's (Keras fit weights replicas alike). The
    same for a loss divided by the batch's sample weights (`weighted`: the batch has them)."""
    masked = [i for i, t in enumerate(tf.nest.flatten(y_pred))
              if _compat.keras_mask(t) is not None]
    ignoring = [loss for loss in tf.nest.flatten(getattr(model, "loss", None))
                if getattr(loss, "ignore_class", None) is not None]
    if masked or ignoring:
        what = "a Keras mask on output(s) %s" % masked if masked else "`ignore_class`"
        logger.info(
            "the loss averages over unmasked entries only (%s): under %d replicas each "
            "averages over its own share's, weighted by its share of the examples, so losses "
            "and updates differ slightly from one device's (as under Keras fit with this "
            "strategy); one device trains it exactly", what, replicas)
    if weighted and any(getattr(loss, "reduction", None) == "mean_with_sample_weight"
                        for loss in tf.nest.flatten(getattr(model, "loss", None))):
        logger.info(
            "the loss divides by the batch's sum of sample weights "
            "(reduction='mean_with_sample_weight'): under %d replicas each divides by its own "
            "share's, weighted by its share of the examples, so losses and updates differ "
            "slightly from one device's (as under Keras fit with this strategy); the default "
            "reduction ('sum_over_batch_size') or one device trains exactly", replicas)

"""The only package that touches private Keras/TensorFlow APIs.

Checked against TensorFlow 2.16-2.21 and Keras 3.10-3.15 (tools/check_versions.sh runs
the smoke subset on the lowest; Keras 3.9 and older scale losses differently under
tf.distribute, so they are refused at import). Each helper says why
the private name is needed; when Keras grows a public equivalent, switch here.

Its modules group the helpers by what they adapt (Keras's models and optimizers, tf.data,
tf.distribute and the eager context, checkpoints); the rest of kerastrain calls each one
as `_compat.<name>`, through the names imported here.
"""

from __future__ import annotations

import keras

LOWEST_KERAS = (3, 10)


def _check_keras_version(version):
    """Refuse a Keras older than kerastrain's tested lowest, whatever pip was told.

    Before Keras 3.10 a `Loss` called in a replica context did not divide by the
    number of replicas in the same way, so under mirrored the objective would be
    silently wrong.
    """
    parts = []
    for piece in version.split(".")[:2]:
        digits = "".join(c for c in piece if c.isdigit())
        parts.append(int(digits or 0))
    if tuple(parts) < LOWEST_KERAS:
        raise ImportError(
            f"kerastrain needs Keras >= {'.'.join(map(str, LOWEST_KERAS))}: older Keras 3 "
            f"releases scale losses differently under tf.distribute, so training would be "
            f"silently different. Received: keras {version}. Upgrade with "
            f"`pip install -U 'keras>={'.'.join(map(str, LOWEST_KERAS))}'`.")


_check_keras_version(keras.__version__)

# The helpers, imported once Keras is known to be recent enough; callers use them as
# `_compat.<name>`.
from kerastrain._compat.models import (
    compile_metrics, compile_loss, layer_metrics, symbolic_build, eager_build, zeros_batch,
    compile_args, stateless_scope,
    model_losses, compute_loss, flatten_metrics_in_order, model_supports_jit, keras_mask,
    all_layers, sublayers_built, variable_owners, lookup_layers, lookup_contents,
    set_lookup_contents, renew_adapt_state, table_job, compile_token)
from kerastrain._compat.optimizers import (
    rekey_optimizer, share_optimizer_state, optimizer_strategy_scope, optimizer_slot,
    iteration_counter, gradient_accumulators, learning_rate_schedule, learning_rate_at,
    moving_averages, clips_gradients, clip_as_optimizer, clipping_off, RowSparseWeightDecay,
    unique_rows, decays_weights)
from kerastrain._compat.data import (
    class_weight_to_sample_weights, class_weight_map_fn, auto_shard, service_distribute,
    service_from_dataset_id, service_worker_port, serialize_dataset, deserialize_dataset,
    slices_then_batch, is_py_dataset, python_batches_dataset, arrays_dataset,
    is_sparse_or_ragged)
from kerastrain._compat.distribute import (
    skip_function_removal_at_exit, keep_local_functions_local, wait_at_barrier,
    stop_preemption_handler, per_worker_iterator, partitioned_like, set_variable_partitioner,
    sharded_variable_class, replace_storage, atomic_adds, quiet_retracing,
    without_deprecation_notes)
from kerastrain._compat.checkpoints import (
    not_copied_by_async_save, keras_variables_copy_for_async_save, take_async_save_error,
    TracedCheckpointWrite, checkpoint_whole)
from kerastrain._compat.overrides import instance_override
from kerastrain._compat.callbacks import hook_is_default, tensorboard_profiles

"""What Keras's trainer tests say of kerastrain, test by test (see conftest.py)."""

# Fail under plain Keras on this install (so they say nothing of kerastrain): the JAX, PyTorch and
# Grain inputs need libraries that are neither Keras's nor kerastrain's dependencies, and
# test_loss_scaling_prevents_underflow sets `self.layers`, which a `keras.Model` reserves.
PLAIN_FAILS = {
    "test_predict_sparse_jax_eager",
    "test_predict_sparse_jax_graph",
    "test_evaluate_sparse_jax_eager",
    "test_evaluate_sparse_jax_graph",
    "test_fit_sparse_jax_eager",
    "test_fit_sparse_jax_graph",
    "test_fit_with_data_adapter_grain_dataloader",
    "test_fit_with_data_adapter_grain_dataset",
    "test_fit_with_data_adapter_grain_dataset_with_len",
    "test_fit_with_data_adapter_torch_dataloader_iterable",
    "test_fit_with_data_adapter_torch_dataloader_iterable_with_len",
    "test_fit_with_data_adapter_torch_dataloader_tensor",
    "test_loss_scaling_prevents_underflow",
}

# Where kerastrain deliberately differs from Keras's `fit` on one device (docs/keras_compatibility.md).
_NOT_CLONABLE = (
    "a model instance Keras cannot clone into the strategy's scope (a subclassed model) is "
    "refused under mirrored with an error asking for a builder function; one device trains it "
    "as it is")
_LOSS_PER_REPLICA = (
    "a Keras Loss called in a replica context divides by the replicas, so a compute_loss "
    "override that logs its loss logs half of it under 2 replicas: Keras fit under the same "
    "MirroredStrategy logs the same")
_OWN_OPTIMIZER = (
    "the test patches the model's optimizer object; under mirrored kerastrain trains a copy "
    "made in the strategy's scope, with its own optimizer (the user's gets its state after fit)")

DIFFERS = {
    "one_device": {},
    "mirrored": {
        "test_callbacks_can_update_state_at_batch_boundary": _NOT_CLONABLE,
        "test_nested_inputs": _NOT_CLONABLE,
        "test_rng_updated_during_predict": _NOT_CLONABLE,
        "test_compute_loss_no_training_backwards_compatibility": _LOSS_PER_REPLICA,
        "test_evaluate_with_custom_compute_loss": _LOSS_PER_REPLICA,
        "test_metric_update_in_compute_loss": _LOSS_PER_REPLICA,
        "test_fit_sparse_scipy_eager": _OWN_OPTIMIZER,
        "test_fit_sparse_scipy_graph": _OWN_OPTIMIZER,
        "test_fit_sparse_tf_eager": _OWN_OPTIMIZER,
        "test_fit_sparse_tf_graph": _OWN_OPTIMIZER,
        "test_retracing": (
            "MirroredStrategy traces the step once per replica (4 traces counted for 2 "
            "replicas); Keras fit under the same strategy fails on this input (batches of 1 "
            "over 2 replicas: AddN shapes [1,4] and [0,4])"),
    },
}

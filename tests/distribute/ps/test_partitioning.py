"""Partitioned variables (issue 8): an Embedding(100_000, 32) split over 2 ps tasks."""

import json

import pytest

import helpers
import kerastrain as kt
from kerastrain.cli import config
from kerastrain.distribute.ps import partitioning

PS_JOB = "/job:ps/replica:0/task:{}/device:CPU:0"


@pytest.fixture(scope="module")
def result(tmp_path_factory):
    out = tmp_path_factory.mktemp("partitioned")
    proc = helpers.run_python(["tests/_partition_worker.py", str(out)])
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return json.loads((out / "result.json").read_text()) | {"log": proc.stderr}


@pytest.mark.multiprocess
def test_table_is_split_over_both_ps_tasks_and_training_matches_one_device(result):
    assert result["shards"] == [{"rows": 50_000, "device": PS_JOB.format(0)},
                                {"rows": 50_000, "device": PS_JOB.format(1)}]
    # Each Adam slot shard lives next to its table shard.
    assert result["slot_devices"] == [PS_JOB.format(0), PS_JOB.format(1)]
    assert result["loss_after"] < 0.5 * result["loss_before"], result
    # Every weight and optimizer slot after 12 steps, against one device.
    assert result["vs_one_device"] <= 1e-5
    assert ("partitioned variables: sequential/table/embeddings (100000, 32) in 2 shards "
            "(50000+50000 rows) on ps:0, ps:1") in result["log"]
    assert "variables split by min_size(min_shard_bytes=262144, max_shards=2)" in result["log"]
    assert "asynchronously" not in result["log"]   # one worker: steps in order


@pytest.mark.multiprocess
def test_checkpoint_restores_into_other_splits_and_one_device(result):
    restored = result["restored"]
    assert {name: r["shards"] for name, r in restored.items()} == {
        "3 shards": 3, "1 shard": 1, "one device": 1}
    for name, r in restored.items():
        assert r["diff"] == 0.0, (name, r)  # weights and optimizer slots, identical
        assert r["step"] == 12, (name, r)
    # Slots were resharded right: 24 more steps from 3 shards equal them from one device.
    assert result["continued_3_shards_vs_one_device"] <= 1e-5


@pytest.mark.multiprocess
def test_export_has_whole_variables_and_predicts_like_the_trained_model(result):
    assert result["export_whole"]
    assert result["export_keras_diff"] <= 1e-6
    assert result["export_serve_diff"] <= 1e-6


@pytest.mark.multiprocess
def test_layers_that_cannot_be_partitioned_are_named_with_advice(result):
    constraint = result["errors"]["constraint"]
    assert constraint.startswith("ValueError: Variable 'sequential_7/normed/embeddings' of layer "
                                 "'normed' (Embedding)"), constraint
    assert "constraint" in constraint and "min_shard_bytes=16777216" in constraint
    handle = result["errors"]["handle"]
    assert handle.startswith("TypeError: Layer 'raw' (Handle) cannot run with a partitioned "
                             "variable"), handle
    assert "/raw/raw_table' (100000, 32), 12800000 bytes, in 2 shards" in handle
    assert "no attribute 'handle'" in handle and "min_shard_bytes=16777216" in handle
    lamb = result["errors"]["lamb"]
    assert lamb.startswith("ValueError: The optimizer Lamb cannot update partitioned variables "
                           "shard by shard: its trust ratio uses the norm of the whole "
                           "variable"), lamb
    assert "`clipnorm` clips each variable's gradient by its own norm" in result["errors"][
        "clipnorm"]


@pytest.mark.multiprocess
def test_per_element_optimizers_match_one_device_shard_by_shard(result):
    assert set(result["optimizers"]) == partitioning._PER_ELEMENT_OPTIMIZERS
    for name, diff in result["optimizers"].items():
        assert diff <= 1e-6, (name, diff)


def test_partitioner_options_are_checked_without_tensorflow():
    name, options = kt.strategies.normalize(
        {"name": "ps", "variable_partitioner": {"name": "max_size", "max_shard_bytes": 1 << 20}})
    assert name == "ps" and options["variable_partitioner"]["max_shard_bytes"] == 1 << 20
    assert partitioning.check_partitioner("min_size") == {"name": "min_size"}
    bad = [
        ({"name": "even"}, "must be one of ['fixed_shards', 'max_size', 'min_size']"),
        ({"name": "min_size", "min_shard_bytes": "1MB"}, "must be an integer >= 1"),
        ({"name": "fixed_shards"}, "needs ['num_shards']"),
        ({"name": "fixed_shards", "num_shards": 2, "max_shards": 3}, "has no option 'max_shards'"),
        (3, "must be a partitioner name or a mapping"),
    ]
    for value, message in bad:
        with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
            kt.strategies.normalize({"name": "ps", "variable_partitioner": value})
    with pytest.raises(ValueError, match="variable_partitioner"):
        kt.strategies.normalize({"name": "mirrored", "variable_partitioner": "min_size"})


def test_recipe_reports_a_bad_partitioner_with_its_line(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text(
        f"include: {helpers.REPO}/recipes/quickstart.yaml\n"
        "strategy:\n"
        "  name: ps\n"
        "  variable_partitioner: {name: min_size, min_shard_bytes: -1}\n")
    with pytest.raises(config.RecipeError) as info:
        from kerastrain.cli import recipes
        recipes.load(str(recipe))
    assert "min_shard_bytes` must be an integer >= 1. Received: -1" in str(info.value)

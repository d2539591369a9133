"""The README's commands stay true: CI runs exactly the README's test command."""

import os
import re

import numpy as np
import pytest
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def readme_commands():
    return re.findall(r"```bash\n(.+?)\n```", (ROOT / "README.md").read_text())


def test_readme_opens_with_the_main_job_and_the_test_command():
    main, test = readme_commands()[:2]
    assert main.endswith("kerastrain run recipes/quickstart.yaml")
    assert main.startswith("python3 -m venv .venv")
    assert "pytest" in test and test.startswith("python3 -m venv .venv")


def test_ci_runs_exactly_the_readme_test_command():
    test = readme_commands()[1]
    ci_lines = [line for line in (ROOT / ".ci" / "run").read_text().splitlines()
                if line and not line.startswith("#")]
    assert test in ci_lines


def test_the_readme_main_command_says_only_true_things_on_a_new_model_dir(tmp_path):
    """The README's first command's recipe, as a new user runs it (no TF_CPP_MIN_LOG_LEVEL).
    It is also quickstart.yaml's run in test_recipes.py's every-shipped-recipe test: the
    summary and the resolved recipe beside the checkpoints are checked here."""
    import subprocess
    import sys

    import yaml

    import helpers
    env = helpers.child_env()
    env.pop("TF_CPP_MIN_LOG_LEVEL", None)
    command = [sys.executable, "-m", "kerastrain.cli", "run", "recipes/quickstart.yaml", "--set",
               f"trainer.model_dir={tmp_path / 'run'}"]
    first = subprocess.run(command, env=env, cwd=helpers.REPO, capture_output=True, text=True,
                           timeout=300)
    assert first.returncode == 0, first.stderr[-3000:]
    lines = (first.stdout + first.stderr).splitlines()
    assert not [line for line in lines if re.match(r"[EWIF]\d{4} ", line)], lines[:20]
    assert not [line for line in lines if "warning" in line.lower()], lines
    twice = {line for line in lines if lines.count(line) > 1}
    assert not twice, twice
    log = first.stderr.splitlines()
    assert log[0].startswith("kerastrain: devices: the CPU"), log[:3]
    assert len([line for line in log if line.startswith("kerastrain: tuning:")]) == 1
    assert "Epoch 3/3" in lines and "kerastrain: done: 3 epochs, step 768" in first.stdout
    summary = [line for line in first.stdout.splitlines() if line.startswith("kerastrain: done:")]
    assert summary and "loss" in summary[0], first.stdout[-2000:]
    # The resolved recipe, with the override, is next to the checkpoints.
    resolved = yaml.safe_load((tmp_path / "run" / "recipe.yaml").read_text())
    assert resolved["trainer"]["model_dir"] == str(tmp_path / "run")
    assert resolved["trainer"]["epochs"] == 3
    assert os.path.isdir(tmp_path / "run" / "checkpoints")
    # The same command again: it says truly where the run stopped, and that nothing is left.
    again = subprocess.run(command, env=env, cwd=helpers.REPO, capture_output=True, text=True,
                           timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "step 768, after epoch 3 of 3" in again.stderr, again.stderr
    assert "nothing left to train" in again.stdout + again.stderr
    assert "tuning:" not in again.stderr and "epoch 4" not in again.stderr


def test_cli_reports_a_bad_strategy_with_exit_code_2():
    import helpers
    proc = helpers.run_python(["-m", "kerastrain.cli", "quickstart", "--strategy", "mirorred"])
    assert proc.returncode == 2
    assert "Did you mean 'mirrored'?" in proc.stderr and "Traceback" not in proc.stderr


def test_cli_info_shows_the_auto_choice():
    import helpers
    proc = helpers.run_python(["-m", "kerastrain.cli", "info"])
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "TF_CONFIG: none" in proc.stdout
    assert "auto strategy: default (auto: no GPU and no cluster, training on the CPU)" in proc.stdout


def test_cli_quickstart_trains_for_real_keeps_its_outputs_and_a_rerun_trains_nothing(tmp_path):
    import glob

    import helpers
    command = ["-m", "kerastrain.cli", "quickstart", "--examples", "2048", "--epochs", "2",
               "--verbose", "2", "--model-dir", str(tmp_path)]
    proc = helpers.run_python(command)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = proc.stdout.strip().splitlines()[-1]
    assert summary.startswith("kerastrain: trained to step 16") and '"accuracy"' in summary
    assert '"val_loss"' in summary
    assert proc.stdout.count("8/8") == 2  # one progress line per epoch on a pipe
    assert f"outputs in {tmp_path}" in proc.stdout
    assert glob.glob(str(tmp_path / "logs/train/events.out.tfevents.*"))
    assert glob.glob(str(tmp_path / "logs/validation/events.out.tfevents.*"))
    assert os.path.exists(tmp_path / "export" / "saved_model" / "saved_model.pb")
    # The same command again: the run is complete, nothing is trained or lost.
    again = helpers.run_python(command)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "nothing left to train" in again.stdout and "already holds 16 steps" in again.stdout


def test_example_validation_data_is_the_same_task_on_new_examples():
    from kerastrain import examples
    x0, y0 = examples.synthetic_binary(4096, 8, seed=0)
    x1, y1 = examples.synthetic_binary(4096, 8, seed=1)
    assert not np.allclose(x0[:10], x1[:10])
    # The least-squares direction fitted on one set classifies the other well.
    w, *_ = np.linalg.lstsq(x0, y0[:, 0] - 0.5, rcond=None)
    assert ((x1 @ w > 0) == (y1[:, 0] > 0.5)).mean() > 0.9


def test_a_keras_older_than_the_tested_lowest_is_refused_at_import():
    from kerastrain import _compat
    with pytest.raises(ImportError, match=r"Keras >= 3.10.*Received: keras 3.9.2.*pip install"):
        _compat._check_keras_version("3.9.2")
    _compat._check_keras_version("3.10.0")
    _compat._check_keras_version("3.15.1.dev2025")
    # pyproject promises no lower than what is checked at import and by tools/check_versions.sh.
    text = (ROOT / "pyproject.toml").read_text()
    assert '"keras>=3.10,<4"' in text and "check_versions.sh 2.16.2 3.10.0" in text
    assert (ROOT / "tools" / "check_versions.sh").stat().st_mode & 0o111

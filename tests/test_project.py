"""The README's commands stay true: CI runs exactly the README's test command."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def readme_commands():
    return re.findall(r"```bash\n(.+?)\n```", (ROOT / "README.md").read_text())


def test_readme_opens_with_the_main_job_and_the_test_command():
    main, test = readme_commands()[:2]
    assert "kerastrain quickstart" in main and main.startswith("python3 -m venv .venv")
    assert "pytest" in test and test.startswith("python3 -m venv .venv")


def test_ci_runs_exactly_the_readme_test_command():
    test = readme_commands()[1]
    ci_lines = [line for line in (ROOT / ".ci" / "run").read_text().splitlines()
                if line and not line.startswith("#")]
    assert test in ci_lines


def test_cli_quickstart_trains_for_real(tmp_path):
    import helpers
    proc = helpers.run_python(["-m", "kerastrain.cli", "quickstart", "--examples", "2048",
                               "--epochs", "2", "--verbose", "2"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = proc.stdout.strip().splitlines()[-1]
    assert summary.startswith("kerastrain: trained 16 steps") and '"accuracy"' in summary
    assert proc.stdout.count("8/8") == 2  # one progress line per epoch on a pipe


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

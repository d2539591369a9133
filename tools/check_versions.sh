#!/usr/bin/env bash
# Build a virtual environment with given TensorFlow and Keras versions and run the smoke subset
# that backs the range promised in pyproject.toml: one_device vs model.fit, mirrored and
# multi-worker mirrored parity, a parameter-server run, Keras fidelity (model losses, overrides,
# instances under every strategy, partial batches) and checkpoint round trips.
#
#   tools/check_versions.sh 2.16.2 3.10.0          # the lowest versions pyproject.toml allows
#   tools/check_versions.sh 2.21.0 3.15.1 /tmp/v   # venv directory (default /tmp/kerastrain-TF-KERAS)
#   tools/check_versions.sh 2.21.0 nightly         # keras-nightly: a Keras release that breaks
#                                                  # kerastrain is known before users meet it
set -euo pipefail
tf="${1:?usage: tools/check_versions.sh TF_VERSION KERAS_VERSION [VENV_DIR]}"
keras="${2:?usage: tools/check_versions.sh TF_VERSION KERAS_VERSION [VENV_DIR]}"
venv="${3:-/tmp/kerastrain-$tf-$keras}"
cd "$(dirname "$0")/.."
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
if [ "$keras" = nightly ]; then
    # keras-nightly installs the same `keras` package; the released one must go first.
    "$venv/bin/pip" install -q "tensorflow==$tf" tensorboard pytest scikit-learn pyyaml
    "$venv/bin/pip" uninstall -q -y keras
    "$venv/bin/pip" install -q --pre --upgrade keras-nightly
else
    "$venv/bin/pip" install -q "tensorflow==$tf" "keras==$keras" tensorboard pytest scikit-learn \
        pyyaml  # kerastrain's own dependencies: it is installed with --no-deps below
fi
"$venv/bin/pip" install -q --no-deps -e .
"$venv/bin/python" -c "import tensorflow as tf, keras; print('TensorFlow', tf.__version__, '/ Keras', keras.__version__)"
"$venv/bin/python" -m pytest -q -p no:cacheprovider \
    tests/distribute/test_parity.py \
    tests/distribute/ps/test_parameter_servers.py::test_ps_without_cluster_starts_local_in_process_cluster \
    tests/test_keras_fidelity.py tests/io/test_checkpoints.py

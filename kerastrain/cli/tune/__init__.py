"""Sweeps: `kerastrain tune RECIPE --space SPACE.yaml`, trials that are real kerastrain runs.

`space` reads and checks a search space (no TensorFlow, no Optuna), `study` is the one module
that talks to Optuna, `trials` starts and watches one trial's `kerastrain run` process,
`report` is the callback inside a trial, `records` writes what users compare (TensorBoard's
HParams table, best.yaml, the table of the best trials) and `sweep` runs the whole (docs/sweeps.md).
"""

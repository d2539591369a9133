"""Sweeps: `kerastrain tune RECIPE --space SPACE.yaml`, trials that are real kerastrain runs.

`space` reads and checks a search space (no TensorFlow, no Optuna), `study` is the one module
that talks to Optuna, `trials` starts and watches one trial's `kerastrain run` process, `loop`
keeps `parallel` of them running and answers their epochs, `report` is the callback inside a
trial, `records` writes what users compare (TensorBoard's HParams table, best.yaml, the table of
the best trials) and `sweep` is the whole, `kerastrain.Sweep` (docs/sweeps.md).
"""

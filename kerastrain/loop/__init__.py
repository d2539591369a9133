"""The outer loop: one mode per kind of strategy, epochs driven on this task or on ps workers,
actions, callbacks, faults."""

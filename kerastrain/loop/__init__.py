"""The outer loop: epochs driven on this task or on ps workers, cadence, actions, callbacks, faults."""

"""What a run writes, when, and who keeps it: outputs (the chief rule), cadence, checkpoints,
monitor and summaries, files, locks."""

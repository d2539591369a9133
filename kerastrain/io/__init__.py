"""What a run writes and who keeps it: outputs (the chief rule), checkpoints, summaries, files, locks."""

"""Parameter servers only: exact visits of scheduled loops, partitioned tables (the step's side
of parameter servers is `kerastrain.step.ps`)."""

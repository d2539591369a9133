"""Parameter servers only, the step side: the step whose loops a coordinator schedules on
workers (`steps`) and the model's variables placed on the servers (`placement`)."""

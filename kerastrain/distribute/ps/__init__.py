"""Parameter servers only: exact visits of scheduled loops, partitioned tables, a model's own step on workers."""

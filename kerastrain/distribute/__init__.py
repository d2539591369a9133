"""Strategies built by name, the clusters and network they run over, the model placed in their scope."""

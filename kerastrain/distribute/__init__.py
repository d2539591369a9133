"""Strategies built by name, the devices they use, the clusters and network they run over."""

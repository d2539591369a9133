"""The `kerastrain` command line: recipes and their schema, launch, manifests, the evaluator task."""

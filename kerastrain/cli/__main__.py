"""`python -m kerastrain.cli`: the `kerastrain` command."""

from kerastrain.cli.command import main

raise SystemExit(main())

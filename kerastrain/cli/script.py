"""`python -m kerastrain.cli.script SCRIPT`: a user's Python script as a task of `kerastrain launch`.

`kerastrain launch train.py --workers 2` runs the script on each training task with its own
`TF_CONFIG`, as `kerastrain launch RECIPE` runs a recipe: the script's `Trainer` reads the
cluster from it. Under parameter servers only the chief runs the script (it is the
coordinator); workers and ps tasks serve (`--serve`, `kerastrain.distribute.cluster.serve`).
Either way the task ends with the launcher, however the launcher ends.
"""

from __future__ import annotations

import os
import runpy
import sys

USAGE = ("usage: python -m kerastrain.cli.script SCRIPT | --serve   (started by `kerastrain "
         "launch SCRIPT.py`)")


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if len(argv) != 1:
        print(USAGE, file=sys.stderr)
        return 2
    from kerastrain._lifetime import die_with_launcher
    die_with_launcher()
    if argv[0] == "--serve":
        from kerastrain.distribute import cluster
        return cluster.main()
    script = os.path.abspath(argv[0])
    sys.argv = [script]
    sys.path.insert(0, os.path.dirname(script))   # as `python SCRIPT` does
    runpy.run_path(script, run_name="__main__")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

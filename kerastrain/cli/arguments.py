"""The `kerastrain` command line's arguments: each subcommand's flags, help and examples."""

from __future__ import annotations

import argparse

EXAMPLES = """examples:
  kerastrain run recipes/quickstart.yaml         # train as a recipe says
  kerastrain run recipes/digits.yaml --set trainer.epochs=10 --set data.batch_size=32
  kerastrain validate recipes/mirrored.yaml      # check it, print the resolved recipe
  kerastrain run --print-config > my.yaml        # every key with its default, to start from
  kerastrain quickstart                          # auto strategy on this machine
  kerastrain quickstart --strategy mirrored --cpu-devices 2
  kerastrain quickstart --strategy ps --epochs 2 --steps-per-epoch 50
  kerastrain quickstart --model-dir runs/quick   # checkpoints, export; tensorboard --logdir runs/quick/logs
  kerastrain tune recipes/quickstart.yaml --space recipes/quickstart.space.yaml   # a sweep
  kerastrain info                                # what "auto" would choose here
  kerastrain bench --quick                       # the speed table on this machine (~3 min)
"""


# Each command's --help shows examples of that command.
COMMAND_EXAMPLES = {
    "run": """
  kerastrain run recipes/quickstart.yaml
  kerastrain run recipes/quickstart.yaml --set trainer.epochs=1 --set trainer.model_dir=runs/try
  kerastrain run recipes/quickstart.yaml --set strategy.name=mirrored --set strategy.cpu_devices=2
  kerastrain run recipes/quickstart.yaml -v              # every decision in full
  kerastrain run --print-config > my_recipe.yaml         # every key with its default
  kerastrain run recipes/digits.yaml --print-config      # what would run, after includes and --set
""",
    "validate": """
  kerastrain validate recipes/digits.yaml
  kerastrain validate recipes/digits.yaml --set model.args.hidden=256
  kerastrain validate untrusted.yaml --no-import         # check without running its code
""",
    "launch": """
  kerastrain launch recipes/multi_worker.yaml --workers 2
  kerastrain launch recipes/parameter_server.yaml --workers 2 --ps 1
  kerastrain launch recipes/multi_worker.yaml --workers 2 --evaluator --max-restarts 2
  kerastrain launch recipes/parameter_server.yaml --workers 2 --ps 1 --service-workers 2
  kerastrain launch recipes/parameter_server.yaml --workers 4 --ps 2 --dry-run   # TF_CONFIGs
  kerastrain launch recipes/parameter_server.yaml --workers 2 --ps 1 --network multihost --fault "freeze worker:1 at step 32 for 60s"   # rehearse
  kerastrain launch recipes/multi_worker.yaml --workers 2:4 --capacity-file capacity.txt   # elastic
  kerastrain launch recipes/parameter_server.yaml --workers 2 --ps 1 --ray   # each task a Ray actor (pip install 'kerastrain[ray]')
  kerastrain launch train.py --workers 2 --ray   # your script's Trainer on each task
""",
    "tune": """
  kerastrain tune recipes/quickstart.yaml --space recipes/quickstart.space.yaml
  kerastrain tune recipes/quickstart.yaml --space recipes/quickstart.space.yaml --trials 20   # go on
  kerastrain tune recipes/digits.yaml --space my.space.yaml --parallel 2 --mlflow
  kerastrain tune recipes/quickstart.yaml --space s.yaml --set trainer.epochs=2 --sweep-dir runs/s2
  kerastrain tune recipes/quickstart.yaml --space recipes/quickstart.space.yaml --ray   # Ray actors
""",
    "quickstart": """
  kerastrain quickstart                          # auto strategy on this machine
  kerastrain quickstart --strategy mirrored --cpu-devices 2
  kerastrain quickstart --strategy ps --epochs 2 --steps-per-epoch 50
  kerastrain quickstart --model-dir runs/quick   # checkpoints, export; a rerun resumes
""",
    "info": """
  kerastrain info
  TF_CONFIG="$(cat tf_config.json)" kerastrain info   # what a task of that cluster would do
""",
    "bench": """
  kerastrain bench --quick
  kerastrain bench --only numpy,ps --json bench.json
""",
    "export": """
  kerastrain export k8s recipes/parameter_server.yaml --workers 4 --ps 2 --volume runs > job.yaml
  kerastrain export k8s recipes/multi_worker.yaml --workers 4 --set trainer.model_dir=gs://bucket/mw --image registry/me/kerastrain:0.1.0
  kerastrain export slurm recipes/multi_worker.yaml --nodes 4 > job.sbatch
""",
}


def _examples(command):
    """`add_parser` arguments that show the command's examples below its help."""
    return {"epilog": "examples:" + COMMAND_EXAMPLES[command],
            "formatter_class": argparse.RawDescriptionHelpFormatter}


def _recipe_command(sub, name, summary, description, recipe_optional=False):
    """A subcommand taking RECIPE and repeatable --set overrides."""
    command = sub.add_parser(name, help=summary, description=description, **_examples(name))
    command.add_argument("recipe", nargs="?" if recipe_optional else None,
                         help="the recipe file (YAML)")
    command.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE",
        help="override a key, e.g. --set trainer.epochs=3 or --set strategy.name=mirrored; the "
             "value is parsed as YAML and checked like the file (repeatable)")
    return command


def parser():
    parser = argparse.ArgumentParser(
        prog="kerastrain", description="Keras 3 training under every tf.distribute strategy.",
        epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="store_true", help="print the version and exit")
    sub = parser.add_subparsers(dest="command")
    run = _recipe_command(
        sub, "run", "train as a YAML recipe says",
        "Validate a recipe (all errors at once, before TensorFlow starts), then train. The "
        "resolved recipe is written to model_dir/recipe.yaml.", recipe_optional=True)
    run.add_argument("-v", "--verbose", action="store_true",
                     help="log every decision in full (kerastrain's DEBUG level), e.g. the "
                          "tuning account that is otherwise one line")
    run.add_argument("--print-config", action="store_true",
                     help="print the resolved recipe (or, without RECIPE, every key with its "
                          "default) and exit")
    validate = _recipe_command(
        sub, "validate", "check a recipe and print it resolved (exit 0) or its errors (exit 2)",
        "Check a recipe without training: keys, types, ranges, import paths, builder "
        "arguments, strategy names and options. Prints the resolved recipe.\n\n"
        "To check the builders and an optimizer given by import path, validate IMPORTS THE "
        "RECIPE'S MODULES, which runs their code (as `run` would). For a recipe you do not "
        "trust, use --no-import. Files are read within limits (size, YAML aliases, nesting, "
        "includes: docs/recipes.md).")
    validate.add_argument(
        "--no-import", action="store_true",
        help="do not import the recipe's modules (no code of theirs runs): check everything "
             "else, and list the import paths whose existence and arguments went unchecked")
    _add_launch(sub)
    _add_tune(sub)
    _add_export(sub)
    quick = sub.add_parser(
        "quickstart", help="train the built-in example model for real on this machine",
        description="Train a 2x256 MLP on 65,536 synthetic examples (binary target).",
        **_examples("quickstart"))
    quick.add_argument("--strategy", default="auto", help="strategy name (default: auto)")
    quick.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                       help="strategy option, value parsed as YAML (repeatable)")
    quick.add_argument("--cpu-devices", type=int, default=None,
                       help="split the CPU into N logical devices (mirrored without GPUs)")
    quick.add_argument("--epochs", type=int, default=3)
    quick.add_argument("--steps-per-epoch", type=int, default=None)
    quick.add_argument("--examples", type=int, default=65536)
    quick.add_argument("--batch-size", type=int, default=256, help="global batch size")
    quick.add_argument("--verbose", type=int, choices=(0, 1, 2), default=None)
    quick.add_argument("--model-dir", default=None,
                       help="keep checkpoints, TensorBoard logs and the export here; a rerun resumes")
    sub.add_parser("info", help="show devices, TF_CONFIG and the strategy 'auto' would choose",
                   **_examples("info"))
    bench = sub.add_parser(
        "bench", help="run the speed table (bench/all.py in a repository checkout)",
        description="Every input form and strategy against its bare baseline, one table "
                    "(docs/performance.md). Needs the repository's bench/ directory.",
        **_examples("bench"))
    bench.add_argument("--quick", action="store_true", help="3 rounds per section (~3 min)")
    bench.add_argument("--only", default=None, help="comma-separated sections")
    bench.add_argument("--json", default=None, help="also write the rows here")
    return parser


def _add_launch(sub):
    """`kerastrain launch RECIPE --workers N ...`."""
    launch = _recipe_command(
        sub, "launch", "run a recipe on a local cluster of processes (one per task)",
        "Start a real local cluster: free ports on 127.0.0.1 of a private network namespace "
        "(see --network), one process per task running "
        "`kerastrain run RECIPE` with its TF_CONFIG, output prefixed by task. Parameter-server "
        "workers that die are restarted; other failures restart the whole job while "
        "--max-restarts allows. Ctrl-C stops every task. The exit code is the chief's. "
        "RECIPE may be a Python script (train.py) whose Trainer reads TF_CONFIG: it runs on "
        "every training task (under ps on the chief; workers and ps tasks serve).")
    launch.add_argument(
        "--workers", required=True, metavar="N|MIN:MAX",
        help="worker tasks; MIN:MAX makes the job elastic: it starts with what it can have up "
             "to MAX and goes on at another size as workers are lost for good or come back, "
             "as long as MIN hold (below, it stops with exit 69)")
    launch.add_argument(
        "--capacity-file", default=None, metavar="PATH",
        help="an elastic job's capacity: a file holding how many workers the cluster can hold "
             "now (read every 0.2 s; edit it to take workers away or give them back)")
    launch.add_argument("--ps", type=int, default=0,
                        help="parameter-server tasks (adds a chief: the coordinator)")
    launch.add_argument("--chief", action="store_true",
                        help="a separate chief task (multi-worker mirrored)")
    launch.add_argument("--evaluator", action="store_true",
                        help="a side-car evaluator task that evaluates each new checkpoint")
    launch.add_argument("--service-workers", type=int, default=0,
                        help="also start a tf.data service dispatcher and this many workers "
                             "(restarted if they die) and train through them "
                             "(--set data.service=grpc://...)")
    launch.add_argument("--max-restarts", type=int, default=0,
                        help="restart the whole job this many times after a failure")
    launch.add_argument("-v", "--verbose", action="store_true",
                        help="every task's output raw: TensorFlow's own lines (its start-up, "
                             "its gRPC errors about a restarting worker, which the launcher "
                             "otherwise tells in one line) and each task's `run -v`")
    launch.add_argument("--dry-run", action="store_true",
                        help="print each task's TF_CONFIG and command; start nothing")
    launch.add_argument(
        "--network", choices=("private", "host", "multihost"), default=None,
        help="private (default): every task runs in one network namespace with loopback only, "
             "where Linux allows it, since TensorFlow's servers listen on every interface "
             "without authentication; host: this machine's network, for tasks that need it "
             "(a gs:// model_dir, downloads); multihost: a rehearsal of a real cluster, "
             "every task a host of its own (address, host name, /tmp, working directory) on "
             "a private bridge, only model_dir shared. Default: the recipe's "
             "strategy.network, else private")
    launch.add_argument(
        "--ray", nargs="?", const="local", default=None, metavar="ADDRESS",
        help="run each task in a Ray actor (pip install 'kerastrain[ray]'): alone, on a Ray "
             "cluster started here in the private network namespace; with an ADDRESS ('auto', "
             "host:port), on that running cluster (needs --network host)")
    launch.add_argument(
        "--fault", action="append", default=[], metavar="PLAN",
        help="a fault to rehearse (repeatable): 'freeze worker:1 at 20s for 60s' (SIGSTOP, "
             "then SIGCONT), 'partition worker:0 at 30s for 20s' (multihost: its link down), "
             "'kill ps:0 at 40s'; 'at step N' waits for a checkpoint of step N instead of a "
             "clock started with the tasks; with --workers MIN:MAX, 'remove worker:3 at step "
             "40' (its host gone for good) and 'return worker:3 at step 80'")


def _add_tune(sub):
    """`kerastrain tune RECIPE --space SPACE ...`."""
    tune = _recipe_command(
        sub, "tune", "search recipe values (learning rate, width, ...) with trials that are runs",
        "A sweep: each trial is `kerastrain run RECIPE` with values from the search space "
        "(checked as --set values are), in a folder of its own under the sweep's folder, "
        "several at once on shares of the cores; bad trials are pruned at an epoch's end; "
        "the study (Optuna, SQLite) lives in the sweep's folder, so the same command again "
        "resumes a stopped sweep. Prints the best trials and writes best.yaml. Needs the "
        "`tune` extra (pip install 'kerastrain[tune]'). See docs/sweeps.md.")
    tune.add_argument("--space", required=True, metavar="SPACE.yaml",
                      help="the search space: params, objective, trials, parallel, sampler, "
                           "pruner, sweep_dir")
    tune.add_argument("--sweep-dir", default=None,
                      help="the sweep's folder (default: the space's sweep_dir, else "
                           "runs/<space name>-sweep)")
    tune.add_argument("--trials", type=int, default=None,
                      help="trials in all (overrides the space's; raise it to go on)")
    tune.add_argument("--parallel", type=int, default=None,
                      help="trials at once (overrides the space's)")
    tune.add_argument("--mlflow", action="store_true",
                      help="an MLflow run for the sweep with a child run per trial (also "
                           "when the recipe has `mlflow:`)")
    tune.add_argument(
        "--ray", nargs="?", const="local", default=None, metavar="ADDRESS",
        help="run each trial in a Ray actor (pip install 'kerastrain[ray]'): alone, on a Ray "
             "cluster started here in a private network namespace; with an ADDRESS ('auto', "
             "host:port), on that running cluster, whose every node must see the sweep folder "
             "and the recipe at the same paths")
    tune.add_argument("-v", "--verbose", action="store_true",
                      help="a traceback with errors that are otherwise one line")


def _add_export(sub):
    """`kerastrain export k8s|slurm RECIPE ...`."""
    export = sub.add_parser(
        "export", help="write a manifest that runs a recipe on a real cluster (k8s, slurm)",
        description="Print a Kubeflow TFJob manifest (k8s) or a Slurm batch script (slurm) "
                    "whose tasks all run `kerastrain run RECIPE`; the cluster manager provides "
                    "TF_CONFIG. See docs/clusters.md.",
        **_examples("export"))
    export.add_argument("target", choices=("k8s", "slurm"))
    export.add_argument("recipe", help="the recipe's path as the tasks will see it")
    export.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="overrides passed on to every task (repeatable)")
    export.add_argument("--workers", default="1",
                        help="k8s: worker replicas (a TFJob has a fixed size: no MIN:MAX)")
    export.add_argument("--ps", type=int, default=0, help="k8s: parameter-server replicas")
    export.add_argument("--chief", action="store_true", help="k8s: a separate chief replica")
    export.add_argument("--evaluator", action="store_true", help="k8s: a side-car evaluator")
    export.add_argument("--image", default=None,
                        help="k8s: container image (default: kerastrain:VERSION, what the "
                             "project's Dockerfile builds)")
    export.add_argument("--volume", default=None, metavar="CLAIM",
                        help="k8s: a ReadWriteMany PersistentVolumeClaim mounted in every "
                             "replica; model_dir goes on it (else model_dir must be a URL)")
    export.add_argument("--name", default=None, help="k8s: the TFJob's name")
    export.add_argument("--namespace", default=None, help="k8s: the TFJob's namespace")
    export.add_argument("--nodes", default="2",
                        help="slurm: nodes (one worker each); MIN:MAX lets Slurm start the job, "
                             "and restart it when requeued, on what it can give")

"""The `kerastrain` command line (a thin layer over the Python API)."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import yaml

from kerastrain import _logging  # pure Python: no TensorFlow
from kerastrain.cli.config import RecipeError  # pure Python: no TensorFlow
from kerastrain.io.files import DiskFull  # pure Python: no TensorFlow
from kerastrain.loop.stalls import LostPeer  # pure Python too

EXAMPLES = """examples:
  kerastrain run recipes/quickstart.yaml         # train as a recipe says
  kerastrain run recipes/digits.yaml --set trainer.epochs=10 --set data.batch_size=32
  kerastrain validate recipes/mirrored.yaml      # check it, print the resolved recipe
  kerastrain run --print-config > my.yaml        # every key with its default, to start from
  kerastrain quickstart                          # auto strategy on this machine
  kerastrain quickstart --strategy mirrored --cpu-devices 2
  kerastrain quickstart --strategy ps --epochs 2 --steps-per-epoch 50
  kerastrain quickstart --model-dir runs/quick   # checkpoints, export; tensorboard --logdir runs/quick/logs
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
  kerastrain launch recipes/parameter_server.yaml --workers 2 --ps 1 --ray   # each task a Ray actor (pip install 'kerastrain[ray]')
  kerastrain launch train.py --workers 2 --ray   # your script's Trainer on each task
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


def _parser():
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


def _bench(args):
    """Run bench/all.py from the checkout this package lives in."""
    import os
    import subprocess
    checkout = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
    script = os.path.join(checkout, "bench", "all.py")
    if not os.path.exists(script):
        raise ValueError("`kerastrain bench` runs bench/all.py of a kerastrain repository "
                         f"checkout, and there is none next to this package. Received: no "
                         f"file {script}. Clone the repository and run it there.")
    command = [sys.executable, script] + (["--quick"] if args.quick else []) + sum(
        ([flag, value] for flag, value in (("--only", args.only), ("--json", args.json))
         if value), [])
    return subprocess.call(command)


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
    launch.add_argument("--workers", type=int, required=True, help="worker tasks")
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
             "clock started with the tasks")


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
    export.add_argument("--workers", type=int, default=1, help="k8s: worker replicas")
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
    export.add_argument("--nodes", type=int, default=2, help="slurm: nodes (one worker each)")


def _options(pairs):
    options = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise SystemExit(f"kerastrain: --option must look like KEY=VALUE. Received: {pair!r}")
        options[key] = yaml.safe_load(value)
    return options


def _quickstart(args):
    from kerastrain.distribute import network
    from kerastrain.distribute import strategies

    options = _options(args.option)
    if args.cpu_devices:
        options["cpu_devices"] = args.cpu_devices
    # Before NumPy and TensorFlow start threads, after which Linux cannot isolate the process.
    strategy = {"name": args.strategy, **options}
    network.isolate_for({"strategy": strategy, "trainer": {"model_dir": args.model_dir}},
                        mode=strategies.local_cluster_network(strategy),
                        opt_out="--option network=host")
    _logging.start_tensorflow_quietly()
    import kerastrain as kt
    from kerastrain import examples

    repeat = args.strategy in ("ps", "parameter_server") and args.steps_per_epoch is not None
    trainer = kt.Trainer(
        lambda: examples.build_mlp(), strategy={"name": args.strategy, **options}, seed=0,
        model_dir=args.model_dir,
        verbose="auto" if args.verbose is None else args.verbose)
    start = time.perf_counter()
    data = examples.synthetic_dataset_fn(args.examples, global_batch=args.batch_size,
                                         repeat=repeat)
    validation = examples.synthetic_dataset_fn(max(args.examples // 8, args.batch_size),
                                               global_batch=args.batch_size, seed=1)
    history = trainer.fit(data, epochs=args.epochs, steps_per_epoch=args.steps_per_epoch,
                          validation_dataset_fn=validation)
    seconds = time.perf_counter() - start
    if not history.history:
        print(f"kerastrain: nothing left to train: {args.model_dir} already holds "
              f"{trainer.global_step} steps ({args.epochs} epochs); pass more --epochs to go on")
        return 0
    final = {k: round(v[-1], 4) for k, v in history.history.items()}
    print(f"kerastrain: trained to step {trainer.global_step} in {seconds:.1f}s under "
          f"{trainer.strategy_name} ({trainer.strategy.num_replicas_in_sync} replica(s)); "
          f"final {json.dumps(final)}"
          + (f"; outputs in {args.model_dir}" if args.model_dir else ""))
    return 0


def _info():
    _logging.start_tensorflow_quietly()
    import tensorflow as tf

    from kerastrain.distribute import cluster
    from kerastrain.distribute import strategies
    config = cluster.read_tf_config()
    print(f"tensorflow {tf.__version__}, keras {__import__('keras').__version__}")
    print("devices:", [d.name for d in tf.config.list_logical_devices()])
    print("TF_CONFIG:", "none" if config is None else
          f"{config.task_type}:{config.task_index} of {json.dumps(config.cluster)}")
    if config is None or config.task_type not in ("worker", "ps") or not config.num_ps:
        built = strategies.build_strategy("auto")
        print(f"auto strategy: {built.name} ({built.reason})")
    return 0


def _raw_tree(args) -> dict:
    """The recipe with includes and --set applied, unvalidated: nothing of the user's imported."""
    from kerastrain.cli import recipes

    tree, positions = recipes.load_file(args.recipe)
    tree = recipes.apply_overrides(tree, positions, args.set)
    return tree if isinstance(tree, dict) else {}


def _run(args, train):
    from kerastrain.cli import config, template
    from kerastrain.distribute import network
    from kerastrain.cli import recipes
    from kerastrain.data import service
    from kerastrain.distribute import strategies

    if args.recipe is None:
        if getattr(args, "print_config", False):
            print(template.template(), end="")
            return 0
        print("kerastrain: error: `run` needs a RECIPE file (or --print-config for a template)",
              file=sys.stderr)
        return 2
    if train and not getattr(args, "print_config", False):
        # A local ps cluster: isolate before validation imports the recipe's modules, whose
        # NumPy starts threads, after which Linux cannot move the process.
        tree = _raw_tree(args)
        cluster = strategies.local_cluster_network(tree.get("strategy"))
        data = tree.get("data")
        local_service = service.local_network(data.get("service") if isinstance(data, dict)
                                              else None)
        network.isolate_for(tree, mode=cluster or local_service, opt_out=(
            "the strategy option `network: host` (--set strategy.network=host)" if cluster else
            "`data.service: {dispatcher: local, network: host}`"))
    imports = not getattr(args, "no_import", False)
    if train and not getattr(args, "print_config", False):
        if args.verbose:
            _logging.ensure_visible()
            _logging.logger.setLevel("DEBUG")
        # After isolation (TensorFlow starts threads), before the recipe's modules load it.
        _logging.start_tensorflow_quietly()
    recipe, tree = recipes.load(args.recipe, args.set, imports=imports)
    text = recipes.dump(tree)
    if not train or getattr(args, "print_config", False):
        print(text, end="")
        if not train and imports:
            print(f"kerastrain: {args.recipe} is valid", file=sys.stderr)
        elif not train:
            skipped = "; ".join(f"{k} {v}" for k, v in config.import_paths(recipe).items())
            print(f"kerastrain: {args.recipe} is valid, except what needs importing: not "
                  f"imported (--no-import), so not checked to exist or take their args: "
                  f"{skipped}", file=sys.stderr)
        return 0
    role = recipes.task_role(recipe)
    if role == "server":
        # A worker or ps task of a parameter-server cluster: serve until the chief ends.
        from kerastrain.distribute import cluster
        _logging.ensure_visible()
        cluster.serve()
        return 0
    if role == "evaluator":
        from kerastrain.cli import evaluator
        return evaluator.run(recipe)
    trainer, _ = recipes.run(recipe, resolved_text=f"# resolved from {args.recipe}" + (
        f" with --set {' --set '.join(args.set)}" if args.set else "") + "\n" + text)
    trainer.close()  # the run is over: its model_dir is free (also for a next run in-process)
    if trainer.strategy_name == "multi_worker_mirrored":
        from kerastrain.distribute import cluster
        config = cluster.read_tf_config()
        if config is not None:
            cluster.end_together(config)
    return 0


def _launch(args):
    from kerastrain.cli import launch
    if args.max_restarts < 0:
        print(f"kerastrain: error: --max-restarts must be >= 0. Received: {args.max_restarts}",
              file=sys.stderr)
        return 2
    # From the first moment: Ctrl-C while the recipe's modules import, while tasks start or
    # between restarts stops everything started so far, with 130.
    with launch.Interrupts() as interrupts:
        try:
            return _launch_job(args, launch, interrupts)
        except KeyboardInterrupt:
            print("[launch] interrupted before any task started", flush=True)
            return interrupts.exit_code


def _launch_job(args, launch, interrupts):
    from kerastrain.cli import hosts as hosts_lib
    from kerastrain.cli import recipes

    script = launch.is_script(args.recipe)
    if script:
        _check_script(args)
    tree = {} if script else _raw_tree(args)
    network = args.network or launch.recipe_network(tree)
    multihost = network == hosts_lib.MULTIHOST
    _check_ray(args, network)
    if not args.dry_run:  # first: the tasks inherit it, and Linux moves one thread only
        launch.isolate(network, tree)
    interrupts.watch()  # then threads: this watcher's, those of the recipe's modules
    # Every task would fail the same way: say it once.
    model_dir = None if script else recipes.load(args.recipe, args.set)[0].trainer.model_dir
    # Under --ray the addresses come from the actors (below): host names stand in until then,
    # reserving no port here.
    spec = launch.cluster_spec(args.workers, args.ps, args.chief, args.evaluator,
                               multihost=multihost or bool(args.ray))
    service_tasks, sets = launch.service_tasks(args.service_workers, args.set, multihost)
    tasks = service_tasks + launch.tasks_for(spec, args.recipe, sets)
    from kerastrain.cli.faults import parse_fault
    faults = [parse_fault(text, tasks, multihost) for text in args.fault]
    if args.dry_run:
        launch.dry_run(tasks)
        return 0
    hosts = None
    if args.ray:   # the same tasks, each at a free port of the node its actor runs on
        from kerastrain.cli import ray_cluster
        hosts = ray_cluster.RayHosts([t.host for t in tasks],
                                     address=None if args.ray == "local" else args.ray)
        spec = launch.cluster_spec(args.workers, args.ps, args.chief, args.evaluator,
                                   hosts=hosts)
        tasks = launch.tasks_for(spec, args.recipe, sets)
    elif multihost:  # only model_dir is shared storage, as on a cluster
        if model_dir:
            os.makedirs(model_dir, exist_ok=True)
        hosts = hosts_lib.Hosts([t.host for t in tasks], shared=[model_dir] if model_dir else [])
        hosts.build()
    else:
        launch.warn_if_exposed(spec, network)
    try:
        return launch.Launcher(tasks, max_restarts=args.max_restarts, interrupts=interrupts,
                               hosts=hosts, faults=faults, model_dir=model_dir).run()
    finally:
        if hosts is not None:
            hosts.close()


def _check_script(args):
    """`kerastrain launch train.py`: what only a recipe gives the launcher is refused."""
    if not os.path.isfile(args.recipe):
        raise ValueError(f"No such script. Received: {args.recipe!r}")
    given = [flag for flag, value in (("--set", args.set), ("--evaluator", args.evaluator),
                                      ("--service-workers", args.service_workers)) if value]
    given += ["--fault '... at step N'" for text in args.fault if " at step " in text]
    if given:
        raise ValueError(
            "A launched script sets up its own Trainer: recipe keys, the side-car evaluator, "
            "tf.data service workers and faults at a checkpoint's step need a recipe (the "
            f"launcher reads its model_dir). Received: {', '.join(given)} with "
            f"{args.recipe}. Drop them, or write the script's settings as a recipe.")


def _check_ray(args, network):
    """`--ray` runs the job's own tasks: what only a local launch can do is refused here."""
    if not args.ray:
        return
    if args.service_workers:
        raise ValueError("`--ray` does not start tf.data service workers yet. Received: "
                         f"--service-workers {args.service_workers}. Drop it, or run the "
                         "service yourself and set data.service.address.")
    if network == "multihost":
        raise ValueError("`--ray` and `--network multihost` are two places to run: choose one. "
                         "Received: --network multihost")
    if args.ray != "local" and network != "host":
        raise ValueError(f"`--ray {args.ray}` joins a running Ray cluster over the network, "
                         "which the private network namespace (the default) does not reach. "
                         f"Received: --network {network}. Add --network host, or use --ray "
                         "alone for a Ray cluster started here.")


def _export(args):
    from kerastrain.cli import manifests

    from kerastrain.cli import recipes
    # Where the job keeps its work decides whether a restarted task resumes: read it.
    recipe, _ = recipes.load(args.recipe, args.set, imports=False)
    model_dir = recipe.trainer.model_dir
    if args.target == "k8s":
        print(manifests.dump(manifests.tfjob(
            args.recipe, workers=args.workers, ps=args.ps, chief=args.chief,
            evaluator=args.evaluator, image=args.image or manifests.IMAGE, name=args.name,
            namespace=args.namespace, sets=args.set, model_dir=model_dir,
            volume=args.volume, strategy=recipe.strategy["name"])), end="")
    else:
        print(manifests.slurm_script(args.recipe, nodes=args.nodes, sets=args.set,
                                     model_dir=model_dir), end="")
    return 0


def main(argv=None) -> int:
    from kerastrain._lifetime import die_with_launcher
    from kerastrain.loop import stalls
    die_with_launcher()  # a task of `kerastrain launch` ends with it (SIGKILL included)
    stalls.start_heartbeat(os.environ.get("KERASTRAIN_HEARTBEAT"))  # an exported job's probe
    args = _parser().parse_args(argv)
    if args.version:
        from kerastrain import __version__
        print(__version__)
        return 0
    try:
        if args.command == "quickstart":
            return _quickstart(args)
        if args.command == "info":
            return _info()
        if args.command == "bench":
            return _bench(args)
        if args.command == "export":
            return _export(args)
        if args.command == "launch":
            return _launch(args)
        if args.command in ("run", "validate"):
            return _run(args, train=args.command == "run")
    except LostPeer as e:  # a cluster fault, not a usage error: the launcher restarts on it
        print(f"kerastrain: error: {e}", file=sys.stderr)
        return 1
    except RecipeError as e:  # every problem in the recipe, one per line
        print(f"kerastrain: {args.recipe}: {e}", file=sys.stderr)
        return 2
    except (ValueError, TypeError, RuntimeError) as e:
        print(f"kerastrain: error: {e}", file=sys.stderr)
        return 2
    except DiskFull as e:  # what was written before is intact; the message says what to do
        print(f"kerastrain: {e}", file=sys.stderr)
        return 1
    _parser().print_help()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

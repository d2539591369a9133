"""The `kerastrain` command line (a thin layer over the Python API)."""

from __future__ import annotations

import json
import os
import sys
import time

import yaml

from kerastrain import _logging  # pure Python: no TensorFlow
from kerastrain.cli import arguments  # argparse only
from kerastrain.cli import elastic as elastic_lib  # pure Python too
from kerastrain.cli.config import RecipeError  # pure Python: no TensorFlow
from kerastrain.cli.training import RecipeRunError  # pure Python too
from kerastrain.io.files import DiskFull  # pure Python: no TensorFlow
from kerastrain.loop.stalls import LostPeer  # pure Python too
from kerastrain.cli.tune.space import SpaceError  # pure Python too


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


def _checked_tree(args):
    """The recipe with includes and --set applied, every key checked but nothing of the user's
    imported: (tree, positions). A typo fails here, before TensorFlow or a network starts."""
    from kerastrain.cli import config, recipes

    tree, positions = recipes.read(args.recipe, args.set)
    config.validate(tree, positions, imports=False)
    return tree, positions


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
    train = train and not getattr(args, "print_config", False)
    if train:
        # Every key first (nothing imported): a typo costs no TensorFlow start. Then a local
        # ps cluster isolates before the recipe's modules are imported, whose NumPy starts
        # threads, after which Linux cannot move the process.
        tree, positions = _checked_tree(args)
        cluster = strategies.local_cluster_network(tree.get("strategy"))
        data = tree.get("data")
        local_service = service.local_network(data.get("service") if isinstance(data, dict)
                                              else None)
        network.isolate_for(tree, mode=cluster or local_service, opt_out=(
            "the strategy option `network: host` (--set strategy.network=host)" if cluster else
            "`data.service: {dispatcher: local, network: host}`"))
        if args.verbose:
            _logging.ensure_visible()
            _logging.logger.setLevel("DEBUG")
        # After isolation (TensorFlow starts threads), before the recipe's modules load it.
        _logging.start_tensorflow_quietly()
    else:
        tree, positions = recipes.read(args.recipe, args.set)
    imports = not getattr(args, "no_import", False)
    if imports:
        recipes.import_from(args.recipe)  # the working directory, then the recipe's folder
    recipe, tree = recipes.check(tree, positions, imports=imports)
    text = recipes.dump(tree)
    if not train:
        print(text, end="")
        if args.command == "validate" and imports:
            print(f"kerastrain: {args.recipe} is valid", file=sys.stderr)
        elif args.command == "validate":
            skipped = "; ".join(f"{k} {v}" for k, v in config.import_paths(recipe).items())
            print(f"kerastrain: {args.recipe} is valid, except what needs importing: not "
                  f"imported (--no-import), so not checked to exist or take their args: "
                  f"{skipped}", file=sys.stderr)
        return 0
    try:
        return _train(args, recipe, text)
    except (LostPeer, DiskFull):
        raise
    except Exception as e:  # the user's code (a builder) or a recipe value, by its key
        from kerastrain.cli import training
        failure = training.blamed(e, positions)
        if failure is None:
            raise  # kerastrain's own: not dressed up as the user's
        raise failure from e


def _train(args, recipe, text):
    """Play this process's part in the validated recipe: train, serve, or evaluate."""
    from kerastrain.cli import training

    role = training.task_role(recipe)
    if role == "server":
        # A worker or ps task of a parameter-server cluster: serve until the chief ends.
        from kerastrain.distribute import cluster
        _logging.ensure_visible()
        cluster.serve()
        return 0
    if role == "evaluator":
        from kerastrain.cli import evaluator
        return evaluator.run(recipe)
    trainer, _ = training.run(recipe, resolved_text=f"# resolved from {args.recipe}" + (
        f" with --set {' --set '.join(args.set)}" if args.set else "") + "\n" + text)
    trainer.close()  # the run is over: its model_dir is free (also for a next run in-process)
    if trainer.strategy_name == "multi_worker_mirrored":
        from kerastrain.distribute import cluster
        config = cluster.read_tf_config()
        if config is not None:
            cluster.end_together(config)
    return 0


def _tune(args):
    """`kerastrain tune`: a sweep (kerastrain.cli.tune.sweep), 0 when a trial completed."""
    for flag, value in (("--trials", args.trials), ("--parallel", args.parallel)):
        if value is not None and value < 1:
            raise ValueError(f"{flag} must be >= 1. Received: {flag} {value}")
    if args.ray == "local":   # as `launch --ray`: Ray's services reachable from nothing outside
        _isolate_for_ray(args)
    from kerastrain.cli.tune import sweep
    try:
        found = sweep.Sweep(args.recipe, args.space, sets=args.set, sweep_dir=args.sweep_dir,
                            trials=args.trials, parallel=args.parallel, mlflow=args.mlflow,
                            ray=args.ray, say=lambda line: print(line, flush=True))
        result = found.run()
    except ImportError as e:   # an optional extra (Optuna; MLflow, Ray when asked for)
        print(f"kerastrain: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return 0 if result.best is not None else 1


def _isolate_for_ray(args):
    """Before any thread starts (the recipe's modules import NumPy): this process, the Ray
    cluster it starts and every trial in a private network namespace (loopback only)."""
    import io

    from kerastrain.cli import isolation, recipes
    said = io.StringIO()
    isolation.isolate("private", recipes.read(args.recipe, args.set)[0], out=said)
    for line in said.getvalue().splitlines():
        print(line.replace("[launch] network: every task", "kerastrain tune: network: every "
                           "trial and Ray").replace("[launch] ", "kerastrain tune: ").replace(
            "; --network host turns this off", "; --ray ADDRESS (a running Ray cluster) does "
            "not isolate"), flush=True)


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
    from kerastrain.cli import isolation
    from kerastrain.cli import recipes
    from kerastrain.cli import tasks as tasks_lib

    script = tasks_lib.is_script(args.recipe)
    if script:
        _check_script(args)
    tree = {} if script else _checked_tree(args)[0]
    network = args.network or isolation.recipe_network(tree)
    multihost = network == hosts_lib.MULTIHOST
    _check_ray(args, network)
    if not args.dry_run:  # first: the tasks inherit it, and Linux moves one thread only
        isolation.isolate(network, tree)
    interrupts.watch()  # then threads: this watcher's, those of the recipe's modules
    # Every task would fail the same way: say it once. (Each imports the recipe's modules
    # as `kerastrain run` does, started in this working directory.)
    if not script:
        recipes.import_from(args.recipe)
    recipe = None if script else recipes.load(args.recipe, args.set)[0]
    model_dir = None if script else recipe.trainer.model_dir
    if recipe is not None:
        from kerastrain.cli import manifests
        manifests.check_ps_for(recipe.strategy["name"], args.ps, command="launch")
    service_tasks, sets = tasks_lib.service_tasks(args.service_workers, args.set, multihost)
    # Under --ray the addresses come from the actors (below): host names stand in until then,
    # reserving no port here.
    ray = {}   # the RayHosts, once made (below): where a resized job's tasks go
    elastic, slots = _elastic(args, script, model_dir, lambda slots: _tasks_on(
        args, sets, [] if ray else service_tasks, slots, multihost=multihost,
        hosts=ray.get("hosts")))
    if not slots:
        return elastic_lib.BELOW_MIN
    tasks = _tasks_on(args, sets, service_tasks, slots, multihost=multihost or bool(args.ray))
    from kerastrain.cli.faults import parse_fault
    faults = [parse_fault(text, tasks, multihost, elastic and elastic.high)
              for text in args.fault]
    if args.dry_run:
        tasks_lib.dry_run(tasks)
        return 0
    hosts = None
    if args.ray:   # the same tasks, each at a free port of the node its actor runs on
        from kerastrain.cli import ray_cluster
        names = [t.host for t in tasks] + [s for s in (elastic.slots if elastic else ())
                                           if s not in slots]   # every host a slot may take
        hosts = ray["hosts"] = ray_cluster.RayHosts(
            names, address=None if args.ray == "local" else args.ray)
        tasks = _tasks_on(args, sets, [], slots, hosts=hosts)
    elif multihost:  # only model_dir is shared storage, as on a cluster
        if model_dir:
            os.makedirs(model_dir, exist_ok=True)
        names = [t.host for t in tasks] + [s for s in (elastic.slots if elastic else ())
                                           if s not in slots]   # every host a slot may take
        hosts = hosts_lib.Hosts(names, shared=[model_dir] if model_dir else [])
        hosts.build()
    else:
        isolation.warn_if_exposed(json.loads(tasks[-1].tf_config)["cluster"], network)
    try:
        return launch.Launcher(tasks, max_restarts=args.max_restarts, interrupts=interrupts,
                               hosts=hosts, faults=faults, model_dir=model_dir,
                               verbose=args.verbose, elastic=elastic).run()
    finally:
        if hosts is not None:
            hosts.close()


def _tasks_on(args, sets, service, slots, multihost=False, hosts=None):
    """The job's tasks with one worker on each slot (`worker-0`, ...: an elastic job's hosts)."""
    from kerastrain.cli import hosts as hosts_lib
    from kerastrain.cli import tasks as tasks_lib
    spec = tasks_lib.cluster_spec(len(slots), args.ps, args.chief, args.evaluator,
                                  multihost=multihost, hosts=hosts)
    if multihost:   # each worker at its slot's host, which a resized job keeps
        spec["worker"] = [f"{slot}:{hosts_lib.PORT}" for slot in slots]
    elif hosts is not None:   # Ray: a free port on the node of each slot's actor
        spec["worker"] = [hosts.free_address(slot) for slot in slots]
    tasks = service + tasks_lib.tasks_for(spec, args.recipe, sets, args.verbose)
    for task, slot in zip([t for t in tasks if t.type == "worker"], slots):
        task.slot = slot
    return tasks


def _elastic(args, script, model_dir, build):
    """`--workers MIN:MAX` (or a `--capacity-file`): (an elastic.Elastic or None, the slots the
    job starts on; none: below MIN, said)."""
    low, high = elastic_lib.parse_workers(args.workers)
    if low == high and args.capacity_file is None:
        return None, [elastic_lib.slot_of(f"worker:{i}") for i in range(high)]
    given = [flag for flag, value in (("a script", script),
                                      ("no trainer.model_dir", not script and not model_dir))
             if value]
    if given:
        raise ValueError(
            "An elastic job (`--workers MIN:MAX`, `--capacity-file`) resumes each new size "
            "from the recipe's model_dir, which the launcher reads. "
            f"Received: --workers {args.workers} with {', '.join(given)}")
    elastic = elastic_lib.Elastic(low, high, build=build, ps=bool(args.ps),
                                  capacity_file=args.capacity_file, model_dir=model_dir)
    return elastic, elastic.first_slots(
        lambda text: print(f"[launch] {text}", flush=True))


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
        if not str(args.workers).isdigit():
            raise ValueError(
                "export k8s: `--workers` must be an int >= 1: a TFJob has a fixed size "
                "(Kubeflow's elasticPolicy is the PyTorchJob's; the manifest's first lines say "
                "how to change the size). Received: --workers " + str(args.workers))
        print(manifests.dump(manifests.tfjob(
            args.recipe, workers=int(args.workers), ps=args.ps, chief=args.chief,
            evaluator=args.evaluator, image=args.image or manifests.IMAGE, name=args.name,
            namespace=args.namespace, sets=args.set, model_dir=model_dir,
            volume=args.volume, strategy=recipe.strategy["name"])), end="")
    else:
        print(manifests.slurm_script(args.recipe, nodes=args.nodes, sets=args.set,
                                     model_dir=model_dir), end="")
    return 0


def _traceback(args, error):
    """`kerastrain run -v`: the traceback of an error otherwise told in one line."""
    if getattr(args, "verbose", None) is not True:
        return False
    import traceback
    traceback.print_exception(error, file=sys.stderr)
    sys.stderr.flush()
    return True


def main(argv=None) -> int:
    from kerastrain._lifetime import die_with_launcher
    from kerastrain.loop import stalls
    die_with_launcher()  # a task of `kerastrain launch` ends with it (SIGKILL included)
    stalls.start_heartbeat(os.environ.get("KERASTRAIN_HEARTBEAT"))  # an exported job's probe
    args = arguments.parser().parse_args(argv)
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
        if args.command == "tune":
            return _tune(args)
    except LostPeer as e:  # a cluster fault, not a usage error: the launcher restarts on it
        print(f"kerastrain: error: {e}", file=sys.stderr)
        return 1
    except RecipeError as e:  # every problem in the recipe, one per line
        print(f"kerastrain: {args.recipe}: {e}", file=sys.stderr)
        return 2
    except SpaceError as e:  # every problem in the search space, one per line
        print(f"kerastrain: {args.space}: {e}", file=sys.stderr)
        return 2
    except RecipeRunError as e:  # the user's code or a recipe value failed: by its key
        shown = _traceback(args, e.error)
        print(f"kerastrain: error: {e}" + ("" if shown else " (-v shows the traceback)"),
              file=sys.stderr)
        return 2
    except (ValueError, TypeError, RuntimeError) as e:
        _traceback(args, e)
        print(f"kerastrain: error: {e}", file=sys.stderr)
        return 2
    except DiskFull as e:  # what was written before is intact; the message says what to do
        print(f"kerastrain: {e}", file=sys.stderr)
        return 1
    arguments.parser().print_help()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

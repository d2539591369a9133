"""Which network `kerastrain launch`'s tasks run in, and the one line that says so.

TensorFlow's servers listen on every interface and accept anyone, so the launcher first moves
itself into a private network namespace with loopback only (where Linux allows it; `--network
host` keeps this machine's network); the tasks inherit it and all share its one loopback. Where
they stay reachable from the network, one line warns.
"""

from __future__ import annotations

import sys

from kerastrain.cli import hosts as hosts_lib
from kerastrain.distribute import network as network_lib
from kerastrain.distribute.cluster import ports


def recipe_network(tree: dict) -> str:
    """The recipe's `strategy.network` when it sets one, else "private" (`--network` wins)."""
    strategy = tree.get("strategy")
    value = strategy.get("network") if isinstance(strategy, dict) else None
    return value if value in network_lib.NETWORKS else network_lib.PRIVATE


def isolate(network: str, tree: dict, out=None) -> None:
    """Move this launcher, and so every task it starts, into a private network namespace.

    Raises:
        ValueError: the recipe (`tree`) names URLs that the namespace cannot reach.
    """
    if network not in (network_lib.PRIVATE, hosts_lib.MULTIHOST):
        return
    network_lib.check_no_urls(tree, "--network host")
    multihost = network == hosts_lib.MULTIHOST
    if not network_lib.exposed_interfaces() and not multihost:
        return
    try:
        why = network_lib.try_isolate(root=multihost)
    except network_lib.TooLate as e:
        why = str(e)
    if why is not None and multihost:
        raise hosts_lib.Refused(
            f"--network multihost needs a user and network namespace of its own, and Linux "
            f"refused one here ({why}); allow unprivileged user namespaces, or rehearse with "
            "--network private (one loopback)")
    if multihost:
        line = (f"network: a multihost rehearsal: every task a host of its own on a private "
                f"bridge ({hosts_lib.GATEWAY}/24), with its own /tmp and working directory; "
                f"only model_dir is shared; {network_lib.INSIDE}")
    elif why is not None:
        line = network_lib.fallback_line(why, "the tasks run")
    else:
        line = (f"network: every task runs in one private network namespace with loopback only "
                f"(TensorFlow's servers accept anyone who can reach them); {network_lib.INSIDE}; "
                "--network host turns this off")
    print(f"[launch] {line}", file=out or sys.stdout, flush=True)


def warn_if_exposed(spec: dict, network: str, out=None) -> None:
    """One line when the tasks' servers will be reachable from the network."""
    how = ("--network host asked for this; without it, the tasks run in a private namespace"
           if network == network_lib.HOST else network_lib.REFUSED_ADVICE)
    line = network_lib.exposure_line(ports(spec), how, who="the tasks' servers")
    if line:
        print(f"[launch] {line}", file=out or sys.stdout, flush=True)

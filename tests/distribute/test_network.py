"""Local clusters keep TensorFlow's servers off the network (issue 14, security 1).

TensorFlow's gRPC servers listen on 0.0.0.0 (hard-coded) and run any graph sent to them. These
tests read what each process really exposes, from its own /proc/PID/net/tcp, tcp6 and dev (the
sockets and interfaces of the process's network namespace): no cluster socket may be bound
beyond loopback in a namespace that has another interface. They need such a namespace: this
machine's own when it has one, else `_outer_netns.py` makes one (a new user + network namespace
with an extra interface) and every command runs in it. No traffic leaves loopback.
"""

import ipaddress
import json
import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
import time

import pytest

import helpers
from kerastrain.cli import command as cli
from kerastrain.distribute import network
from kerastrain.distribute import strategies

PS_RECIPE = os.path.join(helpers.REPO, "recipes", "parameter_server.yaml")
OUTER_SCRIPT = os.path.join(helpers.REPO, "tests", "_outer_netns.py")
# A tiny run: 4 steps of a 16-unit MLP.
TINY = ["trainer.epochs=1", "data.train.args.num_examples=1024",
        "data.validation.args.num_examples=256", "model.args.hidden=16", "trainer.verbose=2",
        "tensorboard=false", "strategy.num_workers=1"]


# -- what a process exposes, read from /proc ------------------------------------------------

def _address(hex_address, v6):
    raw = bytes.fromhex(hex_address)
    if sys.byteorder == "little":  # the kernel prints each 32-bit word in host order
        raw = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
    return ipaddress.ip_address(socket.inet_ntop(socket.AF_INET6 if v6 else socket.AF_INET, raw))


def listening(pid):
    """(address, port) of every listening TCP socket in the process's network namespace."""
    found = []
    for table, v6 in (("tcp", False), ("tcp6", True)):
        try:
            with open(f"/proc/{pid}/net/{table}") as f:
                rows = f.read().splitlines()[1:]
        except FileNotFoundError:  # no IPv6 in this kernel
            continue
        for row in rows:
            fields = row.split()
            if fields[3] == "0A":  # TCP_LISTEN
                address, port = fields[1].split(":")
                found.append((_address(address, v6), int(port, 16)))
    return found


def _is_loopback(address):
    mapped = getattr(address, "ipv4_mapped", None)
    return (mapped or address).is_loopback


class Snapshot:
    """A process's network namespace: its id, interfaces and listening sockets, read at once."""

    def __init__(self, pid):
        self.pid = pid
        self.netns = os.readlink(f"/proc/{pid}/ns/net")
        self.interfaces = network.interfaces(pid)
        self.listening = listening(pid)

    @property
    def other_interfaces(self):
        return [name for name in self.interfaces if name != "lo"]

    def beyond_loopback(self, ports=None):
        """Sockets reachable from outside: bound beyond loopback where there is an outside."""
        if not self.other_interfaces:
            return []
        return [(a, p) for a, p in self.listening
                if not _is_loopback(a) and (ports is None or p in ports)]

    def ports(self):
        return {port for _, port in self.listening}


# -- the namespace the commands run in ------------------------------------------------------

def _outer_prefix():
    """[] when this machine's namespace has an interface besides lo, else the wrapper's command."""
    if network.exposed_interfaces() and os.environ.get("KERASTRAIN_TEST_OUTER_NETNS") != "1":
        return []
    probe = subprocess.run([sys.executable, OUTER_SCRIPT, "true"], capture_output=True,
                           text=True, timeout=60)
    if probe.returncode != 0:
        pytest.skip("this machine's network namespace has loopback only, so nothing listening "
                    "here is reachable from another machine, and Linux refuses a new namespace "
                    f"to test in: {probe.stderr.strip()}")
    return [sys.executable, OUTER_SCRIPT]


@pytest.fixture(scope="module")
def outer():
    """(command prefix, whether kerastrain can isolate a process there)."""
    prefix = _outer_prefix()
    code = "from kerastrain.distribute import network; print(network._probe())"
    probe = _python(prefix, code, timeout=60)
    assert probe.returncode == 0, probe.stderr
    return prefix, probe.stdout.strip() == "None"


def Child(prefix, args):
    """A command run in the outer namespace, its output read as it comes."""
    return helpers.Child(args, prefix=prefix)


def _frozen(pids, read):
    """`read()` while `pids` are stopped (SIGSTOP), so the job cannot end meanwhile."""
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    try:
        return read()
    finally:
        for pid in pids:
            os.kill(pid, signal.SIGCONT)


def _ports(text):
    return [int(p) for p in text.split(", ")]


def _sets(items):
    return [a for item in items for a in ("--set", item)]


def _outer_interfaces(prefix, child):
    """The interfaces of the namespace the command started in (before it moved, if it did)."""
    if not prefix:
        return network.interfaces()
    return child.wait_for(r"^outer-netns: (.+)$").group(1).split()


def _refused_and_said_so(text, seen, ports, prefix=""):
    """Where Linux refuses a namespace, the strongest true thing: the run says so, and says
    which ports are reachable, and /proc agrees."""
    assert f"{prefix}kerastrain: network: cannot make a private network namespace here" in text \
        or f"{prefix}network: cannot make a private network namespace here" in text, text[-4000:]
    warning = re.search(r"network: WARNING: .* listen on every interface, ports ([\d, ]+), "
                        r"reachable from the network \((.+?)\): .*Linux refused", text)
    assert warning, text[-4000:]
    assert sorted(_ports(warning.group(1))) == sorted(ports)
    assert warning.group(2) == ", ".join(seen.other_interfaces)
    assert {p for _, p in seen.beyond_loopback(ports)} == set(ports), seen.listening
    pytest.skip("Linux refuses user + network namespaces here: the run said so, and which ports "
                "are reachable")


# -- the command line -----------------------------------------------------------------------

@pytest.mark.multiprocess
def test_cli_local_ps_cluster_is_bound_to_loopback_only(outer, tmp_path):
    prefix, isolates = outer
    run = Child(prefix, ["-m", "kerastrain.cli", "run", PS_RECIPE,
                         *_sets(TINY + [f"trainer.model_dir={tmp_path}"])])
    started = run.wait_for(r"strategy: ps \(.* listening on ports ([\d, ]+) of (.+?)\)$")
    ports = _ports(started.group(1))
    seen = _frozen([run.process.pid], lambda: Snapshot(run.process.pid))
    assert run.finish() == 0, run.text[-6000:]
    assert "kerastrain: done: 1 epoch, step 4," in run.text
    assert [o for o in _outer_interfaces(prefix, run) if o != "lo"]
    assert set(ports) <= seen.ports()                   # the cluster's own sockets, read here
    if not isolates:
        _refused_and_said_so(run.text, seen, ports)
    assert seen.beyond_loopback() == [], (seen.interfaces, seen.beyond_loopback())
    assert seen.interfaces == ["lo"] and seen.netns != os.readlink("/proc/self/ns/net")
    assert started.group(2) == "every interface of a private network namespace (loopback only)"
    assert re.search(r"network: the local cluster runs in a private network namespace with "
                     r"loopback only .*outgoing network does not work inside .* "
                     r"`network: host` \(--set strategy.network=host\) turns this off", run.text)
    assert "network: WARNING" not in run.text


@pytest.mark.multiprocess
def test_cli_network_host_warns_once_and_is_reachable(outer, tmp_path):
    prefix, _ = outer
    run = Child(prefix, ["-m", "kerastrain.cli", "run", PS_RECIPE, *_sets(
        TINY + [f"trainer.model_dir={tmp_path}", "strategy.network=host"])])
    started = run.wait_for(r"strategy: ps \(.* listening on ports ([\d, ]+) of (.+?)\)$")
    ports = _ports(started.group(1))
    seen = _frozen([run.process.pid], lambda: Snapshot(run.process.pid))
    assert run.finish() == 0, run.text[-6000:]
    assert started.group(2) == "every interface of this machine's network namespace"
    # What the warning says is what /proc shows: these ports, beyond loopback, with an outside.
    assert seen.other_interfaces
    assert {p for _, p in seen.beyond_loopback(ports)} == set(ports), seen.listening
    warnings = [line for line in run.lines if "network: WARNING" in line]
    assert len(warnings) == 1, run.text[-4000:]
    assert (f"listen on every interface, ports {started.group(1)}, reachable from the network "
            f"({', '.join(seen.other_interfaces)})") in warnings[0]
    assert "`network: host` asked for this" in warnings[0]
    assert "private network namespace with loopback only" not in run.text


@pytest.mark.multiprocess
def test_launch_tasks_share_one_private_loopback(outer, tmp_path):
    prefix, isolates = outer
    run = Child(prefix, ["-m", "kerastrain.cli", "launch", PS_RECIPE, "--workers", "1", "--ps",
                         "1", *_sets(TINY + [f"trainer.model_dir={tmp_path}"])])
    run.wait_for(r"^\[chief:0\] kerastrain: strategy: ps")
    pids = {m.group(1): int(m.group(2)) for m in
            re.finditer(r"\[launch\] started (\S+) \(pid (\d+)\)", run.text)}
    assert sorted(pids) == ["chief:0", "ps:0", "worker:0"]

    def read():
        return {name: Snapshot(pid) for name, pid in [("launch", run.process.pid),
                                                      *pids.items()]}
    seen = _frozen([pids["chief:0"]], read)
    with open(f"/proc/{pids['chief:0']}/environ") as f:
        (tf_config,) = [v[len("TF_CONFIG="):] for v in f.read().split("\0")
                        if v.startswith("TF_CONFIG=")]
    cluster = json.loads(tf_config)["cluster"]
    assert run.finish() == 0, run.text[-6000:]
    assert "[launch] job finished: chief:0 exited with 0" in run.text
    assert [o for o in _outer_interfaces(prefix, run) if o != "lo"]
    # Every task's server is listening, each read from that task's own /proc.
    ports = [int(a.rsplit(":", 1)[1]) for addresses in cluster.values() for a in addresses]
    for job, addresses in cluster.items():
        for index, address in enumerate(addresses):
            assert int(address.rsplit(":", 1)[1]) in seen[f"{job}:{index}"].ports()
    if not isolates:
        _refused_and_said_so(run.text, seen["chief:0"], ports, "[launch] ")
    for name, snapshot in seen.items():
        assert snapshot.beyond_loopback() == [], (name, snapshot.interfaces,
                                                  snapshot.beyond_loopback())
    assert len({s.netns for s in seen.values()}) == 1   # one loopback for all
    assert seen["launch"].netns != os.readlink("/proc/self/ns/net")
    assert all(s.interfaces == ["lo"] for s in seen.values())
    assert re.search(r"^\[launch\] network: every task runs in one private network namespace "
                     r"with loopback only .*--network host turns this off$", run.text, re.M)
    assert re.search(r"\[ps:0\] kerastrain: serving ps:0 on port \d+ of every interface of a "
                     r"private network namespace \(loopback only\)", run.text)


# -- the Python API -------------------------------------------------------------------------

API_SCRIPT = """
import kerastrain as kt
{isolate}
import os, signal
from kerastrain import examples

trainer = kt.Trainer(lambda: examples.build_mlp(hidden=16), verbose=0, seed=0,
                     strategy={{"name": "ps", "num_workers": 1, "num_ps": 1{network}}})
print("cluster started", flush=True)
os.kill(os.getpid(), signal.SIGSTOP)   # the test reads /proc, then continues this
trainer.fit(examples.synthetic_dataset_fn(1024, global_batch=64, repeat=True), epochs=1,
            steps_per_epoch=4)
print("trained to step", trainer.global_step, flush=True)
"""


def _api_run(prefix, isolate, network_option=""):
    script = API_SCRIPT.format(isolate=isolate, network=network_option)
    run = Child(prefix, ["-c", script])
    run.wait_for(r"^cluster started$")
    deadline = time.monotonic() + 60
    while _state(run.process.pid) != "T" and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _state(run.process.pid) == "T"
    seen = Snapshot(run.process.pid)
    os.kill(run.process.pid, signal.SIGCONT)
    assert run.finish() == 0, run.text[-6000:]
    assert "trained to step 4" in run.text
    started = re.search(r"strategy: ps \(.* listening on ports ([\d, ]+) of (.+?)\)$", run.text,
                        re.M)
    return run, seen, _ports(started.group(1)), started.group(2)


def _state(pid):
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0]


@pytest.mark.multiprocess
def test_api_isolate_network_keeps_the_in_process_cluster_private(outer):
    prefix, isolates = outer
    run, seen, ports, where = _api_run(prefix, "print('isolated:', kt.isolate_network())")
    assert set(ports) <= seen.ports()
    if not isolates:
        assert "isolated: False" in run.text
        _refused_and_said_so(run.text, seen, ports)
    assert seen.beyond_loopback() == []
    assert "isolated: True" in run.text
    assert seen.interfaces == ["lo"]
    assert where == "every interface of a private network namespace (loopback only)"
    assert "network: WARNING" not in run.text


@pytest.mark.multiprocess
def test_api_without_isolation_warns_in_one_line_with_its_ports(outer):
    prefix, _ = outer
    run, seen, ports, where = _api_run(prefix, "", ', "network": "host"')
    assert seen.other_interfaces and where == "every interface of this machine's network namespace"
    assert {p for _, p in seen.beyond_loopback(ports)} == set(ports), seen.listening
    (warning,) = [line for line in run.lines if "network: WARNING" in line]
    assert f"ports {', '.join(map(str, ports))}, reachable from the network" in warning
    assert "without authentication" in warning and "kerastrain.isolate_network()" in warning


# -- where Linux refuses, or the call comes too late ------------------------------------------

REFUSE = """
import errno
from kerastrain.distribute import network
def refuse(flags):
    raise OSError(errno.{errno}, "{message}")
network._unshare = refuse
"""


def _python(prefix, code, timeout=420):
    return helpers.run_python(prefix[1:] + [sys.executable, "-c", code] if prefix else
                              ["-c", code], timeout=timeout)


def test_refused_unshare_is_one_line_and_changes_nothing(outer):
    code = REFUSE.format(errno="EPERM", message="Operation not permitted") + textwrap.dedent("""
        import os
        import kerastrain
        before = os.readlink("/proc/self/ns/net"), network.interfaces()
        print("isolated:", kerastrain.isolate_network())
        assert (os.readlink("/proc/self/ns/net"), network.interfaces()) == before
    """)
    proc = _python(outer[0], code, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "isolated: False" in proc.stdout
    assert [line for line in proc.stderr.splitlines() if "outer-netns" not in line] == [
        "kerastrain: network: cannot make a private network namespace here ([Errno 1] unshare: "
        "Operation not permitted; user namespaces may be disabled or restricted); an "
        "in-process cluster's servers stay reachable in this machine's network namespace"]


@pytest.mark.multiprocess
def test_cli_run_where_unshare_is_refused_says_so_and_warns(outer, tmp_path):
    code = REFUSE.format(errno="EINVAL", message="Invalid argument") + textwrap.dedent(f"""
        from kerastrain.cli import command as cli
        raise SystemExit(cli.main({["run", PS_RECIPE] + _sets(
            TINY + [f"trainer.model_dir={tmp_path}"])!r}))
    """)
    proc = _python(outer[0], code)
    assert proc.returncode == 0, proc.stderr[-4000:]
    lines = [line for line in proc.stderr.splitlines() if "network:" in line]
    assert len(lines) == 2, proc.stderr[-4000:]
    assert lines[0] == (
        "kerastrain: network: cannot make a private network namespace here ([Errno 22] unshare: "
        "Invalid argument; user namespaces may be disabled or restricted); the local cluster's "
        "servers run in this machine's network namespace")
    assert re.match(r"kerastrain: network: WARNING: the local cluster's servers listen on every "
                    r"interface, ports [\d, ]+, reachable from the network \(.+\): .*Linux "
                    r"refused a private network namespace \(above\)", lines[1])


def test_launch_where_unshare_is_refused_says_so_and_warns(outer):
    code = REFUSE.format(errno="ENOSPC", message="No space left on device") + textwrap.dedent(f"""
        from kerastrain.cli import command as cli
        from kerastrain.cli import launch
        launch.Launcher.run = lambda self: 0   # the job itself is not the point here
        raise SystemExit(cli.main({["launch", PS_RECIPE, "--workers", "1", "--ps", "1"]!r}))
    """)
    proc = _python(outer[0], code, timeout=60)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("[launch] network: cannot make a private network namespace here "
                               "([Errno 28] unshare: No space left on device;"), proc.stdout
    assert re.match(r"\[launch\] network: WARNING: the tasks' servers listen on every interface, "
                    r"ports \d+, \d+, \d+, reachable from the network .*Linux refused", lines[1])


def test_multihost_where_unshare_is_refused_is_one_line_and_no_job(outer):
    """The rehearsal never falls back to one loopback: that would pass for hosts it is not."""
    code = REFUSE.format(errno="EPERM", message="Operation not permitted") + textwrap.dedent(f"""
        from kerastrain.cli import command as cli
        from kerastrain.cli import launch
        def run(self):
            raise AssertionError("a job started on loopback")
        launch.Launcher.run = run
        raise SystemExit(cli.main({["launch", PS_RECIPE, "--workers", "1", "--ps", "1",
                                    "--network", "multihost"]!r}))
    """)
    proc = _python(outer[0], code, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert proc.stdout == ""
    assert [line for line in proc.stderr.splitlines() if "outer-netns" not in line] == [
        "kerastrain: error: --network multihost needs a user and network namespace of its own, "
        "and Linux refused one here ([Errno 1] unshare: Operation not permitted); allow "
        "unprivileged user namespaces, or rehearse with --network private (one loopback)"], \
        proc.stderr


def test_isolate_network_after_numpy_is_a_clear_error(outer):
    proc = _python(outer[0], "import numpy, kerastrain\nkerastrain.isolate_network()",
                   timeout=60)
    assert proc.returncode == 1
    assert ("`isolate_network()` came too late: Linux moves a process into a new namespace only "
            "while it has a single thread") in proc.stderr
    assert "Call it first thing in the script, right after `import kerastrain`." in proc.stderr


# -- the option -----------------------------------------------------------------------------

def test_network_option_is_checked(capsys):
    assert strategies.normalize({"name": "ps", "network": "host"}) == ("ps", {"network": "host"})
    with pytest.raises(ValueError, match=re.escape(
            "Strategy option `network` must be one of ['private', 'host']. "
            "Received: network='off'")):
        strategies.normalize({"name": "ps", "network": "off"})
    with pytest.raises(ValueError, match="Unknown option 'network' for strategy 'mirrored'"):
        strategies.normalize({"name": "mirrored", "network": "host"})
    assert cli.main(["validate", PS_RECIPE, "--set", "strategy.network=false"]) == 2
    assert ("strategy.network: Strategy option `network` must be one of ['private', 'host']. "
            "Received: network=False") in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_:
        cli.main(["launch", PS_RECIPE, "--workers", "1", "--network", "none"])
    assert exit_.value.code == 2
    assert ("argument --network: invalid choice: 'none' (choose from 'private', 'host', "
            "'multihost')") in capsys.readouterr().err


def test_which_commands_isolate():
    no_cluster = {}
    assert strategies.local_cluster_network("ps", no_cluster) == "private"
    assert strategies.local_cluster_network({"name": "parameter_server", "network": "host"},
                                         no_cluster) == "host"
    assert strategies.local_cluster_network("mirrored", no_cluster) is None
    assert strategies.local_cluster_network({"name": "ps", "cluster_resolver": "slurm"},
                                         no_cluster) is None
    tf_config = {"TF_CONFIG": json.dumps({"cluster": {"chief": ["h:1"], "worker": ["h:2"],
                                                      "ps": ["h:3"]},
                                          "task": {"type": "chief", "index": 0}})}
    assert strategies.local_cluster_network("ps", tf_config) is None   # a real cluster: yours
    assert strategies.local_cluster_network({"name": "ps", "network": "off"}, no_cluster) is None


def test_a_recipe_that_needs_the_network_is_refused_before_isolation(capsys):
    assert network.urls({"trainer": {"model_dir": "gs://bucket/runs"}, "data": {"train": {
        "args": {"files": ["file:///data/a", "s3://b/c"]}}}}) == [
        "trainer.model_dir: gs://bucket/runs", "data.train.args.files.1: s3://b/c"]
    assert cli.main(["run", PS_RECIPE, "--set", "trainer.model_dir=gs://bucket/runs"]) == 2
    assert ("kerastrain: error: The cluster runs in a private network namespace with loopback "
            "only, which cannot reach what the recipe names: trainer.model_dir: "
            "gs://bucket/runs. Use local paths, or the strategy option `network: host` (--set "
            "strategy.network=host) (the cluster's unauthenticated servers are then reachable "
            "from the network).") in capsys.readouterr().err
    # (gs:// again: the recipe's check, first, says that s3:// needs tensorflow-io.)
    assert cli.main(["launch", PS_RECIPE, "--workers", "1", "--ps", "1", "--set",
                     "trainer.model_dir=gs://bucket/other"]) == 2
    assert "which cannot reach what the recipe names: trainer.model_dir: gs://bucket/other. " \
        "Use local paths, or --network host" in capsys.readouterr().err

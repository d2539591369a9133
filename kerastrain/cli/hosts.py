"""`kerastrain launch --network multihost`: every task a host of its own, on one machine.

A real cluster is hosts that share nothing but a network (and the storage they mount): each has
its own address, host name, `/tmp` and disk. A local cluster on one loopback hides every bug
that comes from that: a worker reading a file only the chief wrote, a server advertising
`localhost`, a port two tasks agree on by luck. This mode rehearses the real thing:

- The launcher moves into a user + network namespace of its own (`kerastrain.distribute.network`) and
  makes a bridge there, `kt0`, 198.18.0.1/24 (198.18.0.0/15 is set aside for benchmark networks
  and never routed). Nothing it makes is visible outside, and nothing leaves the machine.
- Each task starts in `python -m kerastrain.cli.hosts`, which moves into new network, mount and
  UTS namespaces, waits while the launcher plugs a veth pair into the bridge, takes its address
  and host name (`worker-1`, ...), and then runs the task:
  - `/etc/hosts` names every host, so `TF_CONFIG` names hosts, not 127.0.0.1, and every
    server listens on the same port of its own address, as on a cluster;
  - `/tmp` and the working directory are overlays: the task reads what was on this machine
    when it started (as a container reads its image) and what it writes stays its own;
  - only `model_dir` (shared storage on a cluster) is the same directory for every host.
- Faults act on a host: freeze (SIGSTOP), kill, and partition (its link to the bridge down).

Only the Python standard library and the `ip` command (iproute2): the task side runs before
anything else is imported, in a process with a single thread.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import json
import os
import shutil
import subprocess
import sys
import tempfile

from kerastrain.distribute import network as network_lib

MULTIHOST = "multihost"
BRIDGE = "kt0"
NET = "198.18.0."           # a /24 of 198.18.0.0/15 (RFC 2544: benchmark networks, unrouted)
GATEWAY = NET + "1"         # the bridge, in the launcher's namespace
FIRST_HOST = 2
PORT = 2222                 # every host's TensorFlow server, as on a cluster
SERVICE_PORT = 5050         # the tf.data service's servers
READY_SECS = 60.0

_CLONE_NEWNS = 0x00020000
_CLONE_NEWUTS = 0x04000000
_CLONE_NEWNET = 0x40000000
_MS_BIND, _MS_REC, _MS_PRIVATE = 0x1000, 0x4000, 0x40000


class Refused(RuntimeError):
    """Linux (or this machine) cannot make the hosts: the message says which step and why."""


def host_name(task_type: str, index: int) -> str:
    """A task's host name: letters, digits and dashes, as DNS wants (`data_worker` 0 ->
    `data-worker-0`)."""
    return f"{task_type.replace('_', '-')}-{index}"


def ip_command() -> str:
    found = shutil.which("ip") or next(
        (p for p in ("/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip") if os.path.exists(p)), None)
    if not found:
        raise Refused("the multihost network needs the `ip` command (iproute2), and this "
                      "machine has none on PATH; install iproute2")
    return found


def _ip(*args) -> None:
    done = subprocess.run([ip_command(), *args], capture_output=True, text=True)
    if done.returncode:
        raise Refused(f"`ip {' '.join(args)}` failed: {done.stderr.strip() or done.returncode}")


def _libc():
    return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


def _check(result: int, what: str) -> None:
    if result != 0:
        code = ctypes.get_errno()
        raise Refused(f"{what}: {os.strerror(code)}")


class Hosts:
    """The launcher's side: the bridge, the host names and addresses, the links, the faults.

    Args:
        names: every task's host name, in a fixed order (a host keeps its address across
            restarts of its task).
        shared: absolute paths every host sees as one (model_dir).
    """

    vanish_with_task = True   # a host's network namespace ends with its task

    def __init__(self, names, shared=()):
        if len(names) > 250:
            raise ValueError(f"A multihost rehearsal has at most 250 hosts. Received: "
                             f"{len(names)} tasks")
        self.addresses = {name: f"{NET}{FIRST_HOST + i}" for i, name in enumerate(names)}
        self.shared = [os.path.abspath(p) for p in shared]
        self.stage = tempfile.mkdtemp(prefix="kerastrain-hosts-")
        self._links = {}       # host -> the bridge end of its current veth pair
        self._down = set()     # hosts partitioned now
        self._made = 0
        with open(os.path.join(self.stage, "hosts"), "w") as f:
            f.write("127.0.0.1 localhost\n::1 localhost\n")
            f.write("".join(f"{address} {name}\n" for name, address in self.addresses.items()))

    def build(self) -> None:
        """The bridge, in the launcher's own network namespace (where it is root)."""
        _ip("link", "add", BRIDGE, "type", "bridge")
        _ip("addr", "add", f"{GATEWAY}/24", "dev", BRIDGE)
        _ip("link", "set", BRIDGE, "up")

    def popen(self, name, command, **kwargs) -> subprocess.Popen:
        """Start `command` as host `name`: in its own namespaces, plugged into the bridge."""
        ready_r, ready_w = os.pipe()
        go_r, go_w = os.pipe()
        spec = {"name": name, "address": self.addresses[name], "fds": [ready_w, go_r],
                "hosts": os.path.join(self.stage, "hosts"), "shared": self.shared,
                "scratch": os.path.join(self.stage, f"{name}.{self._made}"),
                "workdir": os.getcwd()}
        os.makedirs(spec["scratch"])
        wrapped = [sys.executable, "-m", "kerastrain.cli.hosts", json.dumps(spec), "--", *command]
        try:
            process = subprocess.Popen(wrapped, pass_fds=(ready_w, go_r), **kwargs)
        finally:
            os.close(ready_w)
            os.close(go_r)
        try:
            if _read_byte(ready_r, READY_SECS) == b"r":
                self._plug(name, process.pid)
                os.write(go_w, b"g")
            # else: it failed before unsharing, and says why in its output
        finally:
            os.close(ready_r)
            os.close(go_w)
        return process

    def _plug(self, name, pid) -> None:
        """Join host `name`'s new namespace to the bridge, as the same machine rebooted: its
        address and its hardware address as before, the link of its previous task removed
        first. A namespace outlives its last process until the kernel cleans it up (seconds
        on a loaded machine); while it did, the old link still answered for the host's
        address, and a restarted job's chief reached the dead ps:0 there ("Connection
        refused", the job lost). Peers that cached the old hardware address reach the new
        task at once."""
        previous = self._links.pop(name, None)
        if previous is not None:
            try:
                _ip("link", "del", previous)   # both ends of the pair go, at once
            except Refused:
                pass   # the kernel had already removed it with its namespace
        self._made += 1
        outer = f"kt{self._made}"
        last = int(self.addresses[name].rsplit(".", 1)[1])
        _ip("link", "add", outer, "type", "veth", "peer", "name", "eth0",
            "address", f"02:6b:74:00:00:{last:02x}", "netns", str(pid))
        _ip("link", "set", outer, "master", BRIDGE)
        if name not in self._down:
            _ip("link", "set", outer, "up")
        self._links[name] = outer

    def partition(self, name, cut: bool) -> None:
        """Cut host `name` off the network (its link down), or join it again."""
        (self._down.add if cut else self._down.discard)(name)
        link = self._links.get(name)
        if link is not None:
            try:
                _ip("link", "set", link, "down" if cut else "up")
            except Refused:
                pass  # its task ended and took the link with it: the next one starts as asked

    def close(self) -> None:
        shutil.rmtree(self.stage, ignore_errors=True)


def _read_byte(fd, timeout) -> bytes:
    import select
    readable, _, _ = select.select([fd], [], [], timeout)
    return os.read(fd, 1) if readable else b""


# -- the task's side: `python -m kerastrain.cli.hosts SPEC -- COMMAND...` ------------------------

def _become_host(spec) -> None:
    libc = _libc()
    ready, go = spec["fds"]
    _check(libc.unshare(ctypes.c_int(_CLONE_NEWNET | _CLONE_NEWNS | _CLONE_NEWUTS)),
           "unshare(network, mount, UTS namespaces)")
    os.write(ready, b"r")
    os.close(ready)
    if os.read(go, 1) != b"g":
        raise Refused("the launcher did not plug this host into its bridge")
    os.close(go)
    network_lib._loopback_up()
    _ip("addr", "add", f"{spec['address']}/24", "dev", "eth0")
    _ip("link", "set", "eth0", "up")
    name = spec["name"].encode()
    _check(libc.sethostname(name, ctypes.c_size_t(len(name))), "sethostname")
    _own_files(libc, spec)


def _mount(libc, source, target, fstype, flags, data, what):
    _check(libc.mount(source and source.encode(), target.encode(), fstype and fstype.encode(),
                      ctypes.c_ulong(flags), data and data.encode()), what)


def _own_files(libc, spec) -> None:
    """Private overlays of /tmp and the working directory; model_dir and /etc/hosts bound."""
    _mount(libc, None, "/", None, _MS_REC | _MS_PRIVATE, None, "making mounts private")
    # The real shared directories, held open: the overlays below hide their paths.
    shared = [(path, os.open(path, os.O_PATH | os.O_DIRECTORY)) for path in spec["shared"]
              if os.path.isdir(path)]
    hosts = os.open(spec["hosts"], os.O_PATH)
    scratch = spec["scratch"]
    _mount(libc, "tmpfs", scratch, "tmpfs", 0, "mode=0700", f"a tmpfs on {scratch}")
    workdir = spec["workdir"]
    # /tmp last: its overlay hides the scratch tmpfs (under /tmp) that every upper lives on.
    private = ([workdir] if not _under(workdir, "/tmp") and workdir != "/" else []) + ["/tmp"]
    for i, root in enumerate(private):
        upper, work = os.path.join(scratch, f"{i}.upper"), os.path.join(scratch, f"{i}.work")
        os.mkdir(upper)
        os.mkdir(work)
        beneath = [p for p in mounts_beneath(root) if not _under(p, scratch)]  # not ours
        _mount(libc, "overlay", root, "overlay", 0,
               f"lowerdir={root},upperdir={upper},workdir={work}", f"an overlay on {root}" + (
                   f" (Linux refuses it in a user namespace while other file systems are mounted "
                   f"beneath {root}: {', '.join(beneath[:3])}; unmount them for the rehearsal)"
                   if beneath else ""))
    for path, fd in shared:
        os.makedirs(path, exist_ok=True)
        _mount(libc, f"/proc/self/fd/{fd}", path, None, _MS_BIND | _MS_REC, None,
               f"binding the shared {path}")
        os.close(fd)
    # Temporary files (TMPDIR) on a tmpfs of their own: in a user namespace an overlay
    # refuses to rename a directory at its top (EXDEV), which no host's /tmp does.
    temporary = os.path.join("/tmp", f".kerastrain-host-{spec['name']}")
    os.makedirs(temporary, exist_ok=True)
    _mount(libc, "tmpfs", temporary, "tmpfs", 0, "mode=1777", f"a tmpfs on {temporary}")
    os.environ["TMPDIR"] = temporary
    _mount(libc, f"/proc/self/fd/{hosts}", "/etc/hosts", None, _MS_BIND, None,
           "binding /etc/hosts")
    os.close(hosts)
    os.chdir(workdir)  # into the overlay now on it


def mounts_beneath(root) -> list[str]:
    """Mount points strictly beneath `root` in this process's view (/proc/self/mountinfo)."""
    try:
        with open("/proc/self/mountinfo") as f:
            points = [line.split()[4].encode().decode("unicode_escape") for line in f]
    except OSError:
        return []
    return [p for p in points if p != root and _under(p, root)]


def _under(path, root) -> bool:
    return os.path.commonpath([os.path.abspath(path), root]) == root


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) < 3 or argv[1] != "--":
        print("usage: python -m kerastrain.cli.hosts SPEC -- COMMAND... (started by `kerastrain "
              "launch --network multihost`)", file=sys.stderr)
        return 2
    spec, command = json.loads(argv[0]), argv[2:]
    import kerastrain  # loaded with this module: it sets TensorFlow's log level for itself
    if not kerastrain._TF_LOG_LEVEL_SET_BY_USER:
        os.environ.pop("TF_CPP_MIN_LOG_LEVEL", None)  # the task's command line decides
    try:
        _become_host(spec)
    except (Refused, OSError) as e:
        print(f"kerastrain: multihost: host {spec['name']} could not be made: {e}",
              file=sys.stderr, flush=True)
        return 2
    os.execv(command[0], command)
    return 127  # not reached


if __name__ == "__main__":
    raise SystemExit(main())

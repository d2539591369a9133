"""Private network namespaces for local clusters: TensorFlow's servers listen on every interface.

TensorFlow's gRPC server binds `0.0.0.0:port` (hard-coded in `grpc_server_lib.cc`, no option in
TensorFlow 2.16-2.21) and runs any graph it is sent, without authentication. A local cluster's
servers are therefore reachable by anyone who can reach the machine. Linux can give a process a
network namespace of its own whose only interface is loopback (an unprivileged user namespace
plus a network namespace, like `unshare -rn`); listening on every interface there reaches no one
else. A process can only move there while it has a single thread, i.e. before NumPy, TensorFlow
or Keras are imported, so the command line does it first thing and scripts call
`isolate_network()` at their top.

Only the Python standard library: this runs before anything else is imported.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import fcntl
import logging
import os
import re
import socket
import struct
import sys

logger = logging.getLogger("kerastrain")

# Values of the strategy option `network` (and `kerastrain launch --network`).
PRIVATE, HOST = "private", "host"
NETWORKS = (PRIVATE, HOST)

_CLONE_NEWUSER = 0x10000000
_CLONE_NEWNET = 0x40000000
_SIOCGIFFLAGS, _SIOCSIFFLAGS, _IFF_UP = 0x8913, 0x8914, 0x1
_IFREQ = "16sh22x"  # struct ifreq: the name, then ifr_flags in a 24-byte union

# Said once a namespace is made, by whoever made it: what no longer works inside.
INSIDE = ("outgoing network does not work inside (a gs:// or s3:// model_dir, downloads, remote "
          "hosts, a tf.data service elsewhere)")


class TooLate(RuntimeError):
    """The process already runs several threads, so Linux will not move it (EINVAL)."""


def interfaces(pid="self") -> list[str]:
    """The network interfaces of a process's network namespace (`/proc/PID/net/dev`)."""
    with open(f"/proc/{pid}/net/dev") as f:
        return [line.split(":", 1)[0].strip() for line in f.readlines()[2:] if ":" in line]


# Set by `kerastrain.cli.hosts` in a task of a multihost rehearsal: its one other interface joins
# the launcher's private bridge, so nothing outside the rehearsal can reach its servers.
REHEARSAL_HOST = "KERASTRAIN_REHEARSAL_HOST"


def exposed_interfaces(pid="self") -> list[str]:
    """Interfaces other than loopback: what a server listening on 0.0.0.0 is reachable through."""
    if pid == "self" and os.environ.get(REHEARSAL_HOST):
        return []
    try:
        return [name for name in interfaces(pid) if name != "lo"]
    except OSError:  # not Linux, or no /proc: assume the worst
        return ["interfaces unknown"]


def threads() -> int:
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return 1


def _unshare(flags: int) -> None:
    """`unshare(2)` through libc (`os.unshare` arrives in Python 3.12)."""
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    if libc.unshare(ctypes.c_int(flags)) != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))


def _write(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def _identity_map(kind: str) -> str:
    """Every id this namespace knows, mapped to itself (`kind` is "uid" or "gid")."""
    with open(f"/proc/self/{kind}_map") as f:
        ranges = [line.split() for line in f if line.strip()]
    return "".join(f"{first} {first} {count}\n" for first, _, count in ranges)


def _map_own_ids(uid: int, gid: int, root: bool = False) -> None:
    """Map this process's own uid and gid (read before unshare) to themselves, or to root
    (0) inside with `root`: a process that is not root inside loses its capabilities in the
    namespace at `execve`, so the commands it runs (`ip`) could not configure it.

    That is all an unprivileged user may write.
    """
    inside_uid, inside_gid = (0, 0) if root else (uid, gid)
    _write("/proc/self/uid_map", f"{inside_uid} {uid} 1\n")
    _write("/proc/self/setgroups", "deny")  # required before an unprivileged gid_map
    _write("/proc/self/gid_map", f"{inside_gid} {gid} 1\n")


def _loopback_up() -> None:
    # A new network namespace starts with `lo` down.
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        request = struct.pack(_IFREQ, b"lo", 0)
        flags = struct.unpack(_IFREQ, fcntl.ioctl(s, _SIOCGIFFLAGS, request))[1]
        fcntl.ioctl(s, _SIOCSIFFLAGS, struct.pack(_IFREQ, b"lo", flags | _IFF_UP))


def _step(name, fn, *args):
    try:
        return fn(*args)
    except OSError as e:
        raise OSError(e.errno, f"{name}: {e.strerror or e}") from None


def _probe(root: bool = False) -> str | None:
    """Try the whole move in a throw-away child; None if it works, else why not.

    The move cannot be undone, and a namespace whose loopback stayed down would break the
    cluster, so nothing is changed here unless every step worked there.
    """
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover (the child's exit code and message are the result)
        code = 1
        try:
            os.close(read)
            uid, gid = os.geteuid(), os.getegid()  # unmapped (65534) once unshared
            _step("unshare", _unshare, _CLONE_NEWUSER | _CLONE_NEWNET)
            _step("writing the uid/gid maps", _map_own_ids, uid, gid, root)
            _step("bringing up loopback", _loopback_up)
            code = 0
        except BaseException as e:  # noqa: BLE001 - every failure is reported to the parent
            os.write(write, str(e).encode(errors="replace")[:500])
        finally:
            os._exit(code)
    os.close(write)
    message = b""
    while chunk := os.read(read, 512):
        message += chunk
    os.close(read)
    _, status = os.waitpid(pid, 0)
    if os.waitstatus_to_exitcode(status) == 0:
        return None
    return message.decode(errors="replace") or f"the probe exited with status {status}"


def _enter(root: bool = False) -> None:
    """Move this single-threaded process into a new user + network namespace, loopback up.

    A helper forked beforehand stays outside and maps every id of this namespace to itself
    (possible for root only): root then keeps access to files owned by other users, e.g. a
    bind-mounted model_dir. Otherwise the process maps only its own uid and gid, which is all
    an unprivileged user may do and all its own files need.
    """
    go_read, go_write = os.pipe()
    helper = os.fork()
    if helper == 0:  # pragma: no cover
        code = 1
        try:
            os.close(go_write)
            if os.read(go_read, 1) == b"1":
                parent = os.getppid()
                _write(f"/proc/{parent}/uid_map", _identity_map("uid"))
                _write(f"/proc/{parent}/gid_map", _identity_map("gid"))
                code = 0
        except BaseException:  # noqa: BLE001 - the parent maps its own ids instead
            pass
        finally:
            os._exit(code)
    os.close(go_read)
    uid, gid = os.geteuid(), os.getegid()  # unmapped (65534) once unshared
    try:
        _step("unshare", _unshare, _CLONE_NEWUSER | _CLONE_NEWNET)
    except OSError:
        os.write(go_write, b"0")
        os.close(go_write)
        os.waitpid(helper, 0)
        raise
    os.write(go_write, b"1")
    os.close(go_write)
    _, status = os.waitpid(helper, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        _step("writing the uid/gid maps", _map_own_ids, uid, gid, root)
    _step("bringing up loopback", _loopback_up)


# Why Linux refused to isolate this process, once it did (the exposure warning then says so).
_refused: str | None = None
REFUSED_ADVICE = ("Linux refused a private network namespace (above): allow unprivileged user "
                  "namespaces, or firewall these ports")


def try_isolate(root: bool = False) -> str | None:
    """Isolate this process; None when it worked (or was already so), else why not.

    With `root`, the process is root in the new user namespace (a multihost launcher, whose
    `ip` commands need the namespace's capabilities after `execve`), and it moves even when
    it already has loopback only.

    Raises:
        TooLate: the process already runs other threads.
    """
    if not exposed_interfaces() and not root:
        return None  # already alone with loopback (a container without network, launch's tasks)
    if not sys.platform.startswith("linux"):
        return f"network namespaces are Linux only, this is {sys.platform}"
    count = threads()
    if count > 1:
        raise TooLate(
            "Linux moves a process into a new namespace only while it has a single thread, and "
            f"this one already runs {count} (NumPy, TensorFlow and Keras start threads when "
            "imported)")
    refused = _probe(root)
    if refused is not None:
        global _refused
        _refused = refused
        return refused
    try:
        _enter(root)
    except OSError as e:  # the probe worked, so this is unexpected: say where it stopped
        raise RuntimeError(
            f"Moving into a private network namespace failed half way ({e}); this process "
            "cannot run a local cluster. Turn isolation off with the strategy option "
            "`network: host`.") from None
    return None


def fallback_line(why: str, servers: str) -> str:
    """The one line said when Linux refuses: why, and what it means for the servers."""
    return (f"network: cannot make a private network namespace here ({why}; user namespaces "
            f"may be disabled or restricted); {servers} in this machine's network namespace")


def isolate_network() -> bool:
    """Move this process into a private network namespace whose only interface is loopback.

    TensorFlow's servers listen on every interface and accept anyone. Called first thing in a
    script, before NumPy, TensorFlow or Keras are imported, this keeps an in-process
    parameter-server cluster (`strategy="ps"` without `TF_CONFIG`) out of reach of the network.
    Inside, loopback works and files are unaffected; outgoing network does not (a `gs://`
    model_dir, downloads, remote hosts).

    Example:
        >>> import kerastrain
        >>> kerastrain.isolate_network()   # first thing, before numpy/tensorflow/keras
        True
        >>> import keras  # then as usual

    Returns:
        True when the process now runs with loopback only (also when it already did); False
        when Linux refuses (user namespaces disabled or restricted), which is logged in one line.

    Raises:
        RuntimeError: called too late, when the process already runs several threads.
    """
    from kerastrain import _logging
    _logging.ensure_visible()
    was_private = not exposed_interfaces()
    try:
        why = try_isolate()
    except TooLate as e:
        raise TooLate(f"`isolate_network()` came too late: {e}. Call it first thing in the "
                      "script, right after `import kerastrain`.") from None
    if why is not None:
        logger.warning(fallback_line(why, "an in-process cluster's servers stay reachable"))
        return False
    if not was_private:
        logger.info("network: this process now runs in a private network namespace with "
                    "loopback only; %s", INSIDE)
    return True


_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")
# Schemes TensorFlow serves from this process alone (its in-memory file system included).
_LOCAL_SCHEMES = ("file://", "ram://")


def urls(tree, path=()) -> list[str]:
    """`key: value` of every URL in a recipe tree but file:// and ram://: what needs the
    outer network.

    A private namespace has its own loopback too, so even a service on this machine's
    localhost is out of reach from inside.
    """
    if isinstance(tree, dict):
        return [u for key, value in tree.items() for u in urls(value, path + (str(key),))]
    if isinstance(tree, list):
        return [u for i, value in enumerate(tree) for u in urls(value, path + (str(i),))]
    if isinstance(tree, str) and _URL.match(tree) and not tree.lower().startswith(_LOCAL_SCHEMES):
        return [f"{'.'.join(path)}: {tree}"]
    return []


def check_no_urls(tree, opt_out: str) -> None:
    """Refuse, before anything starts, a private namespace for a recipe that needs the network.

    Raises:
        ValueError: the recipe names remote storage or services (gs://, s3://, grpc://, ...).
    """
    found = urls(tree)
    if found:
        raise ValueError(
            "The cluster runs in a private network namespace with loopback only, which cannot "
            f"reach what the recipe names: {'; '.join(found)}. Use local paths, or {opt_out} "
            "(the cluster's unauthenticated servers are then reachable from the network).")


def isolate_for(tree: dict, *, mode, opt_out: str) -> bool:
    """From the command line: isolate when a recipe's strategy starts a local cluster.

    `tree` is the recipe, unvalidated; `mode` is `strategies.local_cluster_network` of its
    strategy (None: no local cluster). Logs one line either way: where the cluster runs and
    what stops working inside, or why Linux refused. `opt_out` says how to turn isolation off.

    Raises:
        ValueError: isolation is on and the recipe names URLs the namespace cannot reach.
    """
    if mode != PRIVATE:
        return False
    check_no_urls(tree, opt_out)
    if not exposed_interfaces():
        return False
    from kerastrain import _logging
    _logging.ensure_visible()
    global _refused
    try:
        why = try_isolate()
    except TooLate as e:
        why = _refused = str(e)
    if why is not None:
        logger.warning(fallback_line(why, "the local cluster's servers run"))
        return False
    logger.info(isolated_line(opt_out))
    return True


def isolated_line(opt_out: str) -> str:
    """The one line said once a local cluster runs isolated: what that means, how to undo it."""
    return (f"network: the local cluster runs in a private network namespace with loopback only "
            f"(its TensorFlow servers accept anyone who can reach them); {INSIDE}; {opt_out} "
            "turns this off")


def exposure_line(ports, how: str, who: str = "the local cluster's servers") -> str | None:
    """The one-line warning for servers listening on `ports` of every interface, or None.

    None when the namespace has no interface but loopback: then nobody else can reach them.
    `how` says how to avoid it.
    """
    exposed = exposed_interfaces()
    if not exposed:
        return None
    listed = ", ".join(str(p) for p in ports)
    return (f"network: WARNING: {who} listen on every interface, ports "
            f"{listed}, reachable from the network ({', '.join(exposed)}): TensorFlow runs any "
            f"graph sent to them, without authentication; {how}")


def avoid_in_process(network: str) -> str:
    """How a user of the in-process cluster avoids the exposure (for `exposure_line`)."""
    if network == HOST:
        return ("`network: host` asked for this; without it, `kerastrain run` isolates the "
                "cluster, and a script can call kerastrain.isolate_network() first thing")
    if _refused:
        return REFUSED_ADVICE
    return ("to avoid it, train with `kerastrain run`, or call kerastrain.isolate_network() "
            "first thing in the script, before importing numpy, tensorflow or keras")


def where(pid="self") -> str:
    """How a log line truthfully names the servers' reach."""
    if pid == "self" and os.environ.get(REHEARSAL_HOST):
        return (f"every interface of rehearsal host {os.environ[REHEARSAL_HOST]} (loopback and "
                "the rehearsal's private bridge)")
    if exposed_interfaces(pid):
        return "every interface of this machine's network namespace"
    return "every interface of a private network namespace (loopback only)"

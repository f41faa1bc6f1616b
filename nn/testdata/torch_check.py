"""Runs the PyTorch twins of Starling's models (chargpt.py,
classifiers.py) on weights Starling saved, for nn's TestTorchParity.

Reads a JSON request on stdin,

    {"jobs": [{"name": "cnn", "weights": path, "n": samples,
               "model": {"kind": "cnn", "h": 28, "w": 28, "c": 1, "classes": 10},
               "x": [flat inputs], "y": [flat targets]}, ...]}

where kind is "charlm" (the rest of "model" is chargpt.GPT's arguments;
x holds token ids), "mlp" ("widths") or "cnn" (x is channels last, as
Starling's images are). Prints {name: {"logits": [flat], "loss": mean
cross-entropy}} as JSON. Needs only torch (the safetensors file is
parsed here, so the safetensors package is not needed); every state dict
is loaded strictly, so every name and shape must match."""
import json
import struct
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, __file__.rsplit("/", 1)[0])
import classifiers  # noqa: E402
from chargpt import GPT  # noqa: E402


def load_safetensors(path):
    """A safetensors file of F32 tensors as a state dict: an 8-byte
    little-endian header length, a JSON header, then the raw data."""
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    body = raw[8 + n:]
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        assert e["dtype"] == "F32", e
        lo, hi = e["data_offsets"]
        t = torch.frombuffer(bytearray(body[lo:hi]), dtype=torch.float32)
        out[name] = t.reshape(e["shape"])
    return out


def run(job):
    spec = dict(job["model"])
    kind = spec.pop("kind")
    n = job["n"]
    y = torch.tensor(job["y"], dtype=torch.long)
    if kind == "charlm":
        model = GPT(**spec)
        x = torch.tensor(job["x"], dtype=torch.long).reshape(n, -1)
    elif kind == "mlp":
        model = classifiers.mlp(spec["widths"])
        x = torch.tensor(job["x"], dtype=torch.float32).reshape(n, -1)
    elif kind == "cnn":
        model = classifiers.cnn(spec["h"], spec["w"], spec["c"], spec["classes"])
        x = torch.tensor(job["x"], dtype=torch.float32).reshape(n, spec["h"], spec["w"], spec["c"])
        x = classifiers.nchw(x)
    else:
        raise ValueError(f"unknown model kind {kind!r}")
    model.load_state_dict(load_safetensors(job["weights"]), strict=True)
    model.eval()
    with torch.no_grad():
        logits = model(x)
        loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), y)
    return {"logits": logits.reshape(-1).tolist(), "loss": loss.item()}


def main():
    req = json.load(sys.stdin)
    json.dump({job["name"]: run(job) for job in req["jobs"]}, sys.stdout)


if __name__ == "__main__":
    main()

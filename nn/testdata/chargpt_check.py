"""Runs chargpt.GPT on weights a Starling CharLM saved, for nn's
TestTorchParity: reads a JSON request on stdin ({"weights": path,
"config": {...}, "x": [[ids]], "y": [[ids]]}) and prints the logits and
the mean next-token loss as JSON. Needs only torch (the safetensors file
is parsed here, so the safetensors package is not needed); the state dict
is loaded strictly, so every name and shape must match."""
import json
import struct
import sys

import torch

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from chargpt import GPT  # noqa: E402


def load_safetensors(path):
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


def main():
    req = json.load(sys.stdin)
    model = GPT(**req["config"]).eval()
    model.load_state_dict(load_safetensors(req["weights"]), strict=True)
    x = torch.tensor(req["x"], dtype=torch.long)
    y = torch.tensor(req["y"], dtype=torch.long)
    with torch.no_grad():
        logits, loss = model(x, y)
    json.dump({"logits": logits.reshape(-1).tolist(), "loss": loss.item()}, sys.stdout)


if __name__ == "__main__":
    main()

"""Unit tests of the starling package. The tests that talk to `peer serve`
need STARLING_PEER (the Go test TestServePythonUnit builds the binary and
sets it); the torch tests need torch. Run: python3 -m unittest discover
-s python/tests."""

import os
import sys
import unittest

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import starling  # noqa: E402
from starling.client import _copy_in, _copy_out  # noqa: E402

try:
    import torch
except ImportError:  # the numpy-only tests still run
    torch = None

LOOPBACK = ["--mdns=false", "--listen", "/ip4/127.0.0.1/tcp/0"]
need_peer = unittest.skipUnless(os.environ.get("STARLING_PEER"), "STARLING_PEER not set (the Go test sets it)")
need_torch = unittest.skipUnless(torch is not None, "torch not importable")


class CopyTest(unittest.TestCase):
    def test_numpy_roundtrip_converts_float64(self):
        buf = np.zeros(6, dtype=np.float32)
        x = np.arange(6, dtype=np.float64).reshape(2, 3) / 4
        _copy_in(buf, x)
        self.assertEqual(buf.tolist(), [0, 0.25, 0.5, 0.75, 1.0, 1.25])
        y = np.zeros((2, 3))
        _copy_out(y, buf * 2, [2, 3])
        self.assertEqual(y.tolist(), [[0, 0.5, 1], [1.5, 2, 2.5]])

    @need_torch
    def test_torch_noncontiguous_and_bf16(self):
        buf = np.zeros(6, dtype=np.float32)
        x = torch.arange(6, dtype=torch.float32).reshape(3, 2).t()  # not contiguous
        _copy_in(buf, x)
        self.assertEqual(buf.tolist(), [0, 2, 4, 1, 3, 5])
        z = torch.zeros(2, 3, dtype=torch.bfloat16)
        _copy_out(z, buf, [2, 3])
        self.assertEqual(z.float().flatten().tolist(), [0, 2, 4, 1, 3, 5])


class FakeClient:
    """Averages with one other peer whose tensors are zero: x → x/2."""

    def __init__(self):
        self.calls = []

    def allreduce(self, tensors, rule=None, codec=None, weight=1.0, timeout_s=None):
        self.calls.append([t.detach().clone() for t in tensors])
        with torch.no_grad():
            for t in tensors:
                t.mul_(0.5)
        return {"round": len(self.calls)}


@need_torch
class GradAveragerTest(unittest.TestCase):
    def test_hook_averages_after_backward_once(self):
        from starling.train import GradAverager

        torch.manual_seed(0)
        m = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 2))
        x = torch.randn(5, 4)
        m(x).square().sum().backward()
        want = [p.grad.clone() for p in m.parameters()]
        m.zero_grad()
        fake = FakeClient()
        GradAverager(m, fake)
        m(x).square().sum().backward()
        self.assertEqual(len(fake.calls), 1)  # one bucket per backward
        for sent, w, p in zip(fake.calls[0], want, m.parameters()):
            self.assertTrue(torch.allclose(sent, w))  # every grad complete when sent
            self.assertTrue(torch.allclose(p.grad, w / 2))
        m.zero_grad()
        m(x).square().sum().backward()
        self.assertEqual(len(fake.calls), 2)


@need_torch
class DiLoCoTest(unittest.TestCase):
    def test_outer_step_is_nesterov_on_mean_delta(self):
        from starling.train import DiLoCo

        p = torch.nn.Parameter(torch.tensor([1.0, 2.0]))
        m = torch.nn.Module()
        m.p = p
        fake = FakeClient()
        o = DiLoCo(m, fake, lr=0.5, momentum=0.9)
        with torch.no_grad():
            p.sub_(torch.tensor([0.4, -0.2]))  # inner steps moved θ by −Δ
        o.step()
        d = torch.tensor([0.2, -0.1])  # the mean delta (the fake averages with 0)
        v = d  # v = 0.9·0 + d
        want = torch.tensor([1.0, 2.0]) - 0.5 * (d + 0.9 * v)
        self.assertTrue(torch.allclose(p.detach(), want), (p, want))
        self.assertTrue(torch.allclose(o.anchor[0], want))
        with torch.no_grad():
            p.sub_(torch.tensor([0.4, -0.2]))
        o.step()
        v2 = 0.9 * v + d
        want2 = want - 0.5 * (d + 0.9 * v2)
        self.assertTrue(torch.allclose(p.detach(), want2), (p, want2))


class FakeAsync:
    """Another peer announced the model [10, 10] at version 1."""

    def __init__(self):
        self.announced, self.queue = [], [([10.0, 10.0], 1)]

    def announce(self, tensors, version, samples=1, **kw):
        self.announced.append(([t.tolist() for t in tensors], version))

    def next_announced(self, tensors, timeout_s=30.0):
        if not self.queue:
            raise starling.StarlingError("none", "timeout")
        vals, v = self.queue.pop(0)
        tensors[0].copy_(torch.tensor(vals))
        return {"peer": "p", "version": v, "base": 0, "samples": 1, "kind": "model"}


@need_torch
class FedAsyncTest(unittest.TestCase):
    def test_mixes_with_staleness_weight(self):
        from starling.train import FedAsync

        m = torch.nn.Module()
        m.p = torch.nn.Parameter(torch.tensor([0.0, 2.0]))
        fake = FakeAsync()
        f = FedAsync(m, fake, alpha=0.6, a=0.5)
        f.version = 3  # this peer is at 4 once it publishes: τ = 3
        self.assertEqual(f.step(), 1)
        self.assertEqual(fake.announced, [([[0.0, 2.0]], 4)])
        w = 0.6 * 4 ** -0.5
        want = torch.tensor([0.0, 2.0]) * (1 - w) + w * 10
        self.assertTrue(torch.allclose(m.p.detach(), want), (m.p, want))
        self.assertEqual(f.step(), 0)  # nothing new: no mixing


@need_torch
class FedBuffTest(unittest.TestCase):
    def test_applies_the_mean_of_k_deltas(self):
        from starling.train import FedBuff

        m = torch.nn.Module()
        m.p = torch.nn.Parameter(torch.tensor([1.0, 1.0]))
        fake = FakeAsync()
        fake.queue = []
        f = FedBuff(m, fake, k=2, server_lr=1.0, a=0.5)
        with torch.no_grad():
            m.p.add_(torch.tensor([2.0, 0.0]))  # local delta [2, 0]
        f.step()  # one delta buffered: the model goes back to its base
        self.assertEqual(m.p.tolist(), [1.0, 1.0])
        self.assertEqual(fake.announced[0][1], 1)
        fake.queue = [([0.0, 4.0], 1)]
        fake.next_announced = self._delta(fake.next_announced)
        with torch.no_grad():
            m.p.add_(torch.tensor([0.0, 0.0]))
        f.step()  # own zero delta + the other's [0, 4] (τ = 0): k = 3 ≥ 2
        want = torch.tensor([1.0, 1.0]) + (torch.tensor([2.0, 0.0]) + torch.tensor([0.0, 4.0])) / 3
        self.assertTrue(torch.allclose(m.p.detach(), want), (m.p, want))
        self.assertEqual(f.applied, 1)

    @staticmethod
    def _delta(nxt):
        def f(tensors, timeout_s=30.0):
            meta = nxt(tensors, timeout_s)
            meta["kind"], meta["base"] = "delta", 0
            return meta
        return f


@need_peer
class ServeTest(unittest.TestCase):
    def test_errors_before_and_after_join(self):
        with starling.Client.start() as c:
            with self.assertRaises(starling.StarlingError) as e:
                c.allreduce([np.ones(3, dtype=np.float32)])
            self.assertEqual(e.exception.code, "state")
            with self.assertRaises(starling.StarlingError) as e:
                c.join(["--no-such-flag"])
            self.assertEqual(e.exception.code, "usage")
            self.assertIn("no-such-flag", str(e.exception))
            c.join(LOOPBACK + ["--min-peers", "1"])
            with self.assertRaises(starling.StarlingError) as e:
                c.allreduce([np.ones(3, dtype=np.int32)])
            self.assertEqual(e.exception.code, "usage")
            self.assertIn("int32", str(e.exception))
            with self.assertRaises(starling.StarlingError) as e:
                c.allreduce([])
            self.assertEqual(e.exception.code, "usage")
            with self.assertRaises(starling.StarlingError) as e:
                c.allreduce([np.ones(3, dtype=np.float32)], rule="nosuchrule")
            self.assertEqual(e.exception.code, "usage")
            with self.assertRaises(starling.StarlingError) as e:
                starling.Client(c.socket_path, connect_timeout=5)
            self.assertEqual(e.exception.code, "busy")
            # Alone in the group, the mean is the tensor itself.
            x = np.arange(7, dtype=np.float32)
            r = c.allreduce([x, np.ones((2, 2))])
            self.assertEqual(x.tolist(), list(range(7)))
            self.assertEqual(len(r["group"]), 1)
            m = c.metrics()
            self.assertEqual(m["rounds_ok"], 1)
            self.assertIn("libp2p_rcmgr_connections", m["prometheus"])

    def test_state_download_for_a_late_joiner(self):
        with starling.Client.start() as a:
            info = a.join(LOOPBACK + ["--min-peers", "1"], model="state")
            state = np.linspace(-1, 1, 1000).astype(np.float32)
            a.publish_state(7, [state])
            with starling.Client.start() as b:
                b.join(LOOPBACK + ["--min-peers", "2", "--connect", info["addrs"][0]], model="state")
                got = np.zeros(1000, dtype=np.float32)
                v = b.fetch_state([got], min_version=7, timeout_s=30)
                self.assertEqual(v, 7)
                self.assertTrue((got == state).all())

    def test_announce_and_next(self):
        with starling.Client.start() as a:
            info = a.join(LOOPBACK + ["--min-peers", "1"], model="async")
            with starling.Client.start() as b:
                b.join(LOOPBACK + ["--min-peers", "2", "--connect", info["addrs"][0]], model="async")
                a.wait(30)
                got = np.zeros((4, 5), dtype=np.float32)
                with self.assertRaises(starling.StarlingError) as e:
                    b.next_announced([got], timeout_s=0.2)
                self.assertEqual(e.exception.code, "timeout")
                model = np.arange(20, dtype=np.float32).reshape(4, 5)
                a.announce([model], version=3, samples=32)
                meta = b.next_announced([got], timeout_s=30)
                self.assertEqual((meta["peer"], meta["version"], meta["samples"]), (info["id"], 3, 32))
                self.assertTrue((got == model).all())
                a.announce([np.ones(7, dtype=np.float32)], version=4)
                with self.assertRaises(starling.StarlingError) as e:
                    b.next_announced([got], timeout_s=30)
                self.assertEqual(e.exception.code, "mismatch")

    def test_serve_exits_with_its_client(self):
        c = starling.Client.start()
        proc = c.proc
        c._sock.close()  # as if the client died
        c._sock = None
        self.assertEqual(proc.wait(10), 0)
        c.close()


if __name__ == "__main__":
    unittest.main()

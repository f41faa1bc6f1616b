"""Training helpers for PyTorch models: a DDP-style gradient averager and
a DiLoCo outer optimizer, both over a starling.Client."""

import torch


class GradAverager:
    """Averages the gradients of a model's parameters over the swarm after
    each backward pass, in one all-reduce (one bucket), as
    DistributedDataParallel does.

        avg = GradAverager(model, client)   # hook=True: automatic
        loss.backward()                      # grads are averaged when it returns
        opt.step()

    With hook=False call avg.sync() between backward() and step(). weight
    is this peer's share in the mean (its batch size when batches differ).
    """

    def __init__(self, model, client, codec=None, hook=True, weight=1.0, timeout_s=None):
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.client = client
        self.codec = codec
        self.weight = weight
        self.timeout_s = timeout_s
        self.last = None
        self._queued = False
        self._handles = []
        if hook:
            for p in self.params:
                self._handles.append(p.register_hook(self._on_grad))

    def _on_grad(self, grad):
        # Queue the all-reduce once per backward pass, after every
        # gradient is accumulated into .grad (the engine runs queued
        # callbacks at the end of the pass).
        if not self._queued:
            self._queued = True
            torch.autograd.Variable._execution_engine.queue_callback(self._finish)
        return grad

    def _finish(self):
        self._queued = False
        self.sync()

    def sync(self):
        """All-reduces the gradients to their mean over the group."""
        grads = []
        for p in self.params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            grads.append(p.grad)
        self.last = self.client.allreduce(grads, rule="mean", codec=self.codec, weight=self.weight,
                                          timeout_s=self.timeout_s)
        return self.last

    def remove(self):
        for h in self._handles:
            h.remove()
        self._handles = []


class DiLoCo:
    """DiLoCo's outer optimizer (Douillard et al., 2023): each peer takes H
    inner steps with its own optimizer; step() then all-reduces the outer
    gradient Δ = θ_anchor − θ_local to its mean over the group and applies
    Nesterov SGD to the anchor:

        v ← μ·v + Δ;  θ_anchor ← θ_anchor − lr·(Δ + μ·v)

    and resets the model to the new anchor. Every peer must start from the
    same parameters (seed the model, or sync() once first).
    """

    def __init__(self, model, client, lr=0.7, momentum=0.9, nesterov=True, codec=None, timeout_s=None):
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.client = client
        self.lr, self.momentum, self.nesterov = lr, momentum, nesterov
        self.codec = codec
        self.timeout_s = timeout_s
        with torch.no_grad():
            self.anchor = [p.detach().clone() for p in self.params]
        self.velocity = [torch.zeros_like(p) for p in self.anchor]
        self.last = None

    @torch.no_grad()
    def sync(self):
        """Makes every peer's parameters (and anchor) their mean: a common
        start."""
        self.last = self.client.allreduce(self.params, rule="mean", timeout_s=self.timeout_s)
        for a, p in zip(self.anchor, self.params):
            a.copy_(p)

    @torch.no_grad()
    def step(self):
        """The outer step: average the deltas, Nesterov on the anchor."""
        deltas = [a - p.detach() for a, p in zip(self.anchor, self.params)]
        self.last = self.client.allreduce(deltas, rule="mean", codec=self.codec, timeout_s=self.timeout_s)
        for a, v, d, p in zip(self.anchor, self.velocity, deltas, self.params):
            v.mul_(self.momentum).add_(d)
            upd = d.add(v, alpha=self.momentum) if self.nesterov else v
            a.sub_(upd, alpha=self.lr)
            p.copy_(a)
        return self.last


class _Announced:
    """The drain FedAsync and FedBuff share: _announced() yields the
    metadata of each vector the other peers announced, read into
    self._buf, waiting up to self.wait_s for the first and not at all for
    the rest; announcements of peers that left or train another shape
    are counted in self.skipped and passed over."""

    def _announced(self):
        wait = self.wait_s
        while True:
            try:
                meta = self.client.next_announced(self._buf, timeout_s=max(wait, 0.05))
            except Exception as e:  # noqa: BLE001 — StarlingError: timeout ends the drain
                code = getattr(e, "code", "")
                if code == "timeout":
                    return
                if code in ("gone", "mismatch"):  # a peer that left, or trains another shape
                    self.skipped += 1
                    continue
                raise
            yield meta
            wait = 0.0


class FedAsync(_Announced):
    """FedAsync (Xie et al., 2019) between peers: every publish_every local
    steps, step() announces this peer's model and mixes in the models the
    others announced meanwhile, each with weight α·(τ+1)^(−a), τ its
    staleness (this peer's version − the model's, at least 0):

        θ ← (1 − α_τ)·θ + α_τ·θ_peer

    wait_s bounds how long step() waits for the first peer model (0: take
    only what already arrived).
    """

    def __init__(self, model, client, alpha=0.6, a=0.5, wait_s=0.0):
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.client = client
        self.alpha, self.a, self.wait_s = alpha, a, wait_s
        self.version = 0
        self.mixed = 0
        self.skipped = 0
        self._buf = [torch.zeros_like(p, device="cpu") for p in self.params]

    def weight(self, staleness):
        return self.alpha * (max(staleness, 0) + 1) ** (-self.a)

    @torch.no_grad()
    def step(self, samples=1):
        self.version += 1
        self.client.announce(self.params, self.version, samples=samples)
        n = 0
        for meta in self._announced():
            w = self.weight(self.version - meta["version"])
            for p, b in zip(self.params, self._buf):
                p.mul_(1 - w).add_(b.to(p.device), alpha=w)
            self.version = max(self.version, meta["version"])
            n += 1
        self.mixed += n
        return n


class FedBuff(_Announced):
    """FedBuff (Nguyen et al., 2022) between peers: step() announces this
    peer's delta since its last step (θ − θ_base) and adds it, and the
    deltas the others announced, to a buffer; once the buffer holds k
    deltas, the model moves by server_lr times their mean, weighted by
    (τ+1)^(−a) for staleness τ, and the buffer empties.
    """

    def __init__(self, model, client, k=3, server_lr=1.0, a=0.5, wait_s=0.0):
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.client = client
        self.k, self.server_lr, self.a, self.wait_s = k, server_lr, a, wait_s
        self.version = 0
        self.applied = 0
        self.skipped = 0
        with torch.no_grad():
            self.base = [p.detach().clone() for p in self.params]
        self._sum = [torch.zeros_like(p) for p in self.params]
        self._n = 0
        self._buf = [torch.zeros_like(p, device="cpu") for p in self.params]

    def _add(self, deltas, w):
        for s_, d in zip(self._sum, deltas):
            s_.add_(d.to(s_.device), alpha=w)
        self._n += 1

    @torch.no_grad()
    def step(self):
        deltas = [p.detach() - b for p, b in zip(self.params, self.base)]
        self.client.announce(deltas, self.version + 1, base=self.version, kind="delta")
        # This peer's own delta is undone: the buffer's mean replaces it.
        for p, b in zip(self.params, self.base):
            p.copy_(b)
        self._add(deltas, 1.0)
        for meta in self._announced():
            if meta["kind"] != "delta":
                continue
            self._add(self._buf, (max(self.version - meta["base"], 0) + 1) ** (-self.a))
        if self._n >= self.k:
            for p, s_ in zip(self.params, self._sum):
                p.add_(s_, alpha=self.server_lr / self._n)
                s_.zero_()
            self._n = 0
            self.version += 1
            self.applied += 1
        for b, p in zip(self.base, self.params):
            b.copy_(p)

"""The client of `peer serve`: control over a Unix socket, tensors through
shared memory (a file in /dev/shm that both processes map)."""

import json
import mmap
import os
import select
import shutil
import socket
import struct
import subprocess
import tempfile
import time

import numpy as np

PROTOCOL_VERSION = 1
_MAX_FRAME = 1 << 20
# Slack on top of an op's own deadline before the client gives up on the
# socket: serve answers every op within its deadline.
_SLACK_S = 30.0
DEFAULT_TIMEOUT_S = 300.0


class StarlingError(Exception):
    """An error `peer serve` reported (code: busy, usage, state, mismatch,
    excluded, timeout, failed, gone) or a failure to reach it (code: io)."""

    def __init__(self, message, code="io"):
        super().__init__(message)
        self.code = code


def find_peer(peer=None):
    """Returns the path of the `peer` binary: peer, $STARLING_PEER, `peer`
    on PATH, or one built with `go build` from the Starling checkout this
    package lives in (or the current directory's)."""
    for cand in (peer, os.environ.get("STARLING_PEER")):
        if cand:
            if not os.access(cand, os.X_OK):
                raise StarlingError("peer binary %r is not executable" % cand, "usage")
            return cand
    found = shutil.which("peer")
    if found:
        return found
    for start in (os.path.dirname(os.path.abspath(__file__)), os.getcwd()):
        root = _module_root(start)
        if root:
            out = os.path.join(tempfile.gettempdir(), "starling-peer-%d" % os.getuid(), "peer")
            os.makedirs(os.path.dirname(out), exist_ok=True)
            res = subprocess.run(["go", "build", "-o", out, "./cmd/peer"], cwd=root,
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=600)
            if res.returncode != 0:
                raise StarlingError("go build ./cmd/peer failed:\n" + res.stdout.decode(errors="replace"), "usage")
            return out
    raise StarlingError("no peer binary: pass peer=PATH, set STARLING_PEER, put peer on PATH, "
                        "or run from a Starling checkout (go build ./cmd/peer)", "usage")


def _module_root(d):
    while True:
        gm = os.path.join(d, "go.mod")
        if os.path.exists(gm):
            with open(gm) as f:
                if "module github.com/starling-ml/starling" in f.readline():
                    return d
        up = os.path.dirname(d)
        if up == d:
            return None
        d = up


class _Arena:
    """A shared-memory file both processes map: src half, dst half."""

    def __init__(self, nbytes):
        base = "/dev/shm" if os.path.isdir("/dev/shm") else None
        fd, self.path = tempfile.mkstemp(prefix="starling-", dir=base)
        try:
            os.ftruncate(fd, nbytes)
            self.mm = mmap.mmap(fd, nbytes)
        finally:
            os.close(fd)
        self.nbytes = nbytes
        self.half = nbytes // 2
        self.f32 = np.frombuffer(self.mm, dtype=np.float32)
        self.src = self.f32[: self.half // 4]
        self.dst = self.f32[self.half // 4:]

    def unlink(self):
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass

    def close(self):
        self.unlink()
        self.src = self.dst = self.f32 = None
        try:
            self.mm.close()
        except BufferError:
            pass  # a view is still alive; the mapping goes with it


def _is_torch(t):
    return type(t).__module__.startswith("torch")


def _check_dtype(i, t):
    if _is_torch(t):
        if not t.is_floating_point():
            raise StarlingError("tensor %d has dtype %s: Starling reduces floating-point tensors "
                                "(float32, or float16/bfloat16/float64 converted to float32)" % (i, t.dtype), "usage")
        return
    dt = np.asarray(t).dtype
    if not np.issubdtype(dt, np.floating):
        raise StarlingError("array %d has dtype %s: Starling reduces floating-point arrays "
                            "(float32, or float16/float64 converted to float32)" % (i, dt), "usage")


def _shape(t):
    return [int(d) for d in t.shape]


def _numel(shape):
    n = 1
    for d in shape:
        n *= d
    return n


class Client:
    """One swarm membership through one `peer serve`.

    Client.start() runs `peer serve --once` for this process; Client(socket)
    attaches to a running one. Every call has a deadline; a failure raises
    StarlingError with a code. Not safe for concurrent use."""

    def __init__(self, socket_path, proc=None, connect_timeout=30.0):
        self.socket_path = socket_path
        self.proc = proc
        self._arena = None
        self._sock = None
        self.info = None
        self.last = None
        deadline = time.monotonic() + connect_timeout
        last = None
        while True:
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                s.settimeout(max(0.1, deadline - time.monotonic()))
                s.connect(socket_path)
                break
            except OSError as e:
                s.close()
                last = e
                if time.monotonic() > deadline or (proc is not None and proc.poll() is not None):
                    raise StarlingError("cannot reach peer serve at %s: %s" % (socket_path, last))
                time.sleep(0.05)
        self._sock = s
        s.settimeout(connect_timeout)
        hello = self._read()
        if not hello.get("ok"):
            s.close()
            self._sock = None
            raise StarlingError(hello.get("error", "peer serve refused the connection"), hello.get("code", "io"))
        if hello.get("version") != PROTOCOL_VERSION:
            raise StarlingError("peer serve speaks protocol %s, this client %d" % (hello.get("version"), PROTOCOL_VERSION))
        self.server_pid = hello.get("pid")

    @classmethod
    def start(cls, peer=None, socket_path=None, log_level="warn", stderr=None, start_timeout=60.0):
        """Starts `peer serve --once` for this process and connects to it.
        The server exits when this client disconnects (or dies)."""
        binary = find_peer(peer)
        if socket_path is None:
            d = tempfile.mkdtemp(prefix="starling-")
            socket_path = os.path.join(d, "serve.sock")
        args = [binary, "serve", "--once", "--socket", socket_path, "--log-level", log_level,
                "--client-wait", "%ds" % int(start_timeout)]
        proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=stderr, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + start_timeout
        line = b""
        while not line.endswith(b"\n"):
            left = deadline - time.monotonic()
            if left <= 0 or proc.poll() is not None:
                proc.kill()
                raise StarlingError("peer serve did not start within %.0fs (exit %s)" % (start_timeout, proc.poll()))
            r, _, _ = select.select([proc.stdout], [], [], left)
            if r:
                b = os.read(proc.stdout.fileno(), 1)
                if not b:
                    continue
                line += b
        return cls(socket_path, proc=proc, connect_timeout=start_timeout)

    # -- framing ---------------------------------------------------------

    def _recv_exact(self, n):
        buf = bytearray()
        while len(buf) < n:
            try:
                b = self._sock.recv(n - len(buf))
            except socket.timeout:
                raise StarlingError("peer serve did not answer in time", "timeout")
            except OSError as e:
                raise StarlingError("connection to peer serve failed: %s" % e)
            if not b:
                raise StarlingError("peer serve closed the connection")
            buf += b
        return bytes(buf)

    def _read(self):
        (n,) = struct.unpack(">I", self._recv_exact(4))
        if n > _MAX_FRAME:
            raise StarlingError("control frame of %d bytes from peer serve" % n)
        return json.loads(self._recv_exact(n))

    def _call(self, req, timeout_s=DEFAULT_TIMEOUT_S):
        if self._sock is None:
            raise StarlingError("client is closed", "state")
        body = json.dumps(req).encode()
        self._sock.settimeout(timeout_s + _SLACK_S)
        try:
            self._sock.sendall(struct.pack(">I", len(body)) + body)
        except OSError as e:
            raise StarlingError("connection to peer serve failed: %s" % e)
        resp = self._read()
        if not resp.get("ok"):
            raise StarlingError(resp.get("error", "peer serve failed"), resp.get("code", "failed"))
        return resp

    # -- membership -----------------------------------------------------

    def join(self, args=(), model=None, wait=True, timeout_s=None):
        """Joins a swarm: args are `peer run`'s flags (--swarm, --listen,
        --connect, --psk, --min-peers, --wait, --aggregate, --compress,
        --stall-timeout, …). model names what the peers train (peers of
        other models ignore each other). With wait, also waits for
        --min-peers (wait()). Returns {"id", "addrs", "members"}."""
        req = {"op": "join", "args": list(args)}
        if model:
            req["model"] = model
        self.info = self._call(req, 120.0)
        if wait:
            self.wait(timeout_s)
        return self.info

    def wait(self, timeout_s=None):
        """Waits for --min-peers live peers and fixes the group of the first
        all-reduce. Returns the member ids."""
        req = {"op": "wait"}
        if timeout_s:
            req["timeout_s"] = timeout_s
        resp = self._call(req, timeout_s or 600.0)
        self.info["members"] = resp.get("members", [])
        return self.info["members"]

    # -- tensors --------------------------------------------------------

    def _ensure(self, nvalues):
        need = 8 * max(nvalues, 1)
        if self._arena is not None and self._arena.half >= 4 * max(nvalues, 1):
            return self._arena
        size = 1 << max(16, (need - 1).bit_length())
        a = _Arena(size)
        try:
            self._call({"op": "shm", "path": a.path, "bytes": size}, 30.0)
        finally:
            a.unlink()  # both sides hold it mapped: nothing to clean up later
        if self._arena is not None:
            self._arena.close()
        self._arena = a
        return a

    def _layout(self, tensors):
        """Checks the tensors' dtypes and returns the shared arena sized
        for them, their shapes and their total number of values."""
        shapes = []
        for i, t in enumerate(tensors):
            _check_dtype(i, t)
            shapes.append(_shape(t))
        total = sum(_numel(s) for s in shapes)
        return self._ensure(total), shapes, total

    def _pack(self, tensors):
        if not tensors:
            raise StarlingError("no tensors given", "usage")
        a, shapes, total = self._layout(tensors)
        off = 0
        for t, s in zip(tensors, shapes):
            n = _numel(s)
            _copy_in(a.src[off:off + n], t)
            off += n
        return a, shapes, total

    def allreduce(self, tensors, rule=None, codec=None, weight=1.0, timeout_s=None):
        """All-reduces a list of tensors (torch, any device, or numpy
        arrays; floating point) in place: each becomes the rule over the
        group's tensors (mean weighted by weight unless the swarm's
        --aggregate or rule says otherwise: sum, median, trimmed:β, …),
        the compression codec (fp16, int8, topk:F,ef, …) on the wire.
        Every peer must call with the same shapes in the same order.
        Returns {"round", "group", "excluded", "algorithm", "attempts"}."""
        tensors = list(tensors)
        a, shapes, total = self._pack(tensors)
        req = {"op": "allreduce", "src": 0, "dst": a.half, "count": total, "shapes": shapes, "weight": float(weight)}
        if rule:
            req["rule"] = rule
        if codec:
            req["codec"] = codec
        t = timeout_s or DEFAULT_TIMEOUT_S
        req["timeout_s"] = t
        resp = self._call(req, t)
        _unpack(a, tensors, shapes)
        return resp

    def shared(self, nvalues):
        """Returns a float32 numpy array of nvalues that lives in the shared
        memory: fill it and call allreduce_shared, and no copy is made on
        either side. The array is valid until a call needs more room than
        the shared memory has (then it is remapped: call shared again)."""
        return self._ensure(nvalues).src[:nvalues]

    def allreduce_shared(self, nvalues, shapes=None, rule=None, codec=None, weight=1.0, timeout_s=None):
        """All-reduces the first nvalues of shared() and returns the result,
        a read-only view of the shared memory valid until the next call.
        shapes (default: one flat tensor) is what the peers compare."""
        a = self._ensure(nvalues)
        t = timeout_s or DEFAULT_TIMEOUT_S
        req = {"op": "allreduce", "src": 0, "dst": a.half, "count": int(nvalues),
               "shapes": shapes or [[int(nvalues)]], "weight": float(weight), "timeout_s": t}
        if rule:
            req["rule"] = rule
        if codec:
            req["codec"] = codec
        self.last = self._call(req, t)
        out = a.dst[:nvalues]
        out.flags.writeable = False
        return out

    def average(self, tensors, codec=None, timeout_s=None):
        """All-reduces tensors to their plain mean over the group."""
        return self.allreduce(tensors, rule="mean", codec=codec, timeout_s=timeout_s)

    def publish_state(self, version, tensors):
        """Offers tensors as the global state of version to peers that
        join late (fetch_state)."""
        a, shapes, total = self._pack(list(tensors))
        return self._call({"op": "publish", "src": 0, "count": total, "version": int(version)}, 60.0)

    def fetch_state(self, tensors, min_version=0, timeout_s=60.0):
        """Fills tensors with the newest state of version ≥ min_version that
        the other peers published; returns that version."""
        tensors = list(tensors)
        a, shapes, total = self._layout(tensors)
        resp = self._call({"op": "fetch", "dst": a.half, "count": total, "version": int(min_version),
                           "timeout_s": timeout_s}, timeout_s)
        _unpack(a, tensors, shapes)
        return resp["state_version"]

    def announce(self, tensors, version, base=0, kind="model", samples=1, loss=0.0, timeout_s=30.0):
        """Publishes tensors (a model, or a delta from version base) to the
        other peers for asynchronous mixing (FedAsync, FedBuff): served
        over the peer's tensor streams, announced on its control plane."""
        a, shapes, total = self._pack(list(tensors))
        return self._call({"op": "announce", "src": 0, "count": total, "version": int(version), "base": int(base),
                           "kind": kind, "weight": float(samples), "loss": float(loss), "timeout_s": timeout_s}, timeout_s)

    def next_announced(self, tensors, timeout_s=30.0):
        """Waits for the next vector another peer announced, writes it into
        tensors (which give the shapes) and returns {"peer", "version",
        "base", "samples", "kind"}. A vector of another length raises code
        mismatch; none within timeout_s raises code timeout; one that could
        not be pulled (its peer left) raises code gone."""
        tensors = list(tensors)
        a, shapes, total = self._layout(tensors)
        resp = self._call({"op": "next", "dst": a.half, "count": total, "timeout_s": timeout_s}, timeout_s)
        _unpack(a, tensors, shapes)
        return {"peer": resp.get("id"), "version": resp.get("state_version", 0), "base": resp.get("round", 0),
                "samples": resp.get("weight", 0), "kind": resp.get("kind", "model")}

    def metrics(self):
        """The peer's metrics: rounds, seconds in all-reduce, members,
        group, the last round, and its Prometheus counters and gauges."""
        return self._call({"op": "metrics"}, 30.0)["metrics"]

    def close(self, timeout_s=10.0):
        """Leaves the swarm and, if this client started peer serve, waits
        for it to exit."""
        if self._sock is not None:
            try:
                self._call({"op": "leave"}, 5.0)
            except StarlingError:
                pass
            self._sock.close()
            self._sock = None
        if self._arena is not None:
            self._arena.close()
            self._arena = None
        if self.proc is not None:
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            if self.proc.stdout:
                self.proc.stdout.close()
            self.proc = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _copy_in(dst, t):
    if _is_torch(t):
        import torch

        torch.from_numpy(dst).copy_(t.detach().reshape(-1))
    else:
        np.copyto(dst, np.asarray(t).reshape(-1), casting="same_kind")


def _unpack(a, tensors, shapes):
    """Copies the arena's result region into the tensors, in order."""
    off = 0
    for x, s in zip(tensors, shapes):
        n = _numel(s)
        _copy_out(x, a.dst[off:off + n], s)
        off += n


def _copy_out(t, src, shape):
    if _is_torch(t):
        import torch

        with torch.no_grad():
            t.copy_(torch.from_numpy(src).view(shape))
    else:
        np.copyto(t, src.reshape(shape), casting="same_kind")

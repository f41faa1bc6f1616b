package serve

import (
	"bytes"
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/starling-ml/starling/swarm"
)

func TestFrameRoundTrip(t *testing.T) {
	var b bytes.Buffer
	in := Request{Op: "allreduce", Src: 8, Dst: 64, Count: 3, Shapes: [][]int{{3}}, Weight: 2}
	if err := WriteFrame(&b, in); err != nil {
		t.Fatal(err)
	}
	var out Request
	if err := ReadFrame(&b, &out); err != nil {
		t.Fatal(err)
	}
	if out.Op != in.Op || out.Dst != 64 || out.Count != 3 || out.Shapes[0][0] != 3 || out.Weight != 2 {
		t.Fatalf("got %+v", out)
	}
	// A length over MaxFrame is refused before reading the body.
	big := bytes.NewReader([]byte{0xff, 0xff, 0xff, 0xff})
	if err := ReadFrame(big, &out); !errors.Is(err, ErrFrameTooLarge) {
		t.Fatalf("err %v, want ErrFrameTooLarge", err)
	}
	bad := bytes.NewReader([]byte{0, 0, 0, 2, '{', 'x'})
	if err := ReadFrame(bad, &out); !errors.Is(err, ErrBadFrame) {
		t.Fatalf("err %v, want ErrBadFrame", err)
	}
}

// startServe runs Serve on a socket in a temporary folder.
func startServe(t *testing.T, once bool) (string, <-chan error) {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "s.sock")
	ready := make(chan struct{})
	done := make(chan error, 1)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	join := func([]string) (JoinConfig, error) { return JoinConfig{Swarm: swarm.DefaultConfig()}, nil }
	go func() {
		done <- Serve(ctx, Config{Socket: sock, Join: join, Once: once}, func(string) { close(ready) })
	}()
	select {
	case <-ready:
	case err := <-done:
		t.Fatal(err)
	case <-time.After(10 * time.Second):
		t.Fatal("serve did not start")
	}
	return sock, done
}

func dialServe(t *testing.T, sock string) (net.Conn, Response) {
	t.Helper()
	c, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	c.SetDeadline(time.Now().Add(10 * time.Second))
	var hello Response
	if err := ReadFrame(c, &hello); err != nil {
		t.Fatal(err)
	}
	return c, hello
}

func call(t *testing.T, c net.Conn, r Request) Response {
	t.Helper()
	if err := WriteFrame(c, r); err != nil {
		t.Fatal(err)
	}
	var resp Response
	if err := ReadFrame(c, &resp); err != nil {
		t.Fatal(err)
	}
	return resp
}

func TestServeOneClient(t *testing.T) {
	sock, done := startServe(t, true)
	c, hello := dialServe(t, sock)
	if !hello.OK || hello.Version != Version || hello.PID != os.Getpid() {
		t.Fatalf("greeting %+v", hello)
	}
	// A second client is told, and the first goes on.
	c2, busy := dialServe(t, sock)
	c2.Close()
	if busy.OK || busy.Code != CodeBusy {
		t.Fatalf("second client got %+v, want code busy", busy)
	}
	for _, tc := range []struct {
		req  Request
		code string
	}{
		{Request{Op: "nope"}, CodeUsage},
		{Request{Op: "allreduce", Count: 1}, CodeState},
		{Request{Op: "wait"}, CodeState},
		{Request{Op: "shm", Path: "/nonexistent/x", Bytes: 8}, CodeUsage},
		{Request{Op: "shm", Path: sock, Bytes: 7}, CodeUsage},
	} {
		if r := call(t, c, tc.req); r.OK || r.Code != tc.code || r.Error == "" {
			t.Errorf("%+v: got %+v, want code %s", tc.req, r, tc.code)
		}
	}
	// Shared memory: offsets outside it are refused.
	f, err := os.CreateTemp(t.TempDir(), "shm")
	if err != nil {
		t.Fatal(err)
	}
	f.Truncate(64)
	f.Close()
	if r := call(t, c, Request{Op: "shm", Path: f.Name(), Bytes: 64}); !r.OK {
		t.Fatalf("shm: %+v", r)
	}
	if r := call(t, c, Request{Op: "leave"}); !r.OK {
		t.Fatalf("leave: %+v", r)
	}
	c.Close()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("serve --once did not return after its client left")
	}
}

func TestSpan(t *testing.T) {
	s := &session{vals: make([]float32, 16), shm: make([]byte, 64)}
	if v, err := s.span("src", 8, 4); err != nil || len(v) != 4 || &v[0] != &s.vals[2] {
		t.Fatalf("span: %v %v", v, err)
	}
	for _, c := range [][2]int64{{2, 1}, {0, 17}, {60, 2}, {-4, 1}, {0, -1}} {
		if _, err := s.span("src", c[0], c[1]); err == nil {
			t.Errorf("span(%d, %d): no error", c[0], c[1])
		}
	}
}

package serve

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"sync"
	"time"

	"github.com/starling-ml/starling/swarm"
)

// JoinConfig is what a join request's arguments (peer run's flags) set.
type JoinConfig struct {
	Swarm    swarm.Config
	Connect  []string      // multiaddrs (with /p2p/ID) to dial at start
	MinPeers int           // wait for this many live peers, this one included
	Wait     time.Duration // how long to wait for them
}

// JoinFunc turns a join request's arguments into a JoinConfig; errors are
// the client's (code usage).
type JoinFunc func(args []string) (JoinConfig, error)

// Config configures Serve.
type Config struct {
	// Socket is the path of the Unix socket to listen on. A stale socket
	// file (nobody listening) is replaced; a live one is an error.
	Socket string
	// Join parses a join request's arguments.
	Join JoinFunc
	// Once makes Serve return after its first client's session.
	Once bool
	// ClientWait, if positive, makes Serve return an error when no client
	// connects within it (a client that started serve and died).
	ClientWait time.Duration
	// Log receives diagnostics (nil: none).
	Log *slog.Logger
}

// Serve listens on cfg.Socket and serves one client at a time until ctx
// ends (or, with Once, the first session ends). ready, if not nil, is
// called once the socket accepts connections.
func Serve(ctx context.Context, cfg Config, ready func(socket string)) error {
	if cfg.Socket == "" || cfg.Join == nil {
		return errors.New("serve: Socket and Join are required")
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if err := removeStale(cfg.Socket); err != nil {
		return err
	}
	l, err := net.Listen("unix", cfg.Socket)
	if err != nil {
		return fmt.Errorf("serve: %w", err)
	}
	defer os.Remove(cfg.Socket)
	defer l.Close()
	if err := os.Chmod(cfg.Socket, 0o600); err != nil {
		return err
	}
	if ready != nil {
		ready(cfg.Socket)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		<-ctx.Done()
		l.Close()
	}()
	waitTimer := &time.Timer{}
	if cfg.ClientWait > 0 {
		waitTimer = time.AfterFunc(cfg.ClientWait, func() {
			cfg.Log.Warn("serve: no client connected in time", "wait", cfg.ClientWait)
			cancel()
		})
		defer waitTimer.Stop()
	}

	var (
		mu     sync.Mutex
		active int // pid of the session's client, -1 while none greeted yet
		busy   bool
		wg     sync.WaitGroup
		served bool
	)
	defer wg.Wait()
	for {
		c, err := l.Accept()
		if err != nil {
			if ctx.Err() != nil {
				if cfg.Once && served {
					return nil
				}
				if cfg.ClientWait > 0 && !served {
					return fmt.Errorf("serve: no client connected within %v", cfg.ClientWait)
				}
				return nil
			}
			return fmt.Errorf("serve: %w", err)
		}
		uc := c.(*net.UnixConn)
		mu.Lock()
		if busy {
			pid := active
			mu.Unlock()
			c.SetWriteDeadline(time.Now().Add(2 * time.Second))
			WriteFrame(c, Response{Code: CodeBusy, Error: fmt.Sprintf("peer serve (pid %d) already has a client (pid %d): one client per peer serve; start another peer serve for another process", os.Getpid(), pid)})
			c.Close()
			continue
		}
		busy, active, served = true, peerPID(uc), true
		mu.Unlock()
		if cfg.ClientWait > 0 {
			waitTimer.Stop()
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			s := newSession(cfg, uc)
			s.run(ctx)
			mu.Lock()
			busy = false
			mu.Unlock()
			if cfg.Once {
				cancel()
			}
		}()
	}
}

// removeStale removes a socket file nobody listens on.
func removeStale(path string) error {
	if _, err := os.Stat(path); err != nil {
		return nil
	}
	c, err := net.DialTimeout("unix", path, time.Second)
	if err == nil {
		c.Close()
		return fmt.Errorf("serve: %s: another peer serve is listening there", path)
	}
	return os.Remove(path)
}

package serve

import (
	"net"
	"syscall"
)

// peerPID returns the pid of the process at the other end of c (0 if the
// kernel does not say).
func peerPID(c *net.UnixConn) int {
	rc, err := c.SyscallConn()
	if err != nil {
		return 0
	}
	pid := 0
	rc.Control(func(fd uintptr) {
		if u, err := syscall.GetsockoptUcred(int(fd), syscall.SOL_SOCKET, syscall.SO_PEERCRED); err == nil {
			pid = int(u.Pid)
		}
	})
	return pid
}

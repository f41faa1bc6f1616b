package demo

import "syscall"

// dieWithParent makes the kernel kill a peer process when the demo dies,
// so a killed demo leaves no peers behind.
func dieWithParent() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}

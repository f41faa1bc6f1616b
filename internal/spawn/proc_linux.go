// Package spawn holds what starting child processes needs per platform.
package spawn

import "syscall"

// DieWithParent makes the kernel kill a child process when its parent
// dies, so a killed parent leaves no children behind.
func DieWithParent() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}

//go:build !linux

// Package spawn holds what starting child processes needs per platform.
package spawn

import "syscall"

// DieWithParent returns nil: only Linux kills children with their parent
// (Pdeathsig); elsewhere the parent's context cancellation stops them.
func DieWithParent() *syscall.SysProcAttr { return nil }

//go:build !linux

package demo

import "syscall"

// dieWithParent returns nil: only Linux kills children with their parent
// (Pdeathsig); elsewhere the demo's context cancellation stops them.
func dieWithParent() *syscall.SysProcAttr { return nil }

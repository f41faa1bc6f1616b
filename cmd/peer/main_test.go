package main

import (
	"os"
	"path/filepath"
	"testing"
)

// TestMain removes the peer binary the end-to-end tests built, so that
// each run of the package's tests does not leave 50 MB in the temp folder.
func TestMain(m *testing.M) {
	code := m.Run()
	if peerBin != "" {
		os.RemoveAll(filepath.Dir(peerBin))
	}
	os.Exit(code)
}

package device

// Hooks for the external tests in package device_test (which can import
// devicetest without an import cycle).
var (
	NewFastISA    = newFast
	SupportedISAs = supportedISAs
)

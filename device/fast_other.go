//go:build !amd64 || purego

package device

func bestISA() string { return "go" }

func supportedISAs() []string { return []string{"go"} }

func gemmFor(isa string) *gemmImpl {
	if isa == "go" {
		return goGemm
	}
	return nil
}

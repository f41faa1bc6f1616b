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

func packTransposed(d, src []float32, ld, rows, kc, w int) { packTransposedGo(d, src, ld, rows, kc, w) }

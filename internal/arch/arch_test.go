package arch

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

const module = "github.com/starling-ml/starling"

// pure are the packages that compute without a network, a clock or a
// goroutine of their own: reducers, codecs, staleness rules, layers,
// datasets, the compute backend, the spec parser and the peer ID.
var pure = []string{
	"compression", "staleness", "nn", "data", "device", "aggregate/rule", "workload",
	"internal/spec", "peerid", "gossip/wire", "gossip/average",
}

// drivers are the packages that own goroutines, hosts or the network; no
// pure package may depend on them.
var drivers = []string{
	"aggregate", "aggregate/p2p", "aggregate/aggtest", "node", "gossip", "swarm", "sim", "train",
	"internal/peerrun", "internal/demo",
}

// goroutineAllowed lists the pure packages' files that may start
// goroutines, and why.
var goroutineAllowed = map[string]string{
	// The CPU backend's GEMM splits a large product over goroutines that
	// start and end within the call: nothing runs on after it.
	"device/gemm.go": "the compute backend's fork-join parallelism",
}

func goList(t *testing.T, args ...string) []string {
	t.Helper()
	out, err := exec.Command("go", append([]string{"list"}, args...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("go list %v: %v\n%s", args, err, out)
	}
	return strings.Fields(string(out))
}

// TestPurePackages: the pure packages' dependencies hold no libp2p
// package and no Starling driver, and none of their own files starts a
// goroutine (but the compute backend's pool).
func TestPurePackages(t *testing.T) {
	if testing.Short() {
		t.Skip("runs go list")
	}
	for _, p := range pure {
		for _, dep := range goList(t, "-deps", module+"/"+p) {
			switch {
			case strings.HasPrefix(dep, "github.com/libp2p/"):
				t.Errorf("%s depends on %s", p, dep)
			case strings.HasPrefix(dep, "github.com/multiformats/") && p != "gossip/wire":
				// The control messages carry multiaddrs and multihash
				// peer IDs, which gossip/wire checks; nobody else needs
				// the formats.
				t.Errorf("%s depends on %s", p, dep)
			case strings.HasPrefix(dep, module+"/"):
				rel := strings.TrimPrefix(dep, module+"/")
				for _, d := range drivers {
					if rel == d {
						t.Errorf("%s depends on the driver package %s", p, rel)
					}
				}
			}
		}
	}
	for _, p := range pure {
		dir := goList(t, "-f", "{{.Dir}}", module+"/"+p)[0]
		for _, f := range goList(t, "-f", "{{range .GoFiles}}{{.}} {{end}}", module+"/"+p) {
			rel := p + "/" + f
			if _, ok := goroutineAllowed[rel]; ok {
				continue
			}
			if goStatements(t, filepath.Join(dir, f)) > 0 {
				t.Errorf("%s starts a goroutine; pure packages leave that to their driver", rel)
			}
		}
	}
}

// TestTrainHasNoLibp2p: the strategies speak to the network only through
// their own interfaces; libp2p stays in node, gossip, aggregate/p2p and
// swarm.
func TestTrainHasNoLibp2p(t *testing.T) {
	if testing.Short() {
		t.Skip("runs go list")
	}
	for _, dep := range goList(t, "-deps", module+"/train") {
		if strings.HasPrefix(dep, "github.com/libp2p/") {
			t.Errorf("train depends on %s", dep)
		}
	}
}

func goStatements(t *testing.T, path string) int {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), path, nil, parser.SkipObjectResolution)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	ast.Inspect(f, func(x ast.Node) bool {
		if _, ok := x.(*ast.GoStmt); ok {
			n++
		}
		return true
	})
	return n
}

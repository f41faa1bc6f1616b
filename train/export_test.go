package train

import (
	"time"

	"github.com/starling-ml/starling/peerid"
)

// Hooks for the external tests (package train_test). Those run the
// strategies on traintest's fakes, and traintest imports train, so they
// cannot be in package train; they share these helpers with the internal
// tests.
var (
	NewTestWorker = testWorker
	Shards        = shards
	MNIST         = mnist
)

// TestArch is the model of NewTestWorker's workers.
const TestArch = testArch

// SetSlowdown makes a built worker s times slower (WorkerConfig.Slowdown).
func SetSlowdown(w *Worker, s float64) { w.cfg.Slowdown = s }

// SetStepTime makes each step of w take d, times its Slowdown: the pace of
// a peer in a synctest bubble, where computing takes no time.
func SetStepTime(w *Worker, d time.Duration) { w.stepTime = d }

// PSRank is the parameter-server election's order of members.
var PSRank = psRank

// PSLayoutDigest returns the digest of the layout members elect.
func PSLayoutDigest(members []peerid.ID, model string, dim, n int) uint64 {
	l, err := planLayout(members, model, dim, n)
	if err != nil {
		panic(err)
	}
	return l.digest()
}

// FetchFanout is how many peers one attempt of a federated state fetch
// asks at once.
const FetchFanout = fetchFanout

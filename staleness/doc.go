// Package staleness decides how much an asynchronous contribution counts.
//
// Every contribution (a gradient, a model delta or a whole model) is
// computed from some model version, its base. When it arrives, the receiver
// is at its own, local version; the difference τ = local − base is the
// contribution's staleness. A Policy maps τ to a Decision: accept with a
// weight s(τ) ∈ [0, 1], or reject it because τ exceeds a stale-synchronous
// (SSP) bound. The same bound gates a peer's own progress: a peer more than s
// versions ahead of the slowest live peer must wait.
//
// Policies, with the papers' defaults (Parse accepts these spellings):
//
//	const        s(τ) = 1                                  (plain async SGD)
//	poly:a       s(τ) = (τ+1)^−a, a = 0.5                  (FedAsync, Xie et al. 2019)
//	hinge:a,b    s(τ) = 1 if τ ≤ b else 1/(a(τ−b)+1), a=10, b=4  (FedAsync)
//	inv          s(τ) = 1/τ, s(0) = 1                      (Zhang et al. 2016)
//	sqrt         s(τ) = 1/√(1+τ)                           (FedBuff, Nguyen et al. 2022)
//	ssp:s        reject τ > s; gate own progress at lag > s (Ho et al. 2013)
//
// A weight term and an SSP term combine with '+': "poly:0.5+ssp:16".
// Custom weight functions plug in through Custom.
//
// Three pure state machines apply weighted contributions to a flat
// []float32 model owned by the caller:
//
//   - Mixer (FedAsync): x ← (1−α·s(τ))·x + α·s(τ)·x_new.
//   - Buffer (FedBuff): accumulate s(τ)·Δ over K contributions, then
//     x ← x + η·ΣΔ/K.
//   - Compensate / AdaptiveCompensator (DC-ASGD, Zheng et al. 2017):
//     g + λ·g⊙g⊙(w − w_bak).
//
// Mixer and Buffer validate every contribution before touching the model:
// a wrong length, a NaN or Inf, a base version from the future or a version
// beyond the SSP bound is dropped and counted in Stats, and the model is left
// unchanged.
//
// # Time
//
// Nothing here reads the wall clock, starts a goroutine or does I/O. Model
// versions are plain counters (Version), and the only wall-clock state, the
// last time each peer was heard from (VersionClock), takes the current time as
// an argument, so callers inject their clock and tests run on a script:
//
//	vc := staleness.NewVersionClock(0, 30*time.Second)
//	mx, _ := staleness.NewMixer(staleness.DefaultMixerConfig(), vc)
//	for c := range contributions { // the driver's loop
//		vc.Observe(c.Peer, c.Base, clock.Now())
//		d, err := mx.Mix(model, c.Params, c.Base)
//		// d.Action == Accept: model was mixed and vc ticked.
//	}
//
// Values of these types are not safe for concurrent use; the driver that
// owns the model serialises calls.
package staleness

// Package arch holds no code: its tests check the layering of Starling's
// packages (which may import which, which stay pure), so that a change that
// breaks the architecture fails a test instead of a review.
package arch

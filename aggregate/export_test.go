package aggregate

import "time"

// DelayTimers makes every watchdog and send deadline of r fire d late, as
// timers do on a busy machine.
func DelayTimers(r *Runner, d time.Duration) { r.late = d }

// Package progress draws a one-line progress bar on a terminal, or prints
// occasional plain lines when the output is a file or pipe.
package progress

import (
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"
)

// Bar renders progress to w. It is safe for concurrent use.
type Bar struct {
	mu       sync.Mutex
	w        io.Writer
	tty      bool
	last     time.Time
	lastPct  int
	width    int
	interval time.Duration
	drawn    bool
}

// New returns a bar writing to w; it redraws in place when w is a terminal.
func New(w io.Writer) *Bar {
	return &Bar{w: w, tty: IsTerminal(w), width: 30, interval: 100 * time.Millisecond, lastPct: -1}
}

// IsTerminal reports whether w is a character device.
func IsTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

// Update shows done of total with a status text. On a terminal it redraws
// at most every 100 ms; otherwise it prints a line every 10%.
func (b *Bar) Update(done, total int, status string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	pct := 0
	if total > 0 {
		pct = min(100, done*100/total)
	}
	now := time.Now()
	if b.tty {
		if done < total && now.Sub(b.last) < b.interval {
			return
		}
		b.last = now
		fill := pct * b.width / 100
		fmt.Fprintf(b.w, "\r\x1b[K%s%s %3d%% %s", strings.Repeat("█", fill), strings.Repeat("░", b.width-fill), pct, status)
		b.drawn = true
		return
	}
	if pct/10 == b.lastPct/10 && done < total {
		return
	}
	b.lastPct = pct
	fmt.Fprintf(b.w, "%3d%% %s\n", pct, status)
}

// Println ends the bar's line (on a terminal) and prints a message line.
func (b *Bar) Println(a ...any) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.tty && b.drawn {
		fmt.Fprint(b.w, "\r\x1b[K")
		b.drawn = false
	}
	fmt.Fprintln(b.w, a...)
}

// Done ends the bar's line.
func (b *Bar) Done() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.tty && b.drawn {
		fmt.Fprintln(b.w)
		b.drawn = false
	}
}

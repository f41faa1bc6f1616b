package staleness

import (
	"bufio"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// The scripted scenarios in testdata/*.txt drive a VersionClock, a policy,
// a Mixer, a Buffer and the DC-ASGD compensation one command at a time, in
// the style of etcd-io/raft's interaction tests. A block is a command line,
// a "----" line and the expected output, ending at a blank line:
//
//	recv peer=3 base=7
//	----
//	peer 3 base 7 at 12: τ=5 accept w=0.4082
//
// go test ./staleness -run TestScripts -rewrite rewrites the expected
// outputs; review the diff before committing it.
var rewrite = flag.Bool("rewrite", false, "rewrite the expected outputs of testdata/*.txt")

func TestScripts(t *testing.T) {
	files, err := filepath.Glob("testdata/*.txt")
	if err != nil {
		t.Fatal(err)
	}
	if len(files) == 0 {
		t.Fatal("no scripts in testdata")
	}
	for _, f := range files {
		t.Run(strings.TrimSuffix(filepath.Base(f), ".txt"), func(t *testing.T) { runScript(t, f) })
	}
}

type scriptBlock struct {
	line int
	cmd  string
	want []string
}

func parseScript(t *testing.T, path string) (blocks []scriptBlock, comments map[int][]string) {
	t.Helper()
	fh, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer fh.Close()
	sc := bufio.NewScanner(fh)
	comments = map[int][]string{} // comment lines before block i
	var (
		cur    *scriptBlock
		inWant bool
		n      int
	)
	for sc.Scan() {
		n++
		line := strings.TrimRight(sc.Text(), " \t")
		switch {
		case inWant:
			if line == "" {
				blocks = append(blocks, *cur)
				cur, inWant = nil, false
				continue
			}
			cur.want = append(cur.want, line)
		case cur != nil:
			if line != "----" {
				t.Fatalf("%s:%d: want ---- after the command, got %q", path, n, line)
			}
			inWant = true
		case line == "":
		case strings.HasPrefix(line, "#"):
			comments[len(blocks)] = append(comments[len(blocks)], line)
		default:
			cur = &scriptBlock{line: n, cmd: line}
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if cur != nil {
		if !inWant {
			t.Fatalf("%s:%d: command without ----", path, cur.line)
		}
		blocks = append(blocks, *cur)
	}
	return blocks, comments
}

func runScript(t *testing.T, path string) {
	blocks, comments := parseScript(t, path)
	s := newScriptState()
	var out strings.Builder
	for i, b := range blocks {
		got := s.run(b.cmd)
		if *rewrite {
			for _, c := range comments[i] {
				out.WriteString(c + "\n")
			}
			fmt.Fprintf(&out, "%s\n----\n%s\n\n", b.cmd, got)
			continue
		}
		if want := strings.Join(b.want, "\n"); got != want {
			t.Errorf("%s:%d: %s\ngot:\n%s\nwant:\n%s", path, b.line, b.cmd, got, want)
		}
	}
	if *rewrite {
		for _, c := range comments[len(blocks)] {
			out.WriteString(c + "\n")
		}
		if err := os.WriteFile(path, []byte(strings.TrimRight(out.String(), "\n")+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

var epoch = time.Unix(0, 0).UTC()

type scriptState struct {
	clock  *VersionClock
	policy Policy
	mixer  *Mixer
	buf    *Buffer
	x      []float32
}

func newScriptState() *scriptState {
	return &scriptState{clock: NewVersionClock(0, 30*time.Second)}
}

// run executes one command and returns its output; errors become output
// lines so that scripts can expect them.
func (s *scriptState) run(cmd string) string {
	out, err := s.exec(cmd)
	if err != nil {
		return "error: " + err.Error()
	}
	return out
}

func (s *scriptState) exec(cmd string) (string, error) {
	fields := strings.Fields(cmd)
	name, args := fields[0], map[string]string{}
	var pos []string
	for _, f := range fields[1:] {
		if k, v, ok := strings.Cut(f, "="); ok {
			args[k] = v
		} else {
			pos = append(pos, f)
		}
	}
	u := func(k string) uint64 {
		v, err := strconv.ParseUint(args[k], 10, 64)
		if err != nil {
			panic(fmt.Sprintf("script: %s: bad %s=%q", cmd, k, args[k]))
		}
		return v
	}
	f := func(k string) float64 {
		v, err := strconv.ParseFloat(args[k], 64)
		if err != nil {
			panic(fmt.Sprintf("script: %s: bad %s=%q", cmd, k, args[k]))
		}
		return v
	}
	at := func() time.Time {
		d, err := time.ParseDuration(args["t"])
		if err != nil {
			panic(fmt.Sprintf("script: %s: bad t=%q", cmd, args["t"]))
		}
		return epoch.Add(d)
	}
	vec := func(k string) []float32 { return parseVec(cmd, args[k]) }

	switch name {
	case "policy":
		p, err := Parse(strings.Join(pos, " "))
		if err != nil {
			return "", err
		}
		s.policy = p
		return p.String(), nil
	case "clock":
		s.clock.Set(Version(u("v")))
		return fmt.Sprintf("local %d", s.clock.Local()), nil
	case "tick":
		n := uint64(1)
		if _, ok := args["n"]; ok {
			n = u("n")
		}
		for range n {
			s.clock.Tick()
		}
		return fmt.Sprintf("local %d", s.clock.Local()), nil
	case "recv":
		base := Version(u("base"))
		prefix := fmt.Sprintf("peer %s base %d at %d: ", args["peer"], base, s.clock.Local())
		tau, err := s.clock.Staleness(base)
		if err != nil {
			return prefix + "error: " + err.Error(), nil
		}
		return prefix + s.policy.Decide(tau).String(), nil
	case "weights":
		// weights taus=0,1,5: s(τ) for each τ, bound ignored.
		var b strings.Builder
		for i, ts := range strings.Split(args["taus"], ",") {
			tau, err := strconv.ParseUint(ts, 10, 64)
			if err != nil {
				panic("script: bad tau " + ts)
			}
			if i > 0 {
				b.WriteByte(' ')
			}
			fmt.Fprintf(&b, "s(%d)=%.4f", tau, s.policy.Weight(tau))
		}
		return b.String(), nil
	case "heartbeat":
		s.clock.Observe(args["peer"], Version(u("version")), at())
		return fmt.Sprintf("peer %s at %d (t=%s)", args["peer"], u("version"), args["t"]), nil
	case "gate":
		now := at()
		peer, v, ok := s.clock.Slowest(now)
		d := s.policy.Gate(s.clock.Lag(now))
		if !ok {
			return fmt.Sprintf("local %d, no live peer: %s", s.clock.Local(), d.Action), nil
		}
		return fmt.Sprintf("local %d, slowest %s at %d, lag %d: %s", s.clock.Local(), peer, v, d.Tau, d.Action), nil
	case "expire":
		gone := s.clock.Expire(at())
		if len(gone) == 0 {
			return "expired: none", nil
		}
		return "expired: " + strings.Join(gone, " "), nil
	case "mixer":
		m, err := NewMixer(MixerConfig{Alpha: f("alpha"), Policy: s.policy}, s.clock)
		if err != nil {
			return "", err
		}
		s.mixer, s.x = m, vec("x")
		return fmt.Sprintf("mixer α=%g policy=%s x=%s", m.Config().Alpha, m.Config().Policy, fmtVec(s.x)), nil
	case "mix":
		d, err := s.mixer.Mix(s.x, vec("new"), Version(u("base")))
		if err != nil {
			return "dropped: " + err.Error(), nil
		}
		if d.Action != Accept {
			return d.String(), nil
		}
		return fmt.Sprintf("%s → x=%s local %d", d, fmtVec(s.x), s.clock.Local()), nil
	case "buffer":
		b, err := NewBuffer(len(vec("x")), BufferConfig{K: int(u("k")), ServerLR: f("lr"), Policy: s.policy}, s.clock)
		if err != nil {
			return "", err
		}
		s.buf, s.x = b, vec("x")
		return fmt.Sprintf("buffer K=%d η=%g policy=%s x=%s", b.Config().K, b.Config().ServerLR, b.Config().Policy, fmtVec(s.x)), nil
	case "delta":
		d, flushed, err := s.buf.Add(s.x, vec("d"), Version(u("base")))
		if err != nil {
			return "dropped: " + err.Error(), nil
		}
		if d.Action != Accept {
			return d.String(), nil
		}
		if flushed {
			return fmt.Sprintf("%s → step x=%s local %d", d, fmtVec(s.x), s.clock.Local()), nil
		}
		return fmt.Sprintf("%s buffered %d/%d", d, s.buf.Len(), s.buf.Config().K), nil
	case "flush":
		ok, err := s.buf.Flush(s.x)
		if err != nil {
			return "", err
		}
		if !ok {
			return "empty", nil
		}
		return fmt.Sprintf("step x=%s local %d", fmtVec(s.x), s.clock.Local()), nil
	case "stats":
		var st Stats
		switch pos[0] {
		case "mixer":
			st = s.mixer.Stats()
		case "buffer":
			st = s.buf.Stats()
		default:
			panic("script: stats mixer|buffer")
		}
		var h []string
		for tau, c := range st.Tau {
			if c > 0 {
				h = append(h, fmt.Sprintf("τ%d:%d", tau, c))
			}
		}
		return fmt.Sprintf("%s\nτ histogram: %s", st, strings.Join(h, " ")), nil
	case "dc":
		lam := float32(f("lambda"))
		got, err := Compensate(nil, vec("g"), vec("w"), vec("bak"), lam)
		if err != nil {
			return "", err
		}
		return fmtVec(got), nil
	}
	panic("script: unknown command " + name)
}

func parseVec(cmd, s string) []float32 {
	if s == "" {
		return []float32{}
	}
	parts := strings.Split(s, ",")
	v := make([]float32, len(parts))
	for i, p := range parts {
		f, err := strconv.ParseFloat(p, 32)
		if err != nil {
			panic(fmt.Sprintf("script: %s: bad number %q", cmd, p))
		}
		v[i] = float32(f)
	}
	return v
}

func fmtVec(v []float32) string {
	var b strings.Builder
	b.WriteByte('[')
	for i, f := range v {
		if i > 0 {
			b.WriteByte(' ')
		}
		fmt.Fprintf(&b, "%.4g", f)
	}
	b.WriteByte(']')
	return b.String()
}

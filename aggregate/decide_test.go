package aggregate

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/starling-ml/starling/peerid"
)

var kindNames = map[string]kind{
	"stall": kindStall, "timeout": kindTimeout, "unreachable": kindUnreachable, "length": kindBadLength,
	"value": kindBadValue, "mismatch": kindMismatch, "config": kindConfig, "starved": kindStarved, "gone": kindGone,
}

var sentinels = map[string]error{
	"ErrExcluded": ErrExcluded, "ErrBadLength": ErrBadLength, "ErrBadValue": ErrBadValue,
	"ErrGroupMismatch": ErrGroupMismatch, "ErrConfigMismatch": ErrConfigMismatch,
	"ErrOverflow": ErrOverflow, "ErrZeroWeight": ErrZeroWeight,
}

// TestDecideScenarios runs the scripted scenarios of testdata/decide.txt.
func TestDecideScenarios(t *testing.T) {
	f, err := os.Open("testdata/decide.txt")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	const myCfg, otherDigest = 1, 0xd1ffe7e27
	var (
		name  string
		a     *attempt
		self  int
		lines []string
	)
	run := func(want []string) {
		t.Run(name, func(t *testing.T) {
			// The deciding member's own settings are those of its vote.
			a.cfg, a.src = a.votes[self].v.cfg, make([]float32, a.votes[self].v.d)
			a.rank = self
			a.r = &Runner{self: a.g.members[self], log: discardLogger()}
			out, err := a.decide()
			desc := fmt.Sprintf("%s\n  got commit=%v excluded=%v err=%v", strings.Join(lines, "\n  "), out.commit, out.excluded, err)
			switch want[0] {
			case "commit":
				if err != nil || !out.commit {
					t.Fatal(desc)
				}
			case "exclude":
				if err != nil || out.commit || len(out.excluded) != len(want)-1 {
					t.Fatal(desc)
				}
				for i, w := range want[1:] {
					r, k, _ := strings.Cut(w, ":")
					rank, _ := strconv.Atoi(r)
					pe := out.excluded[i]
					if pe.Peer != a.g.members[rank] || !errors.Is(pe, kindNames[k].err()) {
						t.Fatalf("exclusion %d: want %s\n%s", i, w, desc)
					}
				}
			case "error":
				if err == nil {
					t.Fatal(desc)
				}
				for _, s := range want[1:] {
					if !errors.Is(err, sentinels[s]) {
						t.Fatalf("want %s\n%s", s, desc)
					}
				}
				if slices.Contains(want, "ErrExcluded") {
					var pe *PeerError
					if !errors.As(err, &pe) || pe.Peer != a.g.members[self] {
						t.Fatalf("the error does not name this member\n%s", desc)
					}
				}
			default:
				t.Fatalf("bad want %q", want)
			}
		})
	}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		w := strings.Fields(line)
		if w[0] != "scenario" {
			lines = append(lines, line)
		}
		switch w[0] {
		case "scenario":
			name, lines = strings.Join(w[1:], "_"), nil
		case "members":
			n, _ := strconv.Atoi(w[1])
			members := make([]peerid.ID, n)
			for i := range members {
				members[i] = peerid.ID(fmt.Sprintf("p%d", i))
			}
			g := Group{round: 1, members: members}
			g.digest = g.computeDigest()
			a = &attempt{g: g, n: n, votes: make([]peerVote, n)}
		case "self":
			self, _ = strconv.Atoi(w[1])
		case "vote":
			r, _ := strconv.Atoi(w[1])
			pv := peerVote{digest: a.g.digest, known: true, v: vote{cfg: myCfg, d: 100, blame: make([]kind, a.n)}}
			switch w[2] {
			case "ok":
				pv.state, pv.v.ok = voteGot, true
			case "fail":
				pv.state = voteGot
			case "missing":
				pv = peerVote{}
			case "other":
				pv.state, pv.digest, pv.known = voteOther, otherDigest, false
			}
			for i := 3; i < len(w); i++ {
				switch w[i] {
				case "blame":
					for ; i+1 < len(w) && strings.Contains(w[i+1], ":"); i++ {
						r, k, _ := strings.Cut(w[i+1], ":")
						j, _ := strconv.Atoi(r)
						pv.v.blame[j] = kindNames[k]
					}
				case "cfg":
					pv.v.cfg, _ = strconv.ParseUint(w[i+1], 10, 64)
					pv.known = true
					i++
				case "d":
					pv.v.d, _ = strconv.ParseUint(w[i+1], 10, 64)
					i++
				case "fault":
					pv.v.fault = map[string]groupFault{"overflow": faultOverflow, "zero": faultZeroWeight}[w[i+1]]
					i++
				default:
					t.Fatalf("bad vote line %q", line)
				}
			}
			a.votes[r] = pv
		case "want":
			run(w[1:])
		default:
			t.Fatalf("bad line %q", line)
		}
	}
}

package sim

import (
	"encoding/csv"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/starling-ml/starling/internal/plot"
	"github.com/starling-ml/starling/train"
)

// Result is an evaluated experiment.
type Result struct {
	Config  Config
	Points  []train.Point // every snapshot, evaluated, in time order
	Events  []train.Event // merges, drops, exchanges, publications, rounds
	Mean    []MeanPoint   // accuracy over peers through time
	Summary Summary
}

// MeanPoint is the swarm's accuracy at one time: the mean (and minimum)
// over peers of each one's latest evaluated snapshot. Points start once
// every peer has one.
type MeanPoint struct {
	Seconds float64
	Mean    float64
	Min     float64
	Updates int // local steps summed over peers
}

// Summary is what summary.json holds.
type Summary struct {
	Label    string  `json:"label"`
	Strategy string  `json:"strategy"`
	Policy   string  `json:"policy,omitempty"`
	Peers    int     `json:"peers"`
	Seed     uint64  `json:"seed"`
	WallS    float64 `json:"wall_s"`
	// FinalAccuracy is the mean over peers of each one's last test
	// accuracy; FinalMin the lowest.
	FinalAccuracy float64 `json:"final_accuracy"`
	FinalMin      float64 `json:"final_min_accuracy"`
	// Target, and the first time (s) and summed local steps at which the
	// mean accuracy over peers reached it; -1 when it did not.
	Target          float64 `json:"target,omitempty"`
	TimeToTarget    float64 `json:"time_to_target_s"`
	UpdatesToTarget int     `json:"updates_to_target"`
	// Steps is the local SGD steps of all peers together.
	Steps int `json:"steps"`
	// Merges, staleness and drops of asynchronous strategies.
	Merges    int               `json:"merges,omitempty"`
	MeanTau   float64           `json:"mean_staleness,omitempty"`
	MaxTau    int               `json:"max_staleness,omitempty"`
	Drops     map[string]uint64 `json:"drops,omitempty"`
	Exchanges int               `json:"exchanges,omitempty"`
	// BytesSent counts the bytes strategies reported sending (async:
	// published payloads, once per publication; gossip: exchanges).
	BytesSent int64 `json:"bytes_sent"`
	Snapshots int   `json:"snapshots"`
	// Scale is the run's cost and its control plane's dissemination.
	Scale   Scale  `json:"scale"`
	PerPeer []any  `json:"per_peer"`
	Config  Config `json:"config"`
}

func (r *Result) summarise(wall time.Duration, perPeer []any) {
	c := r.Config
	s := Summary{Label: c.Label(), Strategy: c.Strategy, Peers: c.Peers, Seed: c.Seed, WallS: wall.Seconds(),
		Target: c.Target, TimeToTarget: -1, UpdatesToTarget: -1, Snapshots: len(r.Points), PerPeer: perPeer, Config: c}
	if c.Strategy == "fedasync" || c.Strategy == "fedbuff" {
		s.Policy = c.Async.Policy.String()
	}
	r.Mean = meanCurve(r.Points, c.Peers)
	last := map[string]train.Point{}
	for _, p := range r.Points {
		last[p.Peer] = p
	}
	s.FinalMin = math.Inf(1)
	for _, p := range last {
		s.FinalAccuracy += p.Accuracy / float64(len(last))
		s.FinalMin = min(s.FinalMin, p.Accuracy)
		s.Steps += p.Updates
	}
	if len(last) == 0 {
		s.FinalMin = 0
	}
	if c.Target > 0 {
		for _, m := range r.Mean {
			if m.Mean >= c.Target {
				s.TimeToTarget, s.UpdatesToTarget = m.Seconds, m.Updates
				break
			}
		}
	}
	tauSum := 0
	for _, e := range r.Events {
		switch {
		case e.Kind == "merge":
			s.Merges++
			tauSum += e.Staleness
			s.MaxTau = max(s.MaxTau, e.Staleness)
		case strings.HasPrefix(e.Kind, "drop:"):
			if s.Drops == nil {
				s.Drops = map[string]uint64{}
			}
			s.Drops[strings.TrimPrefix(e.Kind, "drop:")]++
		case e.Kind == "exchange":
			s.Exchanges++
		}
		s.BytesSent += e.Bytes
	}
	if s.Merges > 0 {
		s.MeanTau = float64(tauSum) / float64(s.Merges)
	}
	r.Summary = s
}

// meanCurve walks the points in time order and, once every peer has one,
// records the mean and minimum of each peer's latest accuracy.
func meanCurve(pts []train.Point, peers int) []MeanPoint {
	acc := map[string]float64{}
	upd := map[string]int{}
	var out []MeanPoint
	for _, p := range pts {
		acc[p.Peer], upd[p.Peer] = p.Accuracy, p.Updates
		if len(acc) < peers {
			continue
		}
		m := MeanPoint{Seconds: p.At.Seconds(), Min: math.Inf(1)}
		for n, a := range acc {
			m.Mean += a / float64(len(acc))
			m.Min = min(m.Min, a)
			m.Updates += upd[n]
		}
		out = append(out, m)
	}
	return out
}

// AccuracyAtUpdates returns the mean accuracy over peers at the first
// point where the peers had done at least u local steps in all (0 if
// never).
func (r *Result) AccuracyAtUpdates(u int) float64 {
	for _, m := range r.Mean {
		if m.Updates >= u {
			return m.Mean
		}
	}
	return 0
}

// StalenessHistogram counts merged contributions by staleness τ.
func (r *Result) StalenessHistogram() map[int]int {
	h := map[int]int{}
	for _, e := range r.Events {
		if e.Kind == "merge" {
			h[e.Staleness]++
		}
	}
	return h
}

// WriteFiles writes the run's files into dir (created if needed):
//
//	points.csv         every evaluated snapshot: peer, seconds, updates, loss, accuracy
//	mean.csv           mean and minimum accuracy over peers through time
//	events.csv         merges (with τ and weight), drops, exchanges, publications
//	summary.json       Summary
//	accuracy_time.png  accuracy vs wall-clock, per peer and mean
//	accuracy_time_zoom.png  the same, high-accuracy end only
//	accuracy_updates.png  accuracy vs local steps, per peer
//	staleness.png      histogram of τ over merged contributions (async strategies)
func (r *Result) WriteFiles(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	if err := writeFile(filepath.Join(dir, "points.csv"), func(f *os.File) error { return train.WritePointsCSV(f, r.Points) }); err != nil {
		return err
	}
	if err := writeCSV(filepath.Join(dir, "mean.csv"), []string{"seconds", "mean_accuracy", "min_accuracy", "updates"}, len(r.Mean), func(i int) []string {
		m := r.Mean[i]
		return []string{ff(m.Seconds, 3), ff(m.Mean, 4), ff(m.Min, 4), strconv.Itoa(m.Updates)}
	}); err != nil {
		return err
	}
	if err := writeCSV(filepath.Join(dir, "events.csv"), []string{"peer", "seconds", "kind", "staleness", "weight", "bytes", "loss"}, len(r.Events), func(i int) []string {
		e := r.Events[i]
		return []string{e.Peer, ff(e.At.Seconds(), 4), e.Kind, strconv.Itoa(e.Staleness), ff(e.Weight, 5), strconv.FormatInt(e.Bytes, 10), ff(e.Loss, 5)}
	}); err != nil {
		return err
	}
	if err := writeFile(filepath.Join(dir, "summary.json"), func(f *os.File) error {
		enc := json.NewEncoder(f)
		enc.SetIndent("", "  ")
		return enc.Encode(r.Summary)
	}); err != nil {
		return err
	}
	byPeer := map[string]*plot.Series{}
	byPeerU := map[string]*plot.Series{}
	var names []string
	for _, p := range r.Points {
		s := byPeer[p.Peer]
		if s == nil {
			label := p.Peer
			if f := r.Config.Slow[peerIndex(p.Peer)]; f > 1 {
				label += fmt.Sprintf(" (%g× slower)", f)
			}
			s, byPeerU[p.Peer] = &plot.Series{Name: label}, &plot.Series{Name: label}
			byPeer[p.Peer] = s
			names = append(names, p.Peer)
		}
		s.X, s.Y = append(s.X, p.At.Seconds()), append(s.Y, p.Accuracy)
		u := byPeerU[p.Peer]
		u.X, u.Y = append(u.X, float64(p.Updates)), append(u.Y, p.Accuracy)
	}
	sort.Slice(names, func(a, b int) bool { return peerIndex(names[a]) < peerIndex(names[b]) })
	mean := plot.Series{Name: "mean over peers"}
	for _, m := range r.Mean {
		mean.X, mean.Y = append(mean.X, m.Seconds), append(mean.Y, m.Mean)
	}
	var timeS, updS []plot.Series
	timeS = append(timeS, mean)
	for _, n := range names {
		timeS = append(timeS, *byPeer[n])
		updS = append(updS, *byPeerU[n])
	}
	title := fmt.Sprintf("%s, %d peers", r.Summary.Label, r.Config.Peers)
	if err := plot.Lines(filepath.Join(dir, "accuracy_time.png"), title, "wall-clock (s)", "test accuracy", timeS); err != nil {
		return err
	}
	if err := plot.Lines(filepath.Join(dir, "accuracy_time_zoom.png"), title, "wall-clock (s)", "test accuracy", zoom(timeS, zoomFloor(timeS))); err != nil {
		return err
	}
	if err := plot.Lines(filepath.Join(dir, "accuracy_updates.png"), title, "local steps of the peer", "test accuracy", updS); err != nil {
		return err
	}
	if h := r.StalenessHistogram(); len(h) > 0 {
		h, xlabel := binHistogram(h, 64)
		if err := plot.Histogram(filepath.Join(dir, "staleness.png"), "staleness of merged contributions, "+title, xlabel, h); err != nil {
			return err
		}
	}
	return nil
}

// binHistogram merges a histogram of τ into at most about maxBins bins of
// equal width and returns it with the axis label.
func binHistogram(h map[int]int, maxBins int) (map[int]int, string) {
	top := 0
	for k := range h {
		top = max(top, k)
	}
	w := top/maxBins + 1
	if w == 1 {
		return h, "τ (versions)"
	}
	out := map[int]int{}
	for k, n := range h {
		out[k/w] += n
	}
	return out, fmt.Sprintf("τ / %d (bins of %d versions)", w, w)
}

func peerIndex(name string) int {
	i, err := strconv.Atoi(strings.TrimPrefix(name, "p"))
	if err != nil {
		return -1
	}
	return i
}

func ff(f float64, prec int) string { return strconv.FormatFloat(f, 'f', prec, 64) }

func writeFile(path string, write func(*os.File) error) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := write(f); err != nil {
		f.Close()
		return fmt.Errorf("sim: writing %s: %w", path, err)
	}
	return f.Close()
}

func writeCSV(path string, header []string, n int, row func(int) []string) error {
	return writeFile(path, func(f *os.File) error {
		w := csv.NewWriter(f)
		w.Write(header)
		for i := range n {
			w.Write(row(i))
		}
		w.Flush()
		return w.Error()
	})
}

// Comparison is one row of a comparison table: a run's label and results,
// with its time to target relative to the baseline's.
type Comparison struct {
	Label         string  `json:"label"`
	Seed          uint64  `json:"seed"`
	FinalAccuracy float64 `json:"final_accuracy"`
	FinalMin      float64 `json:"final_min_accuracy"`
	TimeToTarget  float64 `json:"time_to_target_s"`
	// UpdatesToTarget is the local steps of all peers when the mean
	// accuracy reached the target (-1: not reached).
	UpdatesToTarget int `json:"updates_to_target"`
	// TimeRatio is TimeToTarget over the baseline's (0 when either did
	// not reach the target); AccuracyDelta is FinalAccuracy minus the
	// baseline's, in percentage points.
	TimeRatio     float64 `json:"time_ratio"`
	AccuracyDelta float64 `json:"accuracy_delta_pp"`
	// AccAtUpdates is the mean accuracy over peers once the swarm had
	// done AtUpdates local steps in all (the fewest any compared run did):
	// a comparison that does not depend on how much CPU each run got.
	AtUpdates    int     `json:"at_updates"`
	AccAtUpdates float64 `json:"accuracy_at_updates"`
	MeanTau      float64 `json:"mean_staleness"`
	Merges       int     `json:"merges"`
	Steps        int     `json:"steps"`
	Dropped      uint64  `json:"dropped"`
	WallS        float64 `json:"wall_s"`
}

// Compare tabulates results against the baseline (the run labelled
// baseline with the same seed, or none when baseline is "").
func Compare(results []*Result, baseline string) []Comparison {
	base := map[uint64]*Result{}
	for _, r := range results {
		if r.Summary.Label == baseline {
			base[r.Config.Seed] = r
		}
	}
	at := -1
	for _, r := range results {
		if n := len(r.Mean); n > 0 && (at < 0 || r.Mean[n-1].Updates < at) {
			at = r.Mean[n-1].Updates
		}
	}
	out := make([]Comparison, 0, len(results))
	for _, r := range results {
		s := r.Summary
		c := Comparison{Label: s.Label, Seed: s.Seed, FinalAccuracy: s.FinalAccuracy, FinalMin: s.FinalMin,
			TimeToTarget: s.TimeToTarget, UpdatesToTarget: s.UpdatesToTarget, MeanTau: s.MeanTau, Merges: s.Merges,
			Steps: s.Steps, WallS: s.WallS}
		for _, d := range s.Drops {
			c.Dropped += d
		}
		c.AtUpdates, c.AccAtUpdates = at, r.AccuracyAtUpdates(at)
		if b := base[s.Seed]; b != nil {
			if s.TimeToTarget > 0 && b.Summary.TimeToTarget > 0 {
				c.TimeRatio = s.TimeToTarget / b.Summary.TimeToTarget
			}
			c.AccuracyDelta = 100 * (s.FinalAccuracy - b.Summary.FinalAccuracy)
		}
		out = append(out, c)
	}
	return out
}

// WriteComparison writes compare.csv, compare.json, compare.png (the mean
// accuracy of every run against wall-clock), compare_zoom.png (its
// high-accuracy end) and compare_updates.png (against the local steps of
// all peers) into dir.
func WriteComparison(dir string, results []*Result, baseline string) ([]Comparison, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	rows := Compare(results, baseline)
	err := writeCSV(filepath.Join(dir, "compare.csv"), []string{"label", "seed", "final_accuracy", "final_min_accuracy",
		"time_to_target_s", "updates_to_target", "time_ratio", "accuracy_delta_pp", "at_updates", "accuracy_at_updates", "mean_staleness", "merges",
		"steps", "dropped", "wall_s"}, len(rows), func(i int) []string {
		c := rows[i]
		return []string{c.Label, strconv.FormatUint(c.Seed, 10), ff(c.FinalAccuracy, 4), ff(c.FinalMin, 4), ff(c.TimeToTarget, 2),
			strconv.Itoa(c.UpdatesToTarget), ff(c.TimeRatio, 3), ff(c.AccuracyDelta, 2), strconv.Itoa(c.AtUpdates), ff(c.AccAtUpdates, 4), ff(c.MeanTau, 2),
			strconv.Itoa(c.Merges), strconv.Itoa(c.Steps), strconv.FormatUint(c.Dropped, 10), ff(c.WallS, 1)}
	})
	if err != nil {
		return nil, err
	}
	if err := writeFile(filepath.Join(dir, "compare.json"), func(f *os.File) error {
		enc := json.NewEncoder(f)
		enc.SetIndent("", "  ")
		return enc.Encode(rows)
	}); err != nil {
		return nil, err
	}
	var series []plot.Series
	seeds := map[uint64]bool{}
	for _, r := range results {
		seeds[r.Config.Seed] = true
	}
	for _, r := range results {
		name := r.Summary.Label
		if len(seeds) > 1 {
			name += fmt.Sprintf(" seed %d", r.Config.Seed)
		}
		s := plot.Series{Name: name}
		for _, m := range r.Mean {
			s.X, s.Y = append(s.X, m.Seconds), append(s.Y, m.Mean)
		}
		series = append(series, s)
	}
	title := "mean test accuracy over peers"
	if len(results) > 0 {
		c := results[0].Config
		title += fmt.Sprintf(", %d peers", c.Peers)
		if len(c.Slow) > 0 {
			keys := make([]int, 0, len(c.Slow))
			for k := range c.Slow {
				keys = append(keys, k)
			}
			slices.Sort(keys)
			var parts []string
			for _, k := range keys {
				parts = append(parts, fmt.Sprintf("p%d %g×", k, c.Slow[k]))
			}
			title += ", slow: " + strings.Join(parts, " ")
		}
	}
	var byUpd []plot.Series
	for i, r := range results {
		s := plot.Series{Name: series[i].Name}
		for _, m := range r.Mean {
			s.X, s.Y = append(s.X, float64(m.Updates)), append(s.Y, m.Mean)
		}
		byUpd = append(byUpd, s)
	}
	if len(seeds) > 1 {
		// One curve per configuration, averaged over the seeds (each run
		// seen as a step function); every run's own curve goes to
		// compare_runs.png.
		if err := plot.Lines(filepath.Join(dir, "compare_runs.png"), title, "wall-clock (s)", "test accuracy", series); err != nil {
			return nil, err
		}
		labels := make([]string, len(results))
		for i, r := range results {
			labels[i] = r.Summary.Label
		}
		title += fmt.Sprintf(", mean of %d seeds", len(seeds))
		series, byUpd = averageSeries(labels, series), averageSeries(labels, byUpd)
	}
	if err := plot.Lines(filepath.Join(dir, "compare.png"), title, "wall-clock (s)", "test accuracy", series); err != nil {
		return nil, err
	}
	if err := plot.Lines(filepath.Join(dir, "compare_updates.png"), title, "local steps of all peers", "test accuracy", byUpd); err != nil {
		return nil, err
	}
	return rows, plot.Lines(filepath.Join(dir, "compare_zoom.png"), title, "wall-clock (s)", "test accuracy", zoom(series, zoomFloor(series)))
}

// averageSeries merges the series that share a label (labels[i] is
// series[i]'s) into their mean, in the order labels first appear. Each
// series is read as a step function (its last value at or before x); the
// mean is taken on 200 points up to the shortest series' end, so that
// every point averages all of them.
func averageSeries(labels []string, series []plot.Series) []plot.Series {
	var order []string
	groups := map[string][]plot.Series{}
	for i, l := range labels {
		if _, ok := groups[l]; !ok {
			order = append(order, l)
		}
		groups[l] = append(groups[l], series[i])
	}
	out := make([]plot.Series, 0, len(order))
	for _, l := range order {
		g := groups[l]
		lo, hi := math.Inf(1), math.Inf(1)
		for _, s := range g {
			if len(s.X) == 0 {
				continue
			}
			lo, hi = min(lo, s.X[0]), min(hi, s.X[len(s.X)-1])
		}
		avg := plot.Series{Name: l}
		if math.IsInf(hi, 0) || hi < lo {
			out = append(out, avg)
			continue
		}
		const points = 200
		for k := range points + 1 {
			x := lo + (hi-lo)*float64(k)/points
			sum, n := 0.0, 0
			for _, s := range g {
				// The last point at or before x.
				if j := sort.SearchFloat64s(s.X, x+1e-12) - 1; j >= 0 {
					sum += s.Y[j]
					n++
				}
			}
			if n == len(g) {
				avg.X, avg.Y = append(avg.X, x), append(avg.Y, sum/float64(n))
			}
		}
		out = append(out, avg)
	}
	return out
}

// zoomFloor returns a lower accuracy bound that shows where runs differ:
// the lowest final accuracy less 3 points, at most 0.9.
func zoomFloor(series []plot.Series) float64 {
	floor := 0.9
	for _, s := range series {
		if n := len(s.Y); n > 0 {
			floor = min(floor, s.Y[n-1]-0.03)
		}
	}
	return floor
}

// zoom keeps the points of each series at or above floor, so that the
// plot's axis spans only the high-accuracy end.
func zoom(series []plot.Series, floor float64) []plot.Series {
	out := make([]plot.Series, len(series))
	for i, s := range series {
		out[i].Name = s.Name
		for j := range s.X {
			if s.Y[j] >= floor {
				out[i].X, out[i].Y = append(out[i].X, s.X[j]), append(out[i].Y, s.Y[j])
			}
		}
	}
	return out
}

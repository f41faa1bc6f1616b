package main

import (
	"bytes"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestLowCommRows checks the strategies the rows run: equal inner steps
// (sync's steps, the DiLoCo rows' rounds of h), the streaming parameters
// added where they belong, fp4 where the name says so.
func TestLowCommRows(t *testing.T) {
	c := lowCommConfig{Peers: 4, Steps: 1280, H: 64, Fragments: 4, Tau: 8, SDExtra: "lr=1", Async: "momentum=0.5", Demo: "bits=3", DemoLR: "0.01"}
	rows := lowCommRows(c)
	arg := func(r lowCommRow, flag string) string {
		i := slices.Index(r.Args, flag)
		if i < 0 || i+1 == len(r.Args) {
			return ""
		}
		return r.Args[i+1]
	}
	want := map[string]string{
		"solo":              "diloco:h=64",
		"sdlc-fp4":          "streaming-diloco:h=64,fragments=4,lr=1",
		"sdlc-fp4-a0":       "streaming-diloco:h=64,fragments=4,lr=1,alpha=0",
		"sdlc-fp4-overlap":  "streaming-diloco:h=64,fragments=4,lr=1,overlap=8",
		"sdlc-fp32-overlap": "streaming-diloco:h=64,fragments=4,lr=1,overlap=8",
		"diloco-fp4":        "streaming-diloco:h=64,fragments=1,alpha=0",
		"async-diloco-fp4":  "async-diloco:h=64,momentum=0.5",
		"demo":              "demo:bits=3",
	}
	seen := map[string]bool{}
	for _, r := range rows {
		if seen[r.Name] {
			t.Errorf("row %s twice", r.Name)
		}
		seen[r.Name] = true
		if s, ok := want[r.Name]; ok && arg(r, "--strategy") != s {
			t.Errorf("%s: --strategy %q, want %q", r.Name, arg(r, "--strategy"), s)
		}
		switch arg(r, "--mode") {
		case "sync":
			if arg(r, "--steps") != "1280" {
				t.Errorf("%s: --steps %q", r.Name, arg(r, "--steps"))
			}
		case "federated":
			if arg(r, "--rounds") != "20" {
				t.Errorf("%s: --rounds %q, want 1280/64", r.Name, arg(r, "--rounds"))
			}
		default:
			t.Errorf("%s: --mode %q", r.Name, arg(r, "--mode"))
		}
		if fp4 := arg(r, "--compress") == "fp4"; fp4 != strings.Contains(r.Name, "fp4") {
			t.Errorf("%s: --compress %q", r.Name, arg(r, "--compress"))
		}
		if r.Solo != (r.Name == "solo") {
			t.Errorf("%s: solo %v", r.Name, r.Solo)
		}
	}
	if arg(rows[slices.IndexFunc(rows, func(r lowCommRow) bool { return r.Name == "demo" })], "--lr") != "0.01" {
		t.Error("demo row without --demo-lr's rate")
	}
	got, err := selectRows(rows, []string{"sdlc-fp4", "sync"})
	if err != nil || len(got) != 2 || got[0].Name != "sync" || got[1].Name != "sdlc-fp4" {
		t.Errorf("selectRows: %v, %v; want sync, sdlc-fp4 in run order", rowNames(got), err)
	}
	if _, err := selectRows(rows, []string{"sync", "sdlc"}); err == nil || !strings.Contains(err.Error(), `"sdlc"`) {
		t.Errorf("selectRows of an unknown row: %v", err)
	}
}

// TestSummarizeRow reads a row's files as the peers leave them: a trace
// cut short by a killed peer, a summary with an error, a missing one.
func TestSummarizeRow(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) {
		t.Helper()
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	span := func(cat, name string, durUS float64) string {
		return fmt.Sprintf(`{"name":%q,"cat":%q,"ph":"X","ts":1,"dur":%g,"pid":1,"tid":1}`, name, cat, durUS)
	}
	write("o0/summary.json", `{"val_bits_per_char": 2.0, "tensor_bytes_sent": 1000}`)
	write("trace0.json", "["+span("net", "allreduce", 2e6)+",\n"+span("train", "wait", 5e5)+",\n"+span("net", "allreduce", 1e6)+"]")
	write("o1/summary.json", `{"val_bits_per_char": 3.0, "tensor_bytes_sent": 3000, "error": "the swarm fell apart"}`)
	write("trace1.json", "["+span("net", "allreduce", 1e6)+",\n"+span("train", "wait", 1e6)+`,{"name":"allre`)
	res := summarizeRow(dir, 3, "sdlc-fp4-overlap", 7*time.Second)
	if res.BitsPerChar != 2.5 || res.BytesPerPeer != 2000 || res.WallS != 7 {
		t.Errorf("bits %v, bytes %v, wall %v; want 2.5, 2000, 7", res.BitsPerChar, res.BytesPerPeer, res.WallS)
	}
	if res.AllReduceS != 2 || res.ExposedS != 0.75 {
		t.Errorf("all-reduce %v s, exposed %v s; want 2 and 0.75 (the overlap row's waits)", res.AllReduceS, res.ExposedS)
	}
	if len(res.Errors) != 2 || !strings.Contains(res.Errors[0], "fell apart") || !strings.Contains(res.Errors[1], "peer 2") {
		t.Errorf("errors %q", res.Errors)
	}
	if res := summarizeRow(dir, 2, "sdlc-fp4", time.Second); res.ExposedS != res.AllReduceS {
		t.Errorf("without overlap the all-reduce blocks: exposed %v, all-reduce %v", res.ExposedS, res.AllReduceS)
	}
	var b bytes.Buffer
	againstSync(&b, []lowCommResult{{Row: "sync", BitsPerChar: 2, BytesPerPeer: 1000}, {Row: "sdlc-fp4", BitsPerChar: 2.06, BytesPerPeer: 2.5}, {Row: "solo", BitsPerChar: 3}})
	if want := "# against sync: bytes × fewer, val loss change\nsync\t1.0x\t+0.00%\nsdlc-fp4\t400.0x\t+3.00%\nsolo\tinfx\t+50.00%\n"; b.String() != want {
		t.Errorf("against sync:\n%s\nwant\n%s", b.String(), want)
	}
}

// TestExperimentLowComm runs two rows of two peer processes on a tiny
// charlm: both finish without errors, Streaming DiLoCo sends fewer bytes
// than sync, and a row whose peers outlive --peer-timeout is stopped and
// reported, failing the command.
func TestExperimentLowComm(t *testing.T) {
	bin := binary(t)
	corpus := tinyCorpus(t)
	common := []string{"experiment", "lowcomm", "--peers", "2", "--steps", "8", "--h", "4", "--fragments", "2",
		"--model", tinyCharLM, "--data", corpus, "--extra", "--batch 8 --stall-timeout 2s"}
	out, err := exec.Command(bin, append(common, "--rows", "sync,sdlc-fp4", "--json", filepath.Join(t.TempDir(), "r.json"))...).CombinedOutput()
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	rows := map[string][]string{}
	for _, l := range strings.Split(string(out), "\n") {
		if f := strings.Split(l, "\t"); len(f) == 7 && f[0] != "row" {
			rows[f[0]] = f
		}
	}
	for _, name := range []string{"sync", "sdlc-fp4"} {
		f := rows[name]
		if f == nil {
			t.Fatalf("no %s row in\n%s", name, out)
		}
		if bits, _ := strconv.ParseFloat(f[1], 64); !(bits > 0) || math.IsInf(bits, 0) || f[6] != "" {
			t.Errorf("%s: bits %s, errors %q", name, f[1], f[6])
		}
	}
	syncB, _ := strconv.ParseFloat(rows["sync"][2], 64)
	sdB, _ := strconv.ParseFloat(rows["sdlc-fp4"][2], 64)
	if !(sdB > 0 && syncB > 4*sdB) {
		t.Errorf("bytes: sync %v, sdlc-fp4 %v", syncB, sdB)
	}
	if !strings.Contains(string(out), "# against sync") {
		t.Errorf("no comparison with sync in\n%s", out)
	}

	start := time.Now()
	out, err = exec.Command(bin, append(common, "--rows", "sync", "--steps", "1000000", "--peer-timeout", "3s")...).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "stopped after --peer-timeout 3s") {
		t.Errorf("a row past --peer-timeout: %v\n%s", err, out)
	}
	if el := time.Since(start); el > 20*time.Second {
		t.Errorf("the stopped row took %v", el)
	}
}

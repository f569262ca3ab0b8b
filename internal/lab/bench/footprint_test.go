package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/mpdetour/mpdetour/internal/lab"
	"github.com/mpdetour/mpdetour/internal/lab/topology"
	"github.com/mpdetour/mpdetour/internal/testenv"
)

// BenchmarkRelayFootprint measures a relay's memory idle and holding 1,000
// NAT mappings (docs/results/footprint): MPDETOUR_BIN names the binary the
// relay runs (the product binary, `make build-host`: bin/mpdetour;
// default: built here), MPDETOUR_FOOTPRINT_OUT a file for the JSON report.
//
//	make build-host && flock /work/runs/heavy.lock env MPDETOUR_BIN=$PWD/bin/mpdetour \
//	    MPDETOUR_FOOTPRINT_OUT=$PWD/docs/results/footprint/relay.json \
//	    go test -run '^$' -bench RelayFootprint -benchtime 1x ./internal/lab/bench/
func BenchmarkRelayFootprint(b *testing.B) {
	testenv.Root(b)
	testenv.Tools(b, "ip", "nft")
	bin := os.Getenv("MPDETOUR_BIN")
	if bin == "" {
		var err error
		if bin, err = testenv.BuildMpdetour(b.TempDir()); err != nil {
			b.Fatal(err)
		}
	}
	name := fmt.Sprintf("fp%d", os.Getpid()%100000)
	topo, err := topology.Builtin("line")
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	l, err := lab.Up(ctx, topo, name)
	if err != nil {
		b.Fatal(err)
	}
	defer func() {
		if err := l.Down(); err != nil {
			b.Error(err)
		}
	}()
	var rep *RelayFootprintReport
	for b.Loop() {
		if rep, err = RelayFootprint(ctx, RelayFootprintOptions{Lab: l, Binary: bin, Dir: b.TempDir(), Mappings: 1000}); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(rep.Held.RSSKiB)/1024, "MiB-rss-1000-mappings")
	b.ReportMetric(float64(rep.Idle.RSSKiB)/1024, "MiB-rss-idle")
	b.ReportMetric(rep.RSSPerMapping, "B-rss/mapping")
	b.ReportMetric(rep.HeapPerMapping, "B-heap/mapping")
	js, _ := json.MarshalIndent(rep, "", "  ")
	b.Logf("%s", js)
	if out := os.Getenv("MPDETOUR_FOOTPRINT_OUT"); out != "" {
		if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
			b.Fatal(err)
		}
		if err := os.WriteFile(out, append(js, '\n'), 0o644); err != nil {
			b.Fatal(err)
		}
	}
}

package roster

import (
	"context"
	"net/netip"
	"os"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"

	"github.com/mpdetour/mpdetour/internal/collective"
	"github.com/mpdetour/mpdetour/internal/proto"
)

// TestSimulateSmall runs the simulation at a size every run can afford;
// ROSTER_SIM_RELAYS sets another size, ROSTER_SIM_SCALE a time dilation
// (the report's runs use `mpdetour collective simulate`).
func TestSimulateSmall(t *testing.T) {
	n, scale := 30, 1.0
	if s := os.Getenv("ROSTER_SIM_RELAYS"); s != "" {
		n, _ = strconv.Atoi(s)
	}
	if s := os.Getenv("ROSTER_SIM_SCALE"); s != "" {
		scale, _ = strconv.ParseFloat(s, 64)
	}
	res, err := Simulate(context.Background(), SimConfig{Relays: n, Kill: 2, Window: 2 * time.Second, Settle: time.Second, Timeout: time.Minute, TimeScale: scale, Progress: testWriter{t}})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%+v", *res)
	if res.Verified < uint64(n) || res.SteadyBps <= 0 || res.KillDetection <= 0 {
		t.Fatalf("implausible result %+v", *res)
	}
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) { w.t.Log(string(p)); return len(p), nil }

func TestSimAddrs(t *testing.T) {
	seen := map[string]bool{}
	for i := 0; i < 100000; i++ {
		a := simAddrOf(i)
		if _, err := netip.ParseAddrPort(a); err != nil || seen[a] {
			t.Fatalf("relay %d: address %q: %v (duplicate %v)", i, a, err, seen[a])
		}
		seen[a] = true
	}
}

// TestScaleTimes: time dilation multiplies every duration of memberlist's
// configuration (a field a newer memberlist adds fails here until
// scaleTimes scales it too) and leaves everything else alone.
func TestScaleTimes(t *testing.T) {
	orig := memberlist.DefaultLANConfig()
	orig.DeadNodeReclaimTime = 5 * time.Second // zero by default: set as Start does
	mc := *orig
	scaleTimes(&mc, 4)
	a, b := reflect.ValueOf(orig).Elem(), reflect.ValueOf(&mc).Elem()
	durations := 0
	for i := 0; i < a.NumField(); i++ {
		f := a.Type().Field(i)
		if f.Type == reflect.TypeFor[time.Duration]() {
			durations++
			if got, want := b.Field(i).Interface().(time.Duration), 4*a.Field(i).Interface().(time.Duration); got != want {
				t.Errorf("%s: %v after scaling by 4, want %v", f.Name, got, want)
			}
			continue
		}
		if f.IsExported() && f.Type.Comparable() && a.Field(i).Interface() != b.Field(i).Interface() {
			t.Errorf("%s changed by scaling: %v -> %v", f.Name, a.Field(i).Interface(), b.Field(i).Interface())
		}
	}
	if durations < 8 {
		t.Fatalf("%d duration fields in memberlist.Config, expected at least 8", durations)
	}
	same := *orig
	scaleTimes(&same, 1)
	if !reflect.DeepEqual(&same, orig) {
		t.Fatal("scale 1 changed the configuration")
	}
	if _, err := Start(Config{TimeScale: -1, Secret: testSecret, Cert: &collective.Certificate{}, Trust: collective.NewTrust(collective.AuthorityKey{})}, Info{}); err == nil || !strings.Contains(err.Error(), "time scale") {
		t.Fatalf("negative time scale: %v", err)
	}
}

// TestNodeNameStable: the node name stays the one relays of earlier
// builds use (standard base64 made URL-safe, padding trimmed), or mixed
// clusters would refuse each other's entries as name mismatches.
func TestNodeNameStable(t *testing.T) {
	for i := 0; i < 200; i++ {
		k, err := proto.GenerateKey()
		if err != nil {
			t.Fatal(err)
		}
		pub := k.Public()
		want := "relay-" + strings.TrimRight(strings.NewReplacer("+", "-", "/", "_").Replace(pub.String()), "=")
		if got := NodeName(pub); got != want {
			t.Fatalf("NodeName(%s) = %q, want %q", pub, got, want)
		}
	}
}

package roster

import (
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"

	"github.com/mpdetour/mpdetour/internal/collective"
	"github.com/mpdetour/mpdetour/internal/proto"
)

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

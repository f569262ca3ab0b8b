package bench

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/mpdetour/mpdetour/internal/lab/bench/results"
	"github.com/mpdetour/mpdetour/internal/lab/bench/scenario"
	"github.com/mpdetour/mpdetour/internal/testenv"
)

// TestCollective runs procedure collective on a small collective (5
// relays, 2 members, agents using at most 3 discovered relays), two
// trials: each member's agent, configured with one bootstrap relay, gets
// detour subflows through 3 other relays it discovered; a relay killed
// with SIGKILL leaves every other relay's roster and the affected agents,
// whose subflow through it is closed and replaced through another relay;
// the second trial runs after the killed relay was restarted and rejoined.
// The times are the report's; the assertions only need each to happen
// within the procedure's 20 s limit.
func TestCollective(t *testing.T) {
	testenv.Root(t)
	testenv.Tools(t, "ip")
	b := binary(t)
	name := fmt.Sprintf("cl%d", os.Getpid()%100000)
	src := `name: collective-small
topology: collective
set: {relays: "5", clients: "2"}
roles: {client: client1, clients: [client1, client2], server: server, detours: [relay1, relay2, relay3, relay4, relay5]}
trials: 2
configurations: [{name: small}]
procedures: [{procedure: collective, subflows: 3}]
`
	s, err := scenario.Parse("test", []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	out := t.TempDir()
	var progress strings.Builder
	_, err = Run(context.Background(), Options{Scenario: s, Out: out, LabName: name, Binary: b, Progress: &progress})
	defer checkClean(t, name)
	if err != nil {
		t.Fatalf("%v\n%s", err, progress.String())
	}
	recs, err := results.Load(out + "/" + results.TrialsFile)
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 2 {
		t.Fatalf("%d records, want 2\n%s", len(recs), progress.String())
	}
	for _, r := range recs {
		if r.Status != results.OK || r.Collective == nil {
			t.Fatalf("trial %d: %s %s\n%s", r.Trial, r.Status, r.Reason, progress.String())
		}
		c := r.Collective
		t.Logf("trial %d: killed %s (affected %v): out of every roster %.2f s, dropped by the agents %.2f s", r.Trial, c.Killed, c.Affected, c.OutOfRostersS, c.DroppedByAgentsS)
		boot := map[string]bool{}
		for _, cl := range c.Clients {
			boot[cl.Bootstrap] = true
		}
		for _, cl := range c.Clients {
			t.Logf("  %s (bootstrap %s): usable %.2f s, subflows via 3 relays %.2f s, via 3 discovered %.2f s, relays %v",
				cl.Name, cl.Bootstrap, cl.UsableS, cl.DetoursS, cl.DiscoveredDetoursS, cl.Relays)
			var discovered []string
			for _, rl := range cl.Relays {
				if rl != cl.Bootstrap {
					discovered = append(discovered, rl)
				}
			}
			if len(discovered) < 3 || cl.DiscoveredDetoursS < 0 || cl.UsableS < 0 {
				t.Errorf("trial %d %s: subflows through %v besides bootstrap %s (want 3 discovered relays); times %+v", r.Trial, cl.Name, discovered, cl.Bootstrap, cl)
			}
		}
		if c.Killed == "" || boot[c.Killed] || len(c.Affected) == 0 {
			t.Fatalf("trial %d: killed %q affecting %v (bootstraps %v)", r.Trial, c.Killed, c.Affected, boot)
		}
		if c.OutOfRostersS < 0 || len(c.OutOfRosterEachS) != 4 {
			t.Errorf("trial %d: killed relay not out of every roster: %v", r.Trial, c.OutOfRosterEachS)
		}
		for _, cl := range c.Clients {
			if !slices.Contains(c.Affected, cl.Name) {
				continue
			}
			if cl.DroppedS == nil || *cl.DroppedS < 0 || cl.VictimGoneS == nil || *cl.VictimGoneS < 0 || cl.ReplacedS == nil || *cl.ReplacedS < 0 {
				t.Errorf("trial %d %s: killed relay not dropped (%s), its subflow not closed (%s) or not replaced (%s) within the limit (-1: never)",
					r.Trial, cl.Name, pv(cl.DroppedS), pv(cl.VictimGoneS), pv(cl.ReplacedS))
			} else {
				t.Logf("  %s: dropped %.2f s, its subflow closed %.2f s, replaced %.2f s after SIGKILL", cl.Name, *cl.DroppedS, *cl.VictimGoneS, *cl.ReplacedS)
			}
		}
	}
}

func pv(p *float64) string {
	if p == nil {
		return "nil"
	}
	return fmt.Sprintf("%.2f s", *p)
}

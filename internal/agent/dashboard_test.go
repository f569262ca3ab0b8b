package agent

import (
	"encoding/json"
	"os"
	"regexp"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// Every agent metric the Grafana dashboard in deploy/ queries exists (a
// renamed metric would leave an empty panel).
func TestDashboardAgentMetrics(t *testing.T) {
	b, err := os.ReadFile("../../deploy/grafana-mpdetour.json")
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Panels []struct {
			Targets []struct{ Expr string } `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("deploy/grafana-mpdetour.json: %v", err)
	}
	ch := make(chan *prometheus.Desc, 64)
	NewMetrics(nil).Describe(ch)
	close(ch)
	have := map[string]bool{}
	fq := regexp.MustCompile(`fqName: "([^"]+)"`)
	for desc := range ch {
		if m := fq.FindStringSubmatch(desc.String()); m != nil {
			have[m[1]] = true
		}
	}
	re := regexp.MustCompile(`mpdetour_agent_[a-z_]+`)
	n := 0
	for _, p := range d.Panels {
		for _, tg := range p.Targets {
			for _, name := range re.FindAllString(tg.Expr, -1) {
				n++
				if !have[name] {
					t.Errorf("the dashboard queries %s, which the agent does not export (it has %v)", name, have)
				}
			}
		}
	}
	if n < 5 {
		t.Fatalf("the dashboard queries only %d agent metrics", n)
	}
}

package agent

import (
	"regexp"
	"testing"

	"github.com/mpdetour/mpdetour/internal/testenv"
	"github.com/prometheus/client_golang/prometheus"
)

// Every agent metric the Grafana dashboard in deploy/ queries exists (a
// renamed metric would leave an empty panel).
func TestDashboardAgentMetrics(t *testing.T) {
	names := testenv.DashboardMetrics(t, "../../deploy/grafana-mpdetour.json", "mpdetour_agent_")
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
	if len(names) < 5 {
		t.Fatalf("the dashboard queries only %v", names)
	}
	for name := range names {
		if !have[name] {
			t.Errorf("the dashboard queries %s, which the agent does not export (it has %v)", name, have)
		}
	}
}

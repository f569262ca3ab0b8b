package main

import (
	"io"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/mpdetour/mpdetour/internal/agent"
	"github.com/mpdetour/mpdetour/internal/convclient"
)

// TestStatusShowsConversions: a converted connection the agent manages is
// tagged with its destination and listed with its converter; counters and
// converters are printed.
func TestStatusShowsConversions(t *testing.T) {
	st := agent.Status{
		Connections: []agent.ConnStatus{{Token: "0000abcd", Local: "10.0.1.1:40000", Remote: "10.0.2.2:45674", Established: true}},
		Conversions: &convclient.Status{
			Counters:   convclient.Counters{Routed: 3, Converted: 2, Direct: map[string]uint64{"unknown": 1}, Learned: 1, LearnedNoMPTCP: 1},
			Converters: []convclient.ConverterStatus{{Relay: "r2", Address: "10.0.2.2:45674", Tickets: 3, RTTms: 20.5, Used: 2}},
			Recent: []convclient.Conversion{
				{Local: "10.0.1.1:40000", Converter: "10.0.2.2:45674", Name: "r2", Destination: "10.0.3.2:5201", Since: time.Now()},
				{Local: "10.0.1.1:39000", Converter: "10.0.2.2:45674", Name: "r2", Destination: "10.0.3.2:5201", Since: time.Now()},
			},
			NoMPTCP: []convclient.DestStatus{{Destination: "10.0.3.2:5201", Expires: time.Now().Add(time.Hour), Convertible: true, Conversions: 2}},
		},
	}
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	old := os.Stdout
	os.Stdout = w
	printStatus(st)
	os.Stdout = old
	w.Close()
	b, _ := io.ReadAll(r)
	out := string(b)
	for _, want := range []string{"0000abcd (converted to 10.0.3.2:5201)", "2 converted of 3 connects", "direct: unknown 1",
		"r2", "20.5", "CONVERTED CONNECTION", "10.0.1.1:40000", "WITHOUT MPTCP"} {
		if !strings.Contains(out, want) {
			t.Errorf("status lacks %q:\n%s", want, out)
		}
	}
	// The conversion whose connection is gone is not listed as live.
	if strings.Contains(out, "10.0.1.1:39000") {
		t.Errorf("a connection the agent no longer has is listed:\n%s", out)
	}
}

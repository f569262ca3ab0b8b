package run_test

import (
	"fmt"
	"os"
	"testing"
)

// link joins two namespaces with a veth pair and addresses.
func link(t *testing.T, a, b, ifA, ifB, addrA, addrB string) {
	t.Helper()
	mustRun(t, "ip", "-n", a, "link", "add", ifA, "type", "veth", "peer", "name", ifB, "netns", b)
	mustRun(t, "ip", "-n", a, "addr", "add", addrA, "dev", ifA)
	mustRun(t, "ip", "-n", b, "addr", "add", addrB, "dev", ifB)
	mustRun(t, "ip", "-n", a, "link", "set", ifA, "up")
	mustRun(t, "ip", "-n", b, "link", "set", ifB, "up")
}

// An unmodified server under run accepts an extra subflow (MP_JOIN) when
// its namespace's in-kernel PM limit allows it, and refuses it at subflows 0:
// what --check warns about. (Under the userspace PM, pm_type=1, the outcome
// depends on whether any process on the host listens for mptcp_pm events,
// so it is not tested here; see docs/run.md.)
func TestServerAcceptsJoins(t *testing.T) {
	setup(t, "iperf3", "ss")
	for _, c := range []struct {
		serverSubflows string
		pmType         string
		wantJoin       bool
	}{{"2", "0", true}, {"0", "0", false}} {
		t.Run("subflows="+c.serverSubflows+",pm_type="+c.pmType, func(t *testing.T) {
			cl, sv := newNS(t), newNS(t)
			id := fmt.Sprintf("%d", os.Getpid()%10000)
			link(t, cl, sv, "tua"+id, "tub"+id, "10.231.1.1/24", "10.231.1.2/24")
			link(t, cl, sv, "tuc"+id, "tud"+id, "10.231.2.1/24", "10.231.2.2/24")
			// The client's in-kernel PM opens a second subflow from its
			// second address; the server's limit decides whether it joins.
			mustRun(t, "ip", "-n", cl, "mptcp", "limits", "set", "subflows", "2")
			mustRun(t, "ip", "-n", cl, "mptcp", "endpoint", "add", "10.231.2.1", "dev", "tuc"+id, "subflow")
			mustRun(t, "ip", "-n", sv, "mptcp", "limits", "set", "subflows", c.serverSubflows)
			mustRun(t, "ip", "netns", "exec", sv, "sysctl", "-qw", "net.mptcp.pm_type="+c.pmType)
			background(t, inNS(sv, true, nil, "iperf3", "-s", "-1", "-B", "10.231.1.2", "-p", "7005"))
			waitMPTCPListener(t, sv, 7005)
			output(t, inNS(cl, true, nil, "iperf3", "-c", "10.231.1.2", "-p", "7005", "-t", "1", "-J"))
			s := mptcpCounters(t, sv)
			if c.wantJoin && (s["MPJoinSynRx"] < 1 || s["MPJoinAckRx"] < 1) {
				t.Errorf("server took no join with subflows %s: MPJoinSynRx %d MPJoinAckRx %d", c.serverSubflows, s["MPJoinSynRx"], s["MPJoinAckRx"])
			}
			if !c.wantJoin && (s["MPJoinAckRx"] != 0 || s["MPJoinSynRx"] < 1) {
				t.Errorf("server with subflows %s pm_type %s: MPJoinSynRx %d MPJoinAckRx %d, want a refused join", c.serverSubflows, c.pmType, s["MPJoinSynRx"], s["MPJoinAckRx"])
			}
			t.Logf("server MPJoinSynRx %d MPJoinAckRx %d MPJoinRejected %d", s["MPJoinSynRx"], s["MPJoinAckRx"], s["MPJoinRejected"])
		})
	}
}

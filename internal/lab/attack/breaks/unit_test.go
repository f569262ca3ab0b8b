package breaks

import (
	"bytes"
	"encoding/hex"
	"net/netip"
	"strings"
	"testing"

	"github.com/mpdetour/mpdetour/internal/proto"
)

// The forged dead message is memberlist's deadMsg (type 5) with the
// msgpack map its decoder reads: fixstr keys, uint32 incarnation, and
// str8 for names of 32 bytes or more (gossip member names are 50).
func TestDeadMessage(t *testing.T) {
	got := deadMessage(0xffffffff, "v", "f")
	want, _ := hex.DecodeString("05" + "83" + "ab" + hex.EncodeToString([]byte("Incarnation")) + "ceffffffff" +
		"a4" + hex.EncodeToString([]byte("Node")) + "a176" + "a4" + hex.EncodeToString([]byte("From")) + "a166")
	if !bytes.Equal(got, want) {
		t.Fatalf("deadMessage:\n got %x\nwant %x", got, want)
	}
	long := deadMessage(1, string(bytes.Repeat([]byte("n"), 50)), "f")
	if i := bytes.Index(long, []byte{0xd9, 50}); i < 0 {
		t.Fatalf("a 50-byte name is not a str8: %x", long)
	}
}

// The churn case counts from the agent's text log: creates per token,
// refusals by errno, SUB_ESTABLISHED events and learned limits (lines as
// the agent writes them).
func TestParseChurnLog(t *testing.T) {
	log := `time=2026-11-27T03:49:32.300Z level=DEBUG msg=intent intent="create token e86186b3 10.0.1.1:0 -> 10.1.3.2:40524 via nat via detour3 (default -> 10.1.3.2:40524)"
time=2026-11-27T03:49:32.301Z level=DEBUG msg=intent intent="create token e86186b3 10.0.1.1:0 -> 10.1.4.2:40001 via nat via detour4 (default -> 10.1.4.2:40001)"
time=2026-11-27T03:49:33.301Z level=DEBUG msg=intent intent="create token 0000001f 10.0.1.1:0 -> 10.1.4.2:40001 via nat via detour4 (default -> 10.1.4.2:40001)"
time=2026-11-27T03:49:32.302Z level=DEBUG msg=intent intent="destroy token 0000001f 10.0.1.1:0 -> 10.1.4.2:40001"
time=2026-11-27T03:49:32.304Z level=INFO msg="command failed" intent="create token e86186b3 10.0.1.1:0 -> 10.1.3.2:40524 via nat via detour3 (default -> 10.1.3.2:40524)" err="mptcp_pm SUBFLOW_CREATE token e86186b3: invalid argument (errno 22): kernel says \"invalid token\""
time=2026-11-27T03:49:32.305Z level=INFO msg="command failed" intent="create token e86186b3 10.0.1.1:0 -> 10.1.4.2:40001 via nat via detour4 (default -> 10.1.4.2:40001)" err="mptcp_pm SUBFLOW_CREATE token e86186b3: transport endpoint is not connected (errno 107)"
time=2026-11-27T03:49:43.848Z level=DEBUG msg=event event="SUB_ESTABLISHED token=0000001f local=10.0.1.1:41646 remote=10.1.4.2:40001"
time=2026-11-27T03:49:44.000Z level=INFO msg="server subflow limit learned" server=10.0.3.2:5201 extra_subflows=1 for=5m0s
time=2026-11-27T03:49:45.000Z level=WARN msg="events lost; resynchronising from inet_diag"
time=2026-11-27T03:49:46.500Z level=DEBUG msg=intent intent="create token 0000001f 10.0.1.1:0 -> 10.1.3.2:40524 via nat via detour3 (default -> 10.1.3.2:40524)"
`
	st, err := parseChurnLog(strings.NewReader(log))
	if err != nil {
		t.Fatal(err)
	}
	if st.creates != 4 || st.maxPerToken != 2 || st.busiestSecond != 2 || st.established != 1 || st.learned != 1 || st.lost != 1 || st.tokensOver(1) != 2 {
		t.Fatalf("parsed %+v", st)
	}
	// Both tokens made 2 creates; 0000001f over the longer span
	// (03:49:33.301 to 03:49:46.500).
	if got := st.maxTokenSpan(); got != "token 0000001f over 13.2 s" {
		t.Fatalf("maxTokenSpan = %q", got)
	}
	want := map[string]int64{"invalid argument (22) invalid token": 1, "transport endpoint is not connected (107)": 1}
	if len(st.refused) != 2 || st.refused["invalid argument (22) invalid token"] != 1 || st.refused["transport endpoint is not connected (107)"] != 1 {
		t.Fatalf("refused %v, want %v", st.refused, want)
	}
}

// family6Grant must write what destinations-v6 says it sends: a grant
// whose address is family 6 on the wire. A genuine IPv6 address parses
// back as itself (so the layout is right), an IPv4 one is its mapped form,
// which the parser refuses as malformed (what the relay answers).
func TestFamily6Grant(t *testing.T) {
	b, err := family6Grant(netip.MustParseAddrPort("[2001:db8::7]:443"))
	if err != nil {
		t.Fatal(err)
	}
	r, err := proto.ParseRequest(b)
	if err != nil || r.Body.(*proto.GrantRequest).Server != netip.MustParseAddrPort("[2001:db8::7]:443") {
		t.Fatalf("IPv6 grant parsed as %+v, %v", r.Body, err)
	}
	b, err = family6Grant(netip.MustParseAddrPort("127.0.0.1:443"))
	if err != nil {
		t.Fatal(err)
	}
	if b[8] != 6 || netip.AddrFrom16([16]byte(b[9:25])) != netip.MustParseAddr("::ffff:127.0.0.1") {
		t.Fatalf("mapped grant bytes %x", b)
	}
	if _, err := proto.ParseRequest(b); proto.ReasonOf(err) != proto.ReasonMalformed {
		t.Fatalf("mapped grant: parse error %v, want malformed", err)
	}
}

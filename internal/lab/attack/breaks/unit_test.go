package breaks

import (
	"bytes"
	"context"
	"crypto/aes"
	"crypto/cipher"
	"encoding/hex"
	"fmt"
	"math"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/mpdetour/mpdetour/internal/proto"
	"github.com/mpdetour/mpdetour/internal/roster"
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

// The in-place case list: names as the suite's, "all", and errors that
// name the problem.
func TestParseInPlace(t *testing.T) {
	got, err := ParseInPlace("all")
	if err != nil || len(got) != len(InPlaceCases()) {
		t.Fatalf("all: %v, %v", got, err)
	}
	suite := map[string]bool{}
	for _, c := range Cases() {
		suite[c] = true
	}
	for _, c := range InPlaceCases() {
		if !suite[c] {
			t.Errorf("in-place case %q is not a suite case", c)
		}
	}
	if got, err := ParseInPlace("rotation-quota,spoofed-junk"); err != nil || len(got) != 2 || got[0] != "rotation-quota" || got[1] != "spoofed-junk" {
		t.Fatalf("two cases: %v, %v", got, err)
	}
	for in, want := range map[string]string{
		"nope":                      `unknown case "nope"`,
		"revoked-crl":               `unknown case "revoked-crl"`,
		"spoofed-junk,spoofed-junk": "named twice",
		"spoofed-junk,":             "empty case name",
	} {
		if _, err := ParseInPlace(in); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v, want an error containing %q", in, err, want)
		}
	}
}

// sealGossip writes memberlist's encryption version 1: the version byte,
// a fresh 12-byte nonce, then AES-GCM of the message under the secret
// with no additional data; a message sealed under another key does not
// open.
func TestSealGossip(t *testing.T) {
	key, err := roster.ParseSecret(roster.NewSecret())
	if err != nil {
		t.Fatal(err)
	}
	msg := deadMessage(math.MaxUint32, "victim", "from")
	a, err := sealGossip(key, msg)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := sealGossip(key, msg)
	if a[0] != 1 || len(a) != 1+12+len(msg)+16 || bytes.Equal(a[1:13], b[1:13]) {
		t.Fatalf("sealed %x (version %d, length %d, nonces %x %x)", a, a[0], len(a), a[1:13], b[1:13])
	}
	blk, _ := aes.NewCipher(key)
	gcm, _ := cipher.NewGCM(blk)
	plain, err := gcm.Open(nil, a[1:13], a[13:], nil)
	if err != nil || !bytes.Equal(plain, msg) {
		t.Fatalf("opened %x, %v; want %x", plain, err, msg)
	}
	other, _ := roster.ParseSecret(roster.NewSecret())
	blk, _ = aes.NewCipher(other)
	gcm, _ = cipher.NewGCM(blk)
	if _, err := gcm.Open(nil, a[1:13], a[13:], nil); err == nil {
		t.Fatal("opened under another secret")
	}
}

// procState is the state letter of /proc/PID/stat ("T" = stopped).
func procState(t *testing.T, pid int) string {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatal(err)
	}
	f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
	return f[0]
}

// subflow-churn-mixed's agent stops end with the case: a cancelled
// context (Ctrl-C) during a stop continues the agent at once and
// churnStalls returns, instead of keeping the cleanup waiting for the
// rest of the schedule (before: up to 45 s).
func TestChurnStallsEndWithContext(t *testing.T) {
	p := exec.Command("sleep", "60")
	if err := p.Start(); err != nil {
		t.Skip("no sleep:", err)
	}
	t.Cleanup(func() { p.Process.Kill(); p.Wait() })
	saved := churnStallAt
	churnStallAt = []time.Duration{0, 10 * time.Second}
	t.Cleanup(func() { churnStallAt = saved })

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan struct{})
	go churnStalls(ctx, p, time.Now(), done)
	for deadline := time.Now().Add(5 * time.Second); procState(t, p.Process.Pid) != "T"; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the process was not stopped at the first stall")
		}
	}
	cancel()
	select {
	case <-done:
	case <-time.After(2 * time.Second): // the stop lasts churnStall (5 s)
		t.Fatal("churnStalls still running 2 s after the context ended")
	}
	for deadline := time.Now().Add(2 * time.Second); procState(t, p.Process.Pid) == "T"; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the process is still stopped after churnStalls returned")
		}
	}
}

// Package breaks holds the attack suite's product cases (issue 28, third
// round): attacks on the running mpdetour daemons rather than on the
// kernel's MPTCP (package attack). Each case starts the product binary it
// is given (any build, so that a build from before a fix can be measured
// beside the current one) in a lab of its own, attacks it the way the
// break was found, and asserts the target:
//
//   - spoofed-junk (break 1): a relay; 131,000 junk transport packets (no
//     session) from as many spoofed sources at 8,000/s, then a member from
//     an address the relay has not seen. Target: its handshake and grant
//     within 1 s.
//   - forged-gossip (break 2): three relays in a gossip cluster; an
//     attacker without the gossip secret sends memberlist "dead" messages
//     at the highest incarnation naming a live relay to the two others.
//     Target: 0 removals (no roster loses the live relay at any sample).
//   - forged-gossip-insider (break 2, the insider half): the same cluster
//     with gossip.secret_file; one dead message at the highest
//     incarnation, sealed with the cluster's secret as a relay holding it
//     could, to each of the two others. Target: every roster lists the
//     live relay again within 10 s (its refutation, wrapped to
//     incarnation 0, is not ignored).
//   - convert-socket (break 3): an agent with convert enabled; a local
//     user other than root (uid 65534, not in convert.users) teaches its
//     conversion socket that a destination does not speak MPTCP, reports a
//     converter failure and asks for the status. Target: 0 cross-user
//     effects (root's view holds no lesson of the other user, no converter
//     is held by the other user's report, the status is not disclosed).
//   - rotation-quota (break 4): a member with a collective certificate
//     takes NAT mappings up to quota.per_member (2), rotates its key 3
//     times and asks again on the new key and on the old one. Target: the
//     mappings it holds over all its keys never exceed the quota.
//   - revoked-conversion (break 4): a member's conversion streams from a
//     server to the member; the relay's members list drops the member
//     (SIGHUP). Target: 0 bytes from 2 s after the reload on.
//   - revoked-crl (break 4, the certificate path): as revoked-conversion,
//     but the member is known by its certificate and the revocation list
//     naming it is written to another relay's crl_file: it reaches the
//     converter's relay by gossip. Target: 0 bytes from 2 s after that
//     relay holds the list.
//   - destinations-v6 (issue 31): two relays in a dual-stack lab; a
//     member asks for NAT grants toward every special-use IPv6 range (and
//     IPv4-mapped, NAT64 and a few IPv4 baselines). Target: 0 granted,
//     and every control destination granted.
//   - subflow-churn (break 7, and break 6 under churn): relays in 4
//     detour nodes, an agent keeping 4 NAT detour subflows per connection,
//     200 short MPTCP connections/s for 60 s. Target: SUBFLOW_CREATE <= 2 x
//     connections x 4, and no server join limit learned (churn.go).
//   - subflow-churn-mixed (break 7): subflow-churn where 3 of 8
//     connections stay half closed 1-5 s after the server closed, 1 of 8
//     closes at once, 2 of 8 idle 10-20 s, and two detours drop or reset
//     half of the joins; the client's ports sustain the rate. Same target.
//
// Lab only: nothing here is part of the product.
package breaks

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"strings"
	"time"
)

// Case names.
const (
	SpoofedJunk   = "spoofed-junk"
	ForgedGossip  = "forged-gossip"
	ConvertSocket = "convert-socket"
	RotationQuota = "rotation-quota"
	RevokedConv   = "revoked-conversion"
	DestV6        = "destinations-v6" // issue 31: no break number
	RevokedCRL    = "revoked-crl"
	SubflowChurn  = "subflow-churn"
	// SubflowChurnMixed is subflow-churn with half-closed, aborted and idle
	// connections and two unreliable detours (churn.go).
	SubflowChurnMixed = "subflow-churn-mixed"
	// GossipInsider is break 2's insider half.
	GossipInsider = "forged-gossip-insider"
)

// Cases lists the cases in the order the suite runs them.
func Cases() []string {
	return []string{SpoofedJunk, ForgedGossip, ConvertSocket, RotationQuota, RevokedConv, DestV6, RevokedCRL, SubflowChurn, SubflowChurnMixed, GossipInsider}
}

// Result is one case against one build.
type Result struct {
	Case   string `json:"case"`
	Break  int    `json:"break"`
	Binary string `json:"binary"`
	// Metric names what Value counts; Target is the bound for it.
	Metric string  `json:"metric"`
	Value  float64 `json:"value"`
	Target string  `json:"target"`
	Pass   bool    `json:"pass"`
	// Detail says what the attack saw, in words (the table's last column).
	Detail  string  `json:"detail"`
	Seconds float64 `json:"seconds"`
	// Error: the case could not run against this build (not a pass or a
	// fail: e.g. the build refuses the configuration the case needs).
	Error string `json:"error,omitempty"`
}

// Options are what every case needs.
type Options struct {
	// Binary is the product binary (mpdetour) under attack.
	Binary string
	// Dir holds the case's files (configs, keys, logs); it must be
	// traversable by uid PeerUID (convert-socket).
	Dir string
	// LabName prefixes the case's namespaces.
	LabName string
	// Self is this lab binary, re-executed as PeerUID for the local
	// user's side of convert-socket (its hidden peer command).
	Self string
	// PeerCommand is the hidden command of Self that runs Peer.
	PeerCommand string
}

// Run runs one case.
func Run(ctx context.Context, name string, o Options) Result {
	t0 := time.Now()
	var r Result
	switch name {
	case SpoofedJunk:
		r = spoofedJunk(ctx, o)
	case ForgedGossip:
		r = forgedGossip(ctx, o)
	case ConvertSocket:
		r = convertSocket(ctx, o)
	case RotationQuota:
		r = rotationQuota(ctx, o)
	case RevokedConv:
		r = revokedConversion(ctx, o)
	case DestV6:
		r = destinationsV6(ctx, o)
	case RevokedCRL:
		r = revokedCRL(ctx, o)
	case SubflowChurn:
		r = subflowChurn(ctx, o)
	case SubflowChurnMixed:
		r = subflowChurnMixed(ctx, o)
	case GossipInsider:
		r = forgedGossipInsider(ctx, o)
	default:
		r = Result{Case: name, Error: fmt.Sprintf("unknown case %q (known: %s)", name, strings.Join(Cases(), ", "))}
	}
	r.Case, r.Binary, r.Seconds = name, o.Binary, time.Since(t0).Seconds()
	return r
}

// PeerUID is the local user the convert-socket case acts as (nobody).
const PeerUID = 65534

// peerRequest is one line of the agent's conversion socket protocol
// (internal/convclient), written here from the wire so that any build's
// agent can be asked.
type peerRequest struct {
	Op      string `json:"op"`
	Dst     string `json:"dst,omitempty"`
	Native  bool   `json:"native,omitempty"`
	Relay   string `json:"relay,omitempty"`
	Outcome string `json:"outcome,omitempty"`
	Detail  string `json:"detail,omitempty"`
}

// Peer is the other local user's side of convert-socket (run by the lab
// binary's hidden command as PeerUID): each request on a connection of its
// own, the answer's error (or "" when answered) per operation, as one JSON
// line on w.
func Peer(socket, dst, relay string, w *os.File) error {
	reqs := []peerRequest{
		{Op: "hello"},
		{Op: "learn", Dst: dst},
		{Op: "report", Dst: dst, Relay: relay, Outcome: "converter-failed", Detail: "forged by another user"},
		{Op: "status"},
	}
	out := map[string]string{}
	for _, q := range reqs {
		rep, err := ask(socket, q)
		switch {
		case err != nil:
			out[q.Op] = "error: " + err.Error()
		case rep.Error != "":
			out[q.Op] = "refused: " + rep.Error
		default:
			out[q.Op] = ""
		}
	}
	return json.NewEncoder(w).Encode(out)
}

// peerReply is the part of the socket's answer the cases read.
type peerReply struct {
	Error  string          `json:"error,omitempty"`
	Status json.RawMessage `json:"status,omitempty"`
}

func ask(socket string, q peerRequest) (peerReply, error) {
	var rep peerReply
	c, err := net.DialTimeout("unix", socket, 2*time.Second)
	if err != nil {
		return rep, err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(3 * time.Second))
	b, _ := json.Marshal(q)
	if _, err := c.Write(append(b, '\n')); err != nil {
		return rep, err
	}
	line, err := bufio.NewReader(c).ReadBytes('\n')
	if err != nil {
		return rep, fmt.Errorf("no answer: %w", err)
	}
	if err := json.Unmarshal(line, &rep); err != nil {
		return rep, fmt.Errorf("answer %q: %w", line, err)
	}
	return rep, nil
}

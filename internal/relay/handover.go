package relay

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"time"

	"github.com/mpdetour/mpdetour/internal/proto"
	"github.com/mpdetour/mpdetour/internal/relay/dataplane"
	"github.com/mpdetour/mpdetour/internal/relay/fairshare"
	"github.com/mpdetour/mpdetour/internal/relay/lease"
)

// Graceful restarts (docs/relay.md, "Restarts and upgrades"). Established
// detour connections live in conntrack, but their translation is applied by
// the NAT hooks of the relay's nftables table: removing the table at a stop
// resets them. With a state_file, a stop (SIGTERM, SIGINT) therefore leaves
// the table in place and writes the active mappings beside the state file;
// the next start recreates the table (delete and add in one transaction, so
// the NAT hooks never go away) and adopts the mappings whose owner is still
// a member and whose lease has not ended: established connections continue,
// new subflows to the same detour port keep working and the agent's next
// grant for the same server gets the same port.

// handoverSuffix names the mappings file beside the state file.
const handoverSuffix = ".mappings"

const handoverVersion = 1

type handoverFile struct {
	Version  int               `json:"version"`
	Saved    time.Time         `json:"saved"`
	Mappings []handoverMapping `json:"mappings"`
}

type handoverMapping struct {
	Client  netip.Addr     `json:"client"`
	Port    uint16         `json:"port"`
	Server  netip.AddrPort `json:"server"`
	Owner   proto.Key      `json:"owner"` // zero: legacy v1
	Name    string         `json:"name"`
	Granted time.Time      `json:"granted"`
	Expires time.Time      `json:"expires"`
}

func handoverPath(stateFile string) string { return stateFile + handoverSuffix }

// saveHandover writes ms to path atomically (fairshare.WriteFileAtomic).
func saveHandover(path string, ms []*lease.Mapping, now time.Time) error {
	h := handoverFile{Version: handoverVersion, Saved: now.UTC(), Mappings: make([]handoverMapping, 0, len(ms))}
	for _, m := range ms {
		h.Mappings = append(h.Mappings, handoverMapping{Client: m.Key.Client, Port: m.Key.Port, Server: m.Server,
			Owner: m.Owner.Key, Name: m.Owner.Name, Granted: m.Granted, Expires: m.Expires})
	}
	b, err := json.Marshal(h)
	if err != nil {
		return err
	}
	_, err = fairshare.WriteFileAtomic(path, b)
	return err
}

// loadHandover reads the mappings a stopped relay left (none: no file).
func loadHandover(path string) ([]handoverMapping, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var h handoverFile
	if err := json.Unmarshal(b, &h); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if h.Version != handoverVersion {
		return nil, fmt.Errorf("%s: version %d, this relay reads %d", path, h.Version, handoverVersion)
	}
	return h.Mappings, nil
}

// adoptHandover installs the mappings an earlier run handed over whose owner
// is still allowed and whose lease has not ended; the file is removed
// (a later start must not adopt them again).
func (s *Server) adoptHandover(now time.Time) {
	path := handoverPath(s.static.StateFile)
	hs, err := loadHandover(path)
	if err != nil {
		s.log.Warn("not adopting the mappings of the previous run", "err", err)
		_ = os.Remove(path)
		return
	}
	if hs == nil {
		return
	}
	defer os.Remove(path)
	var adopted []*lease.Mapping
	skipped := 0
	for _, h := range hs {
		name, member := s.set.Members[h.Owner]
		ok := h.Expires.After(now) && h.Client.IsValid() && !h.Client.Is4In6() && h.Client.Is4() == h.Server.Addr().Is4() && h.Port >= s.set.PortLo && h.Port <= s.set.PortHi &&
			(member || h.Owner.IsZero() && s.io.legacy != nil)
		k := dataplane.Key{Client: h.Client, Port: h.Port}
		if !ok || s.leases.Taken(k) || s.pol.Check(h.Server) != nil {
			skipped++
			continue
		}
		o := lease.Owner{Key: h.Owner, Name: name}
		if !member {
			o = lease.LegacyOwner
		}
		m := &lease.Mapping{Key: k, Server: h.Server, Owner: o, Granted: h.Granted, Expires: h.Expires}
		s.leases.Add(m)
		adopted = append(adopted, m)
	}
	if len(adopted) > 0 {
		ms := make([]dataplane.Mapping, len(adopted))
		for i, m := range adopted {
			ms[i] = m.DP()
		}
		if err := s.dp.Map(ms); err != nil {
			s.log.Error("adopting the mappings of the previous run", "n", len(ms), "err", err)
			for _, m := range adopted {
				s.leases.Drop(m)
			}
			return
		}
		for _, m := range adopted {
			s.logAttr(mappingEvent("adopt", m, now))
		}
	}
	s.log.Info("adopted the mappings of the previous run", "mappings", len(adopted), "skipped", skipped)
}

// handOver is the stop of a relay with a state file: the active mappings
// are written beside it and the table stays for the next start to adopt
// (handover.go). Mappings still closing are forgotten (their counts go to
// the attribution log now). It says whether it handed over; on false (the
// file could not be written) the caller removes everything as usual.
func (s *Server) handOver(all []*lease.Mapping, now time.Time) bool {
	path := handoverPath(s.static.StateFile)
	if err := saveHandover(path, all, now); err != nil {
		s.log.Error("writing the mappings for the next start; removing them instead", "file", path, "err", err)
		return false
	}
	if cnt, err := s.liveCounters(); err == nil {
		for _, m := range all {
			s.logAttr(withCounter(mappingEvent("handover", m, now), cnt[m.Key]))
		}
	}
	s.finishAccounts(now)
	if err := s.dp.Leave(); err != nil {
		s.log.Error("leaving the nftables table", "err", err)
	}
	s.closeAll()
	s.log.Info("relay stopped; mappings left in place for the next start", "mappings", len(all), "file", path)
	return true
}

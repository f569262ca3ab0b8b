package relay

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"sync"
	"time"

	"github.com/mpdetour/mpdetour/internal/relay/dataplane"
	"github.com/mpdetour/mpdetour/internal/relay/lease"
)

// attrEvent is one line of the attribution log: enough for an operator to
// show which member sent what through the relay, and when.
type attrEvent struct {
	Time       time.Time `json:"time"`
	Event      string    `json:"event"` // grant, renew, release, expiry, shutdown, revoked, usage, convert, rotate, handover, adopt
	Member     string    `json:"member"`
	KeyID      string    `json:"key_id,omitempty"`
	Client     string    `json:"client"`
	Server     string    `json:"server"`
	DetourPort uint16    `json:"detour_port"`
	LeaseS     int64     `json:"lease_s,omitempty"`
	// Bytes and Packets are the mapping's totals (both directions) at close;
	// absent on grant and renew.
	Bytes   *uint64 `json:"bytes,omitempty"`
	Packets *uint64 `json:"packets,omitempty"`
	// Converted connections (event "convert"): bytes member to server
	// (up) and back (down), and how it ended (ok or a refusal).
	BytesUp   *uint64 `json:"bytes_up,omitempty"`
	BytesDown *uint64 `json:"bytes_down,omitempty"`
	Result    string  `json:"result,omitempty"`
}

type attrLog struct {
	mu   sync.Mutex
	path string
	w    io.Writer
	f    *os.File
}

// openAttrLog opens path for appending ("-" = stdout, "" = discard).
func openAttrLog(path string) (*attrLog, error) {
	l := &attrLog{path: path, w: io.Discard}
	switch path {
	case "":
	case "-":
		l.w = os.Stdout
	default:
		f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o640)
		if err != nil {
			return nil, fmt.Errorf("attribution_log: %w", err)
		}
		l.f, l.w = f, f
	}
	return l, nil
}

func (l *attrLog) write(ev attrEvent) error {
	b, err := json.Marshal(ev)
	if err != nil {
		return err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	_, err = l.w.Write(append(b, '\n'))
	return err
}

func (l *attrLog) Close() error {
	if l.f != nil {
		return l.f.Close()
	}
	return nil
}

func mappingEvent(event string, m *lease.Mapping, now time.Time) attrEvent {
	ev := attrEvent{
		Time:       now.UTC(),
		Event:      event,
		Member:     m.Owner.Name,
		Client:     m.Key.Client.String(),
		Server:     m.Server.String(),
		DetourPort: m.Key.Port,
	}
	if !m.Owner.Key.IsZero() {
		ev.KeyID = m.Owner.Key.ID()
	}
	if event == "grant" || event == "renew" {
		ev.LeaseS = int64(m.Expires.Sub(now).Round(time.Second) / time.Second)
	}
	return ev
}

func withCounter(ev attrEvent, c dataplane.Counter) attrEvent {
	b, p := c.Bytes, c.Packets
	ev.Bytes, ev.Packets = &b, &p
	return ev
}

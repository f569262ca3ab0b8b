package delayline

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/mpdetour/mpdetour/internal/config"
)

// MaxDelay bounds a configured one-way delay; longer values are almost
// certainly a unit mistake ("100s" for "100ms") and would pin a lot of memory.
const MaxDelay = 10 * time.Second

// Duration is the config layer's duration; in the JSON state file it is a
// string such as "5ms".
type Duration = config.Duration

// Config lists the links one delay-line process serves.
type Config struct {
	Links []Link `json:"links"`
}

// Link is one emulated link: a middle network namespace holding two
// interfaces, A and B, that are the veth peers of the link's two endpoints.
// Frames read on A leave on B after DelayAB, and frames read on B leave on A
// after DelayBA.
type Link struct {
	Name  string `json:"name"`  // for logs and statistics
	Netns string `json:"netns"` // path of the middle namespace, e.g. /run/netns/X
	A     string `json:"a"`
	B     string `json:"b"`

	DelayAB Duration `json:"delay_ab"`
	DelayBA Duration `json:"delay_ba"`

	// LossAB and LossBA drop each frame independently with this probability
	// (0..1). Optional; the lab may instead drop with nftables.
	LossAB float64 `json:"loss_ab,omitempty"`
	LossBA float64 `json:"loss_ba,omitempty"`

	// QueueLimit bounds the frames held per direction (0 = automatic, see
	// queueSlots). Frames arriving at a full queue are dropped and counted.
	QueueLimit int `json:"queue_limit,omitempty"`
}

// ParseConfig decodes and validates a JSON state file. Unknown fields are
// ignored so that the lab can keep its own bookkeeping in the same file.
func ParseConfig(data []byte) (Config, error) {
	var c Config
	dec := json.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&c); err != nil {
		return Config{}, fmt.Errorf("delay line state: %w", err)
	}
	if err := c.Validate(); err != nil {
		return Config{}, err
	}
	return c, nil
}

// Validate reports the first problem in c, naming the link and field.
func (c Config) Validate() error {
	if len(c.Links) == 0 {
		return errors.New("delay line state: no links")
	}
	names := map[string]bool{}
	ifaces := map[string]string{}
	for i, l := range c.Links {
		where := fmt.Sprintf("delay line link %d", i)
		if l.Name != "" {
			where = fmt.Sprintf("delay line link %q", l.Name)
			if names[l.Name] {
				return fmt.Errorf("%s: duplicate name", where)
			}
			names[l.Name] = true
		}
		switch {
		case l.Netns == "":
			return fmt.Errorf("%s: netns is empty", where)
		case l.A == "" || l.B == "":
			return fmt.Errorf("%s: interfaces a and b must both be set", where)
		case l.A == l.B:
			return fmt.Errorf("%s: a and b are the same interface %q", where, l.A)
		case len(l.A) > 15 || len(l.B) > 15:
			return fmt.Errorf("%s: interface name longer than 15 bytes", where)
		}
		for _, ifc := range []string{l.A, l.B} {
			key := l.Netns + "\x00" + ifc
			if other, dup := ifaces[key]; dup {
				return fmt.Errorf("%s: interface %q in %s is also used by %s", where, ifc, l.Netns, other)
			}
			ifaces[key] = where
		}
		for _, d := range []struct {
			name string
			v    Duration
		}{{"delay_ab", l.DelayAB}, {"delay_ba", l.DelayBA}} {
			if d.v < 0 || time.Duration(d.v) > MaxDelay {
				return fmt.Errorf("%s: %s %v out of range [0, %v]", where, d.name, time.Duration(d.v), MaxDelay)
			}
		}
		for _, p := range []struct {
			name string
			v    float64
		}{{"loss_ab", l.LossAB}, {"loss_ba", l.LossBA}} {
			if math.IsNaN(p.v) || p.v < 0 || p.v > 1 {
				return fmt.Errorf("%s: %s %v is not a probability in [0, 1]", where, p.name, p.v)
			}
		}
		if l.QueueLimit < 0 || l.QueueLimit > maxSlots {
			return fmt.Errorf("%s: queue_limit %d out of range [0, %d]", where, l.QueueLimit, maxSlots)
		}
	}
	return nil
}

const (
	minSlots = 1024
	maxSlots = 1 << 18
	// autoPPS sizes automatic queues: enough full-size frames for ~1.2 Gbit/s
	// during the configured delay, which covers every rate tbf is asked for in
	// the lab while keeping 5 ms links at ~1.5 MB.
	autoPPS = 100_000
)

// queueSlots is the number of frames a direction can hold.
func queueSlots(limit int, delay time.Duration) int {
	if limit > 0 {
		return limit
	}
	n := int(delay.Seconds() * autoPPS)
	return min(max(n, minSlots), maxSlots)
}

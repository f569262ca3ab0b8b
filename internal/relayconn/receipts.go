package relayconn

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/mpdetour/mpdetour/internal/collective"
	"github.com/mpdetour/mpdetour/internal/proto"
)

// PresentReceipt presents one usage receipt (binary form) to the relay; it
// returns the issuer's credit there afterwards, in bytes.
func (c *Conn) PresentReceipt(ctx context.Context, receipt []byte) (int64, error) {
	r, err := call[*proto.ReceiptReply](ctx, c, &proto.ReceiptRequest{Receipt: receipt})
	if err != nil {
		return 0, err
	}
	return r.Credit, nil
}

// ReadReceipts reads a receipts file (fair_share.receipts_file of a relay:
// one receipt per line), in order. A line that does not parse is an error
// naming it.
func ReadReceipts(path string) ([]*collective.Receipt, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []*collective.Receipt
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		r, err := collective.ParseReceipt(line)
		if err != nil {
			return nil, fmt.Errorf("%s:%d: %w", path, n, err)
		}
		out = append(out, r)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return out, nil
}

// Presented remembers, per relay (public key, base64), the highest receipt
// sequence number of each issuer it accepted or refused for good, so the
// next run presents only newer receipts.
type Presented map[string]map[string]uint64

// LoadPresented reads the progress file; a missing one is empty.
func LoadPresented(path string) (Presented, error) {
	p := Presented{}
	b, err := os.ReadFile(path)
	if os.IsNotExist(err) {
		return p, nil
	}
	if err != nil {
		return nil, err
	}
	if err := json.Unmarshal(b, &p); err != nil {
		return nil, fmt.Errorf("%s: %v (remove it to present every receipt again; relays refuse those they counted)", path, err)
	}
	return p, nil
}

// Save writes the progress file atomically.
func (p Presented) Save(path string) error {
	b, err := json.MarshalIndent(p, "", " ")
	if err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+"-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(append(b, '\n')); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}

// PresentResult sums up one relay's answers.
type PresentResult struct {
	Accepted, Refused, Skipped int
	Credit                     int64 // the issuer's credit after the last accepted receipt
	Reasons                    map[string]int
}

// PresentAll presents to c, in sequence order, the receipts newer than
// what p records for this relay and drops expired ones; refusals other
// than a transport failure are final for that receipt (a relay refuses a
// receipt the same way every time).
func PresentAll(ctx context.Context, c *Conn, rs []*collective.Receipt, p Presented, now time.Time) (PresentResult, error) {
	res := PresentResult{Reasons: map[string]int{}}
	relay := c.Relay().PublicKey.String()
	done := p[relay]
	if done == nil {
		done = map[string]uint64{}
		p[relay] = done
	}
	sorted := append([]*collective.Receipt(nil), rs...)
	sort.SliceStable(sorted, func(i, j int) bool { return sorted[i].Seq < sorted[j].Seq })
	for _, r := range sorted {
		issuer := r.Issuer.String()
		if r.Seq <= done[issuer] || now.Sub(r.End) > collective.ReceiptMaxAge {
			res.Skipped++
			continue
		}
		credit, err := c.PresentReceipt(ctx, r.Bytes())
		for proto.ReasonOf(err) == proto.ReasonRateLimited {
			// The relay's per-member request rate: slow down, not a verdict.
			select {
			case <-ctx.Done():
				return res, ctx.Err()
			case <-time.After(100 * time.Millisecond):
			}
			credit, err = c.PresentReceipt(ctx, r.Bytes())
		}
		var pe *proto.Error
		switch {
		case err == nil:
			res.Accepted++
			res.Credit = credit
		case errors.As(err, &pe):
			res.Refused++
			res.Reasons[pe.Reason.String()]++
		default:
			return res, err
		}
		done[issuer] = r.Seq
	}
	return res, nil
}

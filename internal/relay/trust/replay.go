package trust

import (
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"

	"github.com/mpdetour/mpdetour/internal/proto"
)

// replayState is what the relay keeps across restarts (config state_file):
// the newest handshake timestamp accepted from each member key, so an
// initiation captured before a restart is still refused as a replay after
// it. The file is small (one line per member) and rewritten atomically
// (temporary file, fsync, rename) before the handshake responses of each
// event-loop batch are sent, so a kill -9 never loses a timestamp a response
// was sent for.
type replayState struct {
	path  string
	dirty bool
}

// stateFile is the on-disk form.
type stateFile struct {
	Version int `json:"version"`
	// Timestamps maps a member public key (base64) to the hex TAI64N label
	// of its newest accepted initiation.
	Timestamps map[string]string `json:"timestamps"`
}

const stateVersion = 1

// loadReplayState reads path into ts. A missing file is a first start; a
// file that does not parse is an error naming it (the relay refuses to start
// rather than silently forgetting what protects against replays).
func loadReplayState(path string, ts map[proto.Key]proto.Timestamp) error {
	b, err := os.ReadFile(path)
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("state file: %w", err)
	}
	var f stateFile
	if err := json.Unmarshal(b, &f); err != nil {
		return fmt.Errorf("state file %s: %v (remove it to start without replay history)", path, err)
	}
	if f.Version != stateVersion {
		return fmt.Errorf("state file %s: version %d, this relay reads %d", path, f.Version, stateVersion)
	}
	for k, v := range f.Timestamps {
		key, err := proto.ParseKey(k)
		if err != nil {
			return fmt.Errorf("state file %s: key %q: %v", path, k, err)
		}
		raw, err := hex.DecodeString(v)
		if err != nil || len(raw) != len(proto.Timestamp{}) {
			return fmt.Errorf("state file %s: timestamp of %s: want %d hex bytes, got %q", path, k, len(proto.Timestamp{}), v)
		}
		ts[key] = proto.Timestamp(raw)
	}
	return nil
}

// save writes ts to the state file if it changed since the last save.
func (r *replayState) save(ts map[proto.Key]proto.Timestamp) error {
	if r == nil || !r.dirty {
		return nil
	}
	f := stateFile{Version: stateVersion, Timestamps: make(map[string]string, len(ts))}
	for k, v := range ts {
		f.Timestamps[k.String()] = hex.EncodeToString(v[:])
	}
	b, err := json.MarshalIndent(f, "", " ")
	if err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(r.path), ".relay-state-*")
	if err != nil {
		return fmt.Errorf("state file: %w", err)
	}
	defer os.Remove(tmp.Name()) // no-op after the rename
	if _, err := tmp.Write(append(b, '\n')); err != nil {
		tmp.Close()
		return fmt.Errorf("state file: %w", err)
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return fmt.Errorf("state file: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("state file: %w", err)
	}
	if err := os.Rename(tmp.Name(), r.path); err != nil {
		return fmt.Errorf("state file: %w", err)
	}
	// The rename itself must survive a power loss.
	if d, err := os.Open(filepath.Dir(r.path)); err == nil {
		_ = d.Sync()
		d.Close()
	}
	r.dirty = false
	return nil
}

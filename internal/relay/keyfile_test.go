package relay

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/mpdetour/mpdetour/internal/proto"
)

// Key files are checked by the loader: a file others can read is refused
// with the chmod to run, an empty or malformed one is named, and the error
// points at the line of the config that names the file.
func TestConfigKeyFileHygiene(t *testing.T) {
	dir := t.TempDir()
	k, _ := proto.GenerateKey()
	member, _ := proto.GenerateKey()
	for _, tc := range []struct {
		name, content string
		mode          os.FileMode
		want          string
	}{
		{"world.key", k.String() + "\n", 0o644, "relay.yaml:2:19: private_key_file: %s holds a private key but is readable or writable by group or others (mode 0644); run: chmod 600 %s"},
		{"empty.key", "", 0o600, "relay.yaml:2:19: private_key_file: %s is empty; create a key with"},
		{"bad.key", "not-a-key\n", 0o600, "relay.yaml:2:19: private_key_file: %s does not hold a valid private key"},
		{"good.key", k.String() + "\n", 0o600, ""},
	} {
		kp := filepath.Join(dir, tc.name)
		if err := os.WriteFile(kp, []byte(tc.content), tc.mode); err != nil {
			t.Fatal(err)
		}
		os.Chmod(kp, tc.mode)
		cp := filepath.Join(dir, "relay.yaml")
		cfg := "listen: 0.0.0.0:45673\nprivate_key_file: " + kp + "\nmembers:\n  - {name: a, public_key: " + member.Public().String() + "}\n"
		if err := os.WriteFile(cp, []byte(cfg), 0o600); err != nil {
			t.Fatal(err)
		}
		_, err := LoadConfig(cp)
		if tc.want == "" {
			if err != nil {
				t.Errorf("%s: %v", tc.name, err)
			}
			continue
		}
		want := strings.ReplaceAll(tc.want, "%s", kp)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: error %v, want it to contain %q", tc.name, err, want)
		}
	}
}

package bench

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/mpdetour/mpdetour/internal/version"
)

// A trial records the version of the mpdetour binary the lab starts, asked
// from that binary, beside the lab's own: they are two binaries now.
func TestVersionsAskTheProductBinary(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "mpdetour")
	if err := os.WriteFile(bin, []byte("#!/bin/sh\n[ \"$1\" = version ] && echo 'mpdetour v9.9-test (go1.x)'\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	v := Versions(bin)
	if v["mpdetour"] != "v9.9-test (go1.x)" || v["mpdetour-lab"] != version.String() || v["go"] == "" {
		t.Errorf("versions %v", v)
	}
	missing := filepath.Join(t.TempDir(), "nope")
	if got := Versions(missing)["mpdetour"]; !strings.HasPrefix(got, "unknown (") || !strings.Contains(got, missing) {
		t.Errorf("missing binary: mpdetour version %q", got)
	}
}

package roster

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
)

func writeSeed(t testing.TB, name string, b []byte) {
	dir := filepath.Join("testdata", "fuzz", "FuzzParseEntry")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	s := fmt.Sprintf("go test fuzz v1\n[]byte(%q)\n", b)
	if err := os.WriteFile(filepath.Join(dir, name), []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
}

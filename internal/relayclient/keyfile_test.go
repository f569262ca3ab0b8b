package relayclient

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/mpdetour/mpdetour/internal/proto"
)

// The member key file gets the same checks as the relay's (config.ReadKeyFile).
func TestKeyFileHygiene(t *testing.T) {
	dir := t.TempDir()
	k, _ := proto.GenerateKey()
	relayKey, _ := proto.GenerateKey()
	servers := []FileRelay{{Name: "r", Address: "192.0.2.2:45673", PublicKey: relayKey.Public().String()}}
	p := filepath.Join(dir, "member.key")
	if err := os.WriteFile(p, []byte(k.String()+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	os.Chmod(p, 0o644)
	f := File{KeyFile: p, Servers: servers}
	if _, err := f.Build(); err == nil || !strings.Contains(err.Error(), "key_file: "+p+" holds a private key but is readable") || !strings.Contains(err.Error(), "chmod 600 "+p) {
		t.Fatalf("0644 key: %v", err)
	}
	os.Chmod(p, 0o600)
	sc, err := f.Build()
	if err != nil || sc.PrivateKey != k {
		t.Fatalf("0600 key: %v", err)
	}
	os.WriteFile(p, nil, 0o600)
	if _, err := f.Build(); err == nil || !strings.Contains(err.Error(), p+" is empty") {
		t.Fatalf("empty key: %v", err)
	}
}

package roster

import (
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"strings"
)

// SecretLen is the length of the gossip secret (AES-256-GCM key).
const SecretLen = 32

// NewSecret returns a fresh gossip secret in its text form (base64, what
// `head -c 32 /dev/urandom | base64` writes), for a secret_file.
func NewSecret() string {
	b := make([]byte, SecretLen)
	if _, err := rand.Read(b); err != nil {
		panic(err) // crypto/rand does not fail on Linux
	}
	return base64.StdEncoding.EncodeToString(b) + "\n"
}

// ParseSecret reads a secret_file's content: base64 of 32 bytes, blanks
// around it allowed.
func ParseSecret(text string) ([]byte, error) {
	k, err := base64.StdEncoding.Strict().DecodeString(strings.TrimSpace(text))
	if err != nil || len(k) != SecretLen {
		return nil, fmt.Errorf("not a base64 key of %d bytes (head -c 32 /dev/urandom | base64)", SecretLen)
	}
	return k, nil
}

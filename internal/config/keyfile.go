package config

import (
	"fmt"
	"io"
	"os"
	"strings"
)

// maxKeyFile bounds what ReadKeyFile reads: a key file holds one line.
const maxKeyFile = 64 << 10

// ReadKeyFile reads the private key in the file at path and parses it with
// parse (proto.ParseKey for mpdetour's keys). It is the one check of every
// private key file (relay, previous relay key, member key): it refuses a
// file that group or others may read or write, with the chmod that fixes
// it, and names the file when it is empty or does not parse. Callers
// prefix the field ("private_key_file: ...") so the config error points at
// the line naming the file.
func ReadKeyFile[K any](path string, parse func(string) (K, error)) (K, error) {
	var zero K
	f, err := os.Open(path)
	if err != nil {
		return zero, err // *PathError: names the file
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return zero, err
	}
	if !st.Mode().IsRegular() {
		return zero, fmt.Errorf("%s is not a regular file (%v)", path, st.Mode().Type())
	}
	if perm := st.Mode().Perm(); perm&0o066 != 0 {
		return zero, fmt.Errorf("%s holds a private key but is readable or writable by group or others (mode %04o); run: chmod 600 %s", path, perm, path)
	}
	b, err := io.ReadAll(io.LimitReader(f, maxKeyFile+1))
	if err != nil {
		return zero, fmt.Errorf("%s: %w", path, err)
	}
	if len(b) > maxKeyFile {
		return zero, fmt.Errorf("%s is not a key file: larger than %d KiB", path, maxKeyFile>>10)
	}
	text := strings.TrimSpace(string(b))
	if text == "" {
		return zero, fmt.Errorf("%s is empty; create a key with: (umask 077; mpdetour relay genkey > %s)", path, path)
	}
	k, err := parse(text)
	if err != nil {
		return zero, fmt.Errorf("%s does not hold a valid private key (%v); create one with: (umask 077; mpdetour relay genkey > %s)", path, err, path)
	}
	return k, nil
}

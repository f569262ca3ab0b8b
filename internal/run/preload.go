package run

import (
	"bytes"
	"debug/elf"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
)

// libCandidates are where Debian/Ubuntu (mptcpize package, libmptcpwrap0)
// and source installs of mptcpd put the LD_PRELOAD converter.
var libCandidates = []string{
	"/usr/lib/x86_64-linux-gnu/mptcpize/libmptcpwrap.so.0.0.1",
	"/usr/lib/x86_64-linux-gnu/mptcpize/libmptcpwrap.so.0",
	"/usr/lib/x86_64-linux-gnu/libmptcpwrap.so.0.0.1",
	"/usr/lib/x86_64-linux-gnu/libmptcpwrap.so.0",
	"/usr/lib64/mptcpize/libmptcpwrap.so.0",
	"/usr/lib64/libmptcpwrap.so.0",
	"/usr/local/lib/mptcpize/libmptcpwrap.so.0",
	"/usr/local/lib/libmptcpwrap.so.0",
}

// FindPreloadLibrary returns the path of libmptcpwrap, honouring
// MPDETOUR_LIBMPTCPWRAP.
func FindPreloadLibrary() (string, error) {
	if p := os.Getenv("MPDETOUR_LIBMPTCPWRAP"); p != "" {
		if _, err := os.Stat(p); err != nil {
			return "", fmt.Errorf("MPDETOUR_LIBMPTCPWRAP: %w", err)
		}
		return p, nil
	}
	for _, p := range libCandidates {
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	return "", fmt.Errorf("libmptcpwrap not found (install Debian package libmptcpwrap0 / mptcpize, or set MPDETOUR_LIBMPTCPWRAP); looked in %s",
		filepath.Dir(libCandidates[0]))
}

// IsStatic reports whether the program at path is an ELF executable
// without program interpreter, i.e. LD_PRELOAD cannot reach it. For a "#!"
// script it answers for the script's interpreter.
func IsStatic(path string) (bool, error) {
	for depth := 0; depth < 4; depth++ {
		interp, err := shebang(path)
		if err != nil {
			return false, err
		}
		if interp == "" {
			break
		}
		path = interp
	}
	f, err := elf.Open(path)
	if err != nil {
		return false, err
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return false, nil
		}
	}
	return true, nil
}

func execPreload(path string, argv, env []string, warn io.Writer) error {
	lib, err := FindPreloadLibrary()
	if err != nil {
		return &ExitError{ExitSetup, err}
	}
	if static, err := IsStatic(path); err == nil && static {
		fmt.Fprintf(warn, "mpdetour run: warning: %s is statically linked; the LD_PRELOAD mechanism cannot convert its sockets (they stay TCP)\n", path)
	} else if err != nil {
		fmt.Fprintf(warn, "mpdetour run: warning: LD_PRELOAD mechanism: only dynamically linked programs are covered (%s: %v)\n", path, err)
	}
	env = withPreload(env, lib)
	restoreSignals()
	err = syscall.Exec(path, argv, env)
	return &ExitError{ExitCannotExec, fmt.Errorf("exec %s: %w", path, err)}
}

// withPreload prepends lib to LD_PRELOAD, keeping what the caller preloads.
func withPreload(env []string, lib string) []string {
	out := make([]string, 0, len(env)+1)
	val := lib
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, "LD_PRELOAD="); ok {
			if v != "" {
				val = lib + ":" + v
			}
			continue
		}
		out = append(out, kv)
	}
	return append(out, "LD_PRELOAD="+val)
}

// shebang returns the interpreter named by a "#!" line, or "".
func shebang(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	b := make([]byte, 256)
	n, _ := io.ReadFull(f, b)
	b = b[:n]
	if !bytes.HasPrefix(b, []byte("#!")) {
		return "", nil
	}
	line, _, _ := bytes.Cut(b[2:], []byte("\n"))
	fields := strings.Fields(string(line))
	if len(fields) == 0 {
		return "", fmt.Errorf("%s: empty #! line", path)
	}
	return fields[0], nil
}

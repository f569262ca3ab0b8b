package main

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// binFlagUsage documents the --bin flag of the commands that start product
// daemons in lab nodes.
const binFlagUsage = "mpdetour binary to start in lab nodes (default: mpdetour beside mpdetour-lab)"

// productBinary returns the mpdetour executable the lab starts in its
// nodes (relay, agent, run, bench send): bin if given, else mpdetour in the
// directory of this executable (make build puts both in bin/).
func productBinary(bin string) (string, error) {
	if bin == "" {
		self, err := os.Executable()
		if err != nil {
			return "", fmt.Errorf("finding the mpdetour binary beside this one: %w (give --bin PATH)", err)
		}
		bin = filepath.Join(filepath.Dir(self), "mpdetour")
	}
	abs, err := filepath.Abs(bin)
	if err != nil {
		return "", err
	}
	fi, err := os.Stat(abs)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return "", fmt.Errorf("the lab starts the product daemons from the mpdetour binary, and %s does not exist: build it (make build), or give --bin PATH", abs)
	case err != nil:
		return "", fmt.Errorf("the lab starts the product daemons from the mpdetour binary: %w", err)
	case !fi.Mode().IsRegular() || fi.Mode().Perm()&0o111 == 0:
		return "", fmt.Errorf("the lab starts the product daemons from the mpdetour binary, and %s is not an executable file: give --bin PATH", abs)
	}
	return abs, nil
}

package benchtool

import "syscall"

// RaiseNofile raises RLIMIT_NOFILE towards n: the soft limit up to the
// hard one, the hard one too where the process may (CAP_SYS_RESOURCE). It
// returns the soft limit in force.
func RaiseNofile(n uint64) (uint64, error) {
	var r syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &r); err != nil {
		return 0, err
	}
	if r.Cur >= n {
		return r.Cur, nil
	}
	want := r
	want.Cur, want.Max = n, max(r.Max, n)
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &want); err == nil {
		return n, nil
	}
	r.Cur = r.Max // not allowed above the hard limit: as far as it goes
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &r); err != nil {
		return 0, err
	}
	return r.Cur, nil
}

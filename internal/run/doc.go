// Package run turns the TCP stream sockets of unmodified programs into
// MPTCP sockets ("mpdetour run").
//
// The main mechanism is a seccomp user-notification supervisor, because it
// also covers statically linked programs (Go binaries) that never go through
// libc: the mpdetour process installs a filter that traps only
// socket(AF_INET|AF_INET6, SOCK_STREAM, 0|IPPROTO_TCP), hands the listener to
// a detached supervisor process and then execs the program in place, so the
// program keeps mpdetour's PID and its exit status and signals reach the
// caller untouched. The supervisor creates socket(domain, type, IPPROTO_MPTCP)
// and installs it into the program with SECCOMP_IOCTL_NOTIF_ADDFD and the
// SEND flag; when MPTCP is unavailable it lets the original call through.
//
// Where seccomp user notification is missing (Linux < 5.14) the package falls
// back to LD_PRELOAD of Debian mptcpd's libmptcpwrap, which only covers
// dynamically linked programs.
package run

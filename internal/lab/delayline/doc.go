// Package delayline is the lab's user-space delay line, for kernels
// without tc netem. It is the one place in mpdetour that forwards packets.
//
// # Contract with the lab
//
// For each delayed link the lab creates a hidden middle namespace holding
// two interfaces, A and B, whose veth peers are the link's endpoint
// interfaces. The interfaces carry no addresses, are up, have IPv6 disabled
// (so the middle namespace sends nothing of its own) and have TSO, GSO, GRO
// and TX checksum offload turned off on both ends of both veths: the delay
// line moves wire-size Ethernet frames with complete checksums. Rate limits
// are tbf on the endpoints; loss is nftables in the lab or LossAB/LossBA
// here. The lab then starts one process per lab that calls Run with a
// Config (or runs Command, which reads the Config from a JSON state file)
// and stops it with SIGTERM.
//
// # Design
//
// Each interface has one AF_PACKET socket, created with protocol 0 inside
// the middle namespace, set to PACKET_IGNORE_OUTGOING (or it would read back
// its own transmissions) and then bound to ETH_P_ALL on that interface.
// Each direction of a link has:
//
//   - a ring of fixed-size slots (MTU + 18 bytes, 64-byte aligned) shared
//     by exactly one reader and one writer goroutine; frames are received
//     into the slots and sent from them, never copied;
//   - a reader that takes up to 64 frames per recvmmsg and stamps each with
//     the kernel's arrival time (SO_TIMESTAMPNS), so time spent waiting to be
//     read counts towards the delay instead of adding to it;
//   - a writer that sleeps on an absolute CLOCK_MONOTONIC timerfd through
//     Go's poller until the oldest frame is due, then hands every frame due
//     within the next 25 µs to one sendmmsg. Arrival stamps are converted to
//     the monotonic clock on reading, so wall-clock steps do not disturb the
//     delays.
//
// Release times are max(arrival + delay, previous release), so a direction
// never reorders frames, whatever the clock or timestamps do. Sockets are
// non-blocking and parked in epoll, so idle directions cost nothing.
//
// # Limits
//
// Memory per direction is fixed at start: QueueLimit slots, by default
// clamp(delay × 100 000/s, 1024, 262 144) — 1.5 MiB for 5 ms, 15 MiB for
// 100 ms — plus 4 MiB socket buffers charged by the kernel only when used.
// Frames that find the ring full, frames larger than a slot (offloads left
// on), send errors and the kernel's own socket drops are counted per
// direction (Line.Stats, logged at exit). Run raises its process to
// SCHED_FIFO priority 10, because with normal priority a CPU-starved delay
// line releases frames tens of milliseconds late; docs/lab.md has the
// measurements, the throughput ceiling and the CPU use.
package delayline

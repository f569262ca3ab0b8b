package run

import (
	"fmt"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Kernel ABI of <linux/seccomp.h>; the sizes are checked against
// SECCOMP_GET_NOTIF_SIZES before the supervisor starts.
type seccompData struct {
	Nr   int32
	Arch uint32
	IP   uint64
	Args [6]uint64
}

type seccompNotif struct {
	ID    uint64
	Pid   uint32
	Flags uint32
	Data  seccompData
}

type seccompNotifResp struct {
	ID    uint64
	Val   int64
	Error int32
	Flags uint32
}

type seccompNotifAddfd struct {
	ID         uint64
	Flags      uint32
	Srcfd      uint32
	Newfd      uint32
	NewfdFlags uint32
}

type seccompNotifSizes struct {
	Notif     uint16
	NotifResp uint16
	Data      uint16
}

const seccompGetNotifSizes = 3 // SECCOMP_GET_NOTIF_SIZES

func ioctlPtr(fd int, req uintptr, arg unsafe.Pointer) (uintptr, error) {
	r, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), req, uintptr(arg))
	if errno != 0 {
		return 0, errno
	}
	return r, nil
}

func notifRecv(lfd int, n *seccompNotif) error {
	*n = seccompNotif{} // the kernel rejects a buffer that is not zeroed
	_, err := ioctlPtr(lfd, unix.SECCOMP_IOCTL_NOTIF_RECV, unsafe.Pointer(n))
	return err
}

func notifSend(lfd int, r *seccompNotifResp) error {
	_, err := ioctlPtr(lfd, unix.SECCOMP_IOCTL_NOTIF_SEND, unsafe.Pointer(r))
	return err
}

func notifIDValid(lfd int, id uint64) error {
	_, err := ioctlPtr(lfd, unix.SECCOMP_IOCTL_NOTIF_ID_VALID, unsafe.Pointer(&id))
	return err
}

func notifAddfd(lfd int, a *seccompNotifAddfd) (int, error) {
	r, err := ioctlPtr(lfd, unix.SECCOMP_IOCTL_NOTIF_ADDFD, unsafe.Pointer(a))
	return int(r), err
}

// checkNotifSizes fails when the kernel's notification structures differ
// from the ones compiled in here.
func checkNotifSizes() error {
	var s seccompNotifSizes
	_, _, errno := unix.Syscall(unix.SYS_SECCOMP, seccompGetNotifSizes, 0, uintptr(unsafe.Pointer(&s)))
	if errno != 0 {
		return fmt.Errorf("seccomp(SECCOMP_GET_NOTIF_SIZES): %w", errno)
	}
	if int(s.Notif) != int(unsafe.Sizeof(seccompNotif{})) || int(s.NotifResp) != int(unsafe.Sizeof(seccompNotifResp{})) ||
		int(s.Data) != int(unsafe.Sizeof(seccompData{})) {
		return &sizeError{s}
	}
	return nil
}

type sizeError struct{ s seccompNotifSizes }

func (e *sizeError) Error() string {
	return fmt.Sprintf("kernel seccomp notification sizes (notif %d, resp %d, data %d) differ from this build",
		e.s.Notif, e.s.NotifResp, e.s.Data)
}

// struct pidfd_info, version 0 (64 bytes) of <linux/pidfd.h>.
type pidfdInfo struct {
	Mask     uint64
	CgroupID uint64
	Pid      uint32
	Tgid     uint32
	Ppid     uint32
	Ruid     uint32
	Rgid     uint32
	Euid     uint32
	Egid     uint32
	Suid     uint32
	Sgid     uint32
	Fsuid    uint32
	Fsgid    uint32
	_        uint32
}

const (
	pidfdThread    = unix.O_EXCL // PIDFD_THREAD (Linux 6.9)
	pidfdInfoCreds = 1 << 1      // PIDFD_INFO_CREDS
	// pidfdGetInfo is PIDFD_GET_INFO = _IOWR(0xFF, 11, struct pidfd_info)
	// for the 64-byte version 0 of the struct (Linux 6.13).
	pidfdGetInfo = 3<<30 | 64<<16 | 0xFF<<8 | 11
)

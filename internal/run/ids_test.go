package run

import (
	"os"
	"os/exec"
	"strconv"
	"testing"

	"golang.org/x/sys/unix"
)

// callerFsIDs reads another task's filesystem ids; on Linux 6.13+ through
// PIDFD_GET_INFO, else /proc. Both must agree with the kernel's view.
func TestCallerFsIDs(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to start a task as another user")
	}
	cmd := exec.Command("setpriv", "--reuid=65534", "--regid=65533", "--clear-groups", "sleep", "30")
	if err := cmd.Start(); err != nil {
		t.Skip("setpriv unavailable:", err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	pid := cmd.Process.Pid
	var u unix.Utsname
	unix.Uname(&u)
	newKernel := kernelAtLeast(unix.ByteSliceToString(u.Release[:]), 6, 13)
	for _, viaProc := range []bool{false, true} {
		s := &supervisor{noPidfdInfo: viaProc}
		// setpriv changes ids before exec'ing sleep: wait until it has.
		var uid, gid int
		var err error
		for i := 0; i < 200; i++ {
			if uid, gid, err = s.callerFsIDs(pid, strconv.Itoa(pid)); err == nil && uid == 65534 {
				break
			}
			exec.Command("sleep", "0.01").Run()
		}
		if err != nil || uid != 65534 || gid != 65533 {
			t.Errorf("viaProc=%v: got %d/%d %v, want 65534/65533", viaProc, uid, gid, err)
		}
		if !viaProc && newKernel && s.noPidfdInfo {
			t.Errorf("PIDFD_GET_INFO not used on a kernel that has it")
		}
	}
	s := &supervisor{}
	if _, _, err := s.callerFsIDs(1<<22+12345, "4206649"); err == nil {
		t.Error("no error for a task that does not exist")
	}
}

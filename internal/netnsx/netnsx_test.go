package netnsx

import (
	"os"
	"runtime"
	"strings"
	"testing"

	"github.com/mpdetour/mpdetour/internal/testenv"
	"github.com/vishvananda/netns"
)

func TestOpenRejectsUnknown(t *testing.T) {
	for _, spec := range []string{"mpdetour-no-such-ns", "/nonexistent/ns"} {
		if _, err := Open(spec); err == nil || !strings.Contains(err.Error(), spec) {
			t.Errorf("Open(%q) = %v, want an error naming it", spec, err)
		}
		if err := Do(spec, func() error { t.Error("fn ran"); return nil }); err == nil {
			t.Errorf("Do(%q) succeeded", spec)
		}
	}
}

func TestDoEntersNamespace(t *testing.T) {
	testenv.Root(t)
	name := "tn-" + strings.ReplaceAll(t.Name(), "/", "-")
	// NewNamed also moves its thread into the new namespace: use a thread
	// of its own, never unlocked, so the runtime retires it.
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		h, err := netns.NewNamed(name)
		if err == nil {
			h.Close()
		}
		errc <- err
	}()
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { netns.DeleteNamed(name) })
	own, err := os.Readlink("/proc/thread-self/ns/net")
	if err != nil {
		t.Fatal(err)
	}
	for _, spec := range []string{name, "/run/netns/" + name} {
		var inside string
		if err := Do(spec, func() (err error) {
			inside, err = os.Readlink("/proc/thread-self/ns/net")
			return err
		}); err != nil {
			t.Fatal(err)
		}
		if inside == own {
			t.Errorf("Do(%q) ran fn in the caller's namespace %s", spec, own)
		}
	}
	var here string
	if err := Do("", func() (err error) { here, err = os.Readlink("/proc/thread-self/ns/net"); return err }); err != nil || here != own {
		t.Errorf(`Do("") ran in %s (err %v), want the caller's %s`, here, err, own)
	}
}

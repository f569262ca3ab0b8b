package tunnel

import (
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"runtime"
	"runtime/pprof"
	"testing"
	"time"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"

	"github.com/mpdetour/mpdetour/internal/testenv"
	"github.com/mpdetour/mpdetour/internal/testenv/netnstest"
)

// BenchmarkEmbeddedDeviceHeap measures what an embedded wireguard-go device
// (the agent's tunnel detours where the kernel has no WireGuard) holds in
// the Go heap once it is up, with no traffic: its batch buffers are
// allocated when its routines start (docs/results/footprint).
// MPDETOUR_HEAP_PROFILE=FILE writes a heap profile (go tool pprof -top).
//
//	go test -run '^$' -bench EmbeddedDeviceHeap -benchtime 1x ./internal/tunnel/
func BenchmarkEmbeddedDeviceHeap(b *testing.B) {
	testenv.Root(b)
	const devices = 2
	ns := netnstest.New(b, "twheap")
	ref, err := openNetns(ns.Name)
	if err != nil {
		b.Fatal(err)
	}
	defer ref.close()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	heap := func() uint64 {
		runtime.GC()
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return m.HeapInuse
	}
	var before, after uint64
	for b.Loop() {
		before = heap()
		var devs []*embeddedDevice
		for i := 0; i < devices; i++ {
			d, err := newEmbeddedDevice(ref, fmt.Sprintf("mph%d", i), 1420, log)
			if err != nil {
				b.Fatal(err)
			}
			devs = append(devs, d)
			priv, _ := wgtypes.GeneratePrivateKey()
			peer, _ := wgtypes.GeneratePrivateKey()
			_, allowed, _ := net.ParseCIDR("100.80.0.1/32")
			err = d.Configure(wgtypes.Config{PrivateKey: &priv, Peers: []wgtypes.PeerConfig{{
				PublicKey: peer.PublicKey(), Endpoint: &net.UDPAddr{IP: net.IPv4(192, 0, 2, 1), Port: 51820},
				AllowedIPs: []net.IPNet{*allowed},
			}}})
			if err != nil {
				b.Fatal(err)
			}
		}
		time.Sleep(time.Second) // the routines start and take their buffers
		after = heap()
		if p := os.Getenv("MPDETOUR_HEAP_PROFILE"); p != "" {
			f, err := os.Create(p)
			if err != nil {
				b.Fatal(err)
			}
			if err := pprof.Lookup("heap").WriteTo(f, 0); err != nil {
				b.Fatal(err)
			}
			f.Close()
		}
		for _, d := range devs {
			d.Close()
		}
	}
	b.ReportMetric(float64(after-before)/devices/(1<<20), "MiB-heap/device")
}

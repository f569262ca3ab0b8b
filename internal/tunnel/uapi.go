package tunnel

import (
	"bufio"
	"encoding/hex"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
)

// Why this file exists (the one hand-written piece of WireGuard plumbing):
// the embedded device is configured in-process through wireguard-go's
// Device.IpcSet/IpcGet, which take and return the cross-platform UAPI text.
// wgctrl speaks that text only in its internal wguser package, over the
// UAPI unix socket in /var/run/wireguard; using the socket instead would
// work but its directory is one per host, not per network namespace, so
// two embedded devices of the same name in different namespaces (every lab
// and test topology has them) would collide. wireguard-go exports no
// encoder or decoder. So the two small translations live here, tested
// against wireguard-go itself (unit_test.go) and fuzzed.

// uapiSet renders a wgctrl configuration as WireGuard's cross-platform
// configuration protocol ("set=1" body) for wireguard-go's IpcSet, so both
// backends are configured from the same value.
func uapiSet(cfg wgtypes.Config) string {
	var b strings.Builder
	kv := func(k, v string) { b.WriteString(k + "=" + v + "\n") }
	if cfg.PrivateKey != nil {
		kv("private_key", hex.EncodeToString(cfg.PrivateKey[:]))
	}
	if cfg.ListenPort != nil {
		kv("listen_port", strconv.Itoa(*cfg.ListenPort))
	}
	if cfg.FirewallMark != nil {
		kv("fwmark", strconv.Itoa(*cfg.FirewallMark))
	}
	if cfg.ReplacePeers {
		kv("replace_peers", "true")
	}
	for _, p := range cfg.Peers {
		kv("public_key", hex.EncodeToString(p.PublicKey[:]))
		if p.Remove {
			kv("remove", "true")
			continue
		}
		if p.UpdateOnly {
			kv("update_only", "true")
		}
		if p.PresharedKey != nil {
			kv("preshared_key", hex.EncodeToString(p.PresharedKey[:]))
		}
		if p.Endpoint != nil {
			kv("endpoint", p.Endpoint.String())
		}
		if p.PersistentKeepaliveInterval != nil {
			kv("persistent_keepalive_interval", strconv.Itoa(int(p.PersistentKeepaliveInterval.Seconds())))
		}
		if p.ReplaceAllowedIPs {
			kv("replace_allowed_ips", "true")
		}
		for _, ip := range p.AllowedIPs {
			kv("allowed_ip", ip.String())
		}
	}
	return b.String()
}

// parseUAPIGet parses the "get=1" answer of wireguard-go into wgctrl's
// device type. The text comes from our own in-process device, but the
// parser still rejects anything malformed with an error naming the line.
func parseUAPIGet(s string) (*wgtypes.Device, error) {
	dev := &wgtypes.Device{}
	var peer *wgtypes.Peer
	var hsSec, hsNsec int64
	flush := func() {
		if peer != nil {
			if hsSec != 0 || hsNsec != 0 {
				peer.LastHandshakeTime = time.Unix(hsSec, hsNsec)
			}
			dev.Peers = append(dev.Peers, *peer)
		}
		hsSec, hsNsec = 0, 0
	}
	sc := bufio.NewScanner(strings.NewReader(s))
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		if line == "" {
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if !ok {
			return nil, fmt.Errorf("uapi line %d: no '=' in %q", n, line)
		}
		bad := func(err error) error { return fmt.Errorf("uapi line %d: bad %s %q: %v", n, k, v, err) }
		if k == "public_key" {
			flush()
			key, err := parseHexKey(v)
			if err != nil {
				return nil, bad(err)
			}
			peer = &wgtypes.Peer{PublicKey: key}
			continue
		}
		if peer == nil {
			switch k {
			case "private_key":
				key, err := parseHexKey(v)
				if err != nil {
					return nil, bad(err)
				}
				dev.PrivateKey = key
				dev.PublicKey = key.PublicKey()
			case "listen_port":
				p, err := strconv.ParseUint(v, 10, 16)
				if err != nil {
					return nil, bad(err)
				}
				dev.ListenPort = int(p)
			case "fwmark":
				m, err := strconv.ParseUint(v, 10, 32)
				if err != nil {
					return nil, bad(err)
				}
				dev.FirewallMark = int(m)
			case "errno":
				if v != "0" {
					return nil, fmt.Errorf("uapi: errno=%s", v)
				}
			default:
				return nil, fmt.Errorf("uapi line %d: unknown device key %q", n, k)
			}
			continue
		}
		var err error
		switch k {
		case "preshared_key":
			peer.PresharedKey, err = parseHexKey(v)
		case "protocol_version":
			peer.ProtocolVersion, err = strconv.Atoi(v)
		case "endpoint":
			var ap netip.AddrPort
			ap, err = netip.ParseAddrPort(v)
			if err == nil {
				peer.Endpoint = net.UDPAddrFromAddrPort(ap)
			}
		case "last_handshake_time_sec":
			hsSec, err = strconv.ParseInt(v, 10, 64)
		case "last_handshake_time_nsec":
			hsNsec, err = strconv.ParseInt(v, 10, 64)
		case "tx_bytes":
			peer.TransmitBytes, err = strconv.ParseInt(v, 10, 64)
		case "rx_bytes":
			peer.ReceiveBytes, err = strconv.ParseInt(v, 10, 64)
		case "persistent_keepalive_interval":
			var s uint64
			s, err = strconv.ParseUint(v, 10, 16)
			peer.PersistentKeepaliveInterval = time.Duration(s) * time.Second
		case "allowed_ip":
			var p netip.Prefix
			p, err = netip.ParsePrefix(v)
			if err == nil {
				peer.AllowedIPs = append(peer.AllowedIPs, net.IPNet{
					IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen()),
				})
			}
		case "errno":
			if v != "0" {
				return nil, fmt.Errorf("uapi: errno=%s", v)
			}
		default:
			return nil, fmt.Errorf("uapi line %d: unknown peer key %q", n, k)
		}
		if err != nil {
			return nil, bad(err)
		}
	}
	flush()
	return dev, sc.Err()
}

func parseHexKey(s string) (wgtypes.Key, error) {
	var k wgtypes.Key
	b, err := hex.DecodeString(s)
	if err != nil {
		return k, err
	}
	if len(b) != len(k) {
		return k, fmt.Errorf("key is %d bytes, want %d", len(b), len(k))
	}
	copy(k[:], b)
	return k, nil
}

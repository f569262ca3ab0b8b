package agentd

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/mpdetour/mpdetour/internal/relayclient"
	"github.com/mpdetour/mpdetour/internal/relayconn"
	"github.com/mpdetour/mpdetour/internal/tunnel/tunnelctl"
)

// reloadOnHangup: on SIGHUP the agent re-reads its file's member key and
// certificate (relays: key/key_file, certificate_file) and, when they
// changed, rotates them in place on every relay
// (relayclient.NATSource.Rotate: each relay carries the old key's detours
// over to the new key) and then on that relay's WireGuard tunnel. Nothing
// else of the file is applied (docs/collective.md, "Key rotation").
//
// hup is already registered for SIGHUP (signal.Notify) by the caller.
// Without relays (nil) a SIGHUP is logged and changes nothing.
func reloadOnHangup(ctx context.Context, hup <-chan os.Signal, path string, relays *relayclient.NATSource, tunnels []*tunnelctl.TunnelSource, log *slog.Logger) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-ctx.Done():
				return
			case <-hup:
			}
			if relays == nil {
				log.Info("SIGHUP: no relays section, no member key to rotate (the agent reloads nothing else)")
				continue
			}
			if err := rotateMemberKey(ctx, path, relays, tunnels, log); err != nil {
				log.Error("SIGHUP: member key rotation", "err", err)
			}
		}
	}()
	return func() {
		cancel()
		<-done
	}
}

// rotateMemberKey applies the key and certificate of the file at path.
func rotateMemberKey(ctx context.Context, path string, relays *relayclient.NATSource, tunnels []*tunnelctl.TunnelSource, log *slog.Logger) error {
	cfg, err := LoadConfig(path)
	if err != nil {
		return fmt.Errorf("configuration not reloaded: %w", err)
	}
	if cfg.Relays == nil {
		return errors.New("the configuration has no relays section any more; keeping the running key")
	}
	followRelayKeys(cfg.Relays.Relays, relays.Conns(), log)
	key, cert := cfg.Relays.PrivateKey, cfg.Relays.Options.Certificate
	old := relays.Key()
	if key == old {
		relays.SetCertificate(cert)
		log.Info("SIGHUP: member key unchanged (certificate re-read; the agent reloads nothing else)", "key", key.Public().ID())
		return nil
	}
	log.Info("SIGHUP: rotating the member key on every relay (the agent reloads nothing else)", "old_key", old.Public().ID(), "new_key", key.Public().ID())
	rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	start := time.Now()
	err = relays.Rotate(rctx, key, cert, func(c *relayconn.Conn, err error) {
		for _, t := range tunnels {
			if t.Conn() != c {
				continue
			}
			if c.SessionKey() != key.Public() || c.ConfirmedKey() != key.Public() {
				// The relay still knows us by the old key (say, it refused
				// the new certificate) or refused the rotation (say,
				// name-mismatch): its WireGuard peer keeps the old key.
				// The tunnel follows once the relay confirms a rotation
				// (tunnelctl.TunnelSource.follow).
				log.Warn("key rotation: tunnel keeps the old key until the relay confirms the rotation", "relay", c.Relay().Name, "err", err)
				continue
			}
			if terr := t.Rekey(key); terr != nil {
				log.Error("key rotation: tunnel", "relay", c.Relay().Name, "err", terr)
			}
		}
	})
	if err != nil {
		return err
	}
	log.Info("member key rotated: every relay carried the detours over", "new_key", key.Public().ID(), "took", time.Since(start).Round(time.Millisecond))
	return nil
}

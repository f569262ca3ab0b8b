package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/mpdetour/mpdetour/internal/cli"
	"github.com/mpdetour/mpdetour/internal/collective"
	"github.com/mpdetour/mpdetour/internal/proto"
)

// collectiveCommand builds the collective group: the authority's offline
// operations on member certificates and revocation lists.
func collectiveCommand() *cli.Command {
	return &cli.Command{
		Name:    "collective",
		Summary: "a Detour Collective's authority: init, issue and revoke member certificates, show them; present usage receipts (docs/collective.md)",
		Sub:     []*cli.Command{collectiveInit(), collectiveIssue(), collectiveRevoke(), collectiveShow(), collectivePresent(), movedToLab("simulate", "mpdetour collective simulate", "mpdetour-lab collective simulate")},
	}
}

func collectiveInit() *cli.Command {
	var dir string
	return &cli.Command{
		Name:    "init",
		Summary: "make a new authority key: DIR/authority.key (private, keep offline) and DIR/authority.pub",
		Usage:   "--dir DIR",
		Flags: func(fs *flag.FlagSet) {
			fs.StringVar(&dir, "dir", "", "directory for authority.key and authority.pub (created; existing keys are never overwritten)")
		},
		Run: func(ctx context.Context, args []string) error {
			if len(args) > 0 || dir == "" {
				return cli.Usagef("collective init needs --dir DIR and no arguments")
			}
			if err := os.MkdirAll(dir, 0o700); err != nil {
				return err
			}
			a, err := collective.NewAuthority()
			if err != nil {
				return err
			}
			priv, pub := filepath.Join(dir, "authority.key"), filepath.Join(dir, "authority.pub")
			if err := writeNew(priv, a.String()+"\n", 0o600); err != nil {
				return err
			}
			if err := writeNew(pub, a.Public().String()+"\n", 0o644); err != nil {
				os.Remove(priv)
				return err
			}
			fmt.Printf("authority public key (give it to every relay and agent): %s\nprivate key: %s (keep it offline)\n", a.Public(), priv)
			return nil
		},
	}
}

// writeNew writes a file that must not exist yet.
func writeNew(path, content string, mode os.FileMode) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode)
	if err != nil {
		if errors.Is(err, os.ErrExist) {
			return fmt.Errorf("%s exists: not overwriting a key", path)
		}
		return err
	}
	if _, err := f.WriteString(content); err != nil {
		f.Close()
		os.Remove(path)
		return err
	}
	return f.Close()
}

// writeAtomic replaces path with content (rename over it).
func writeAtomic(path, content string, mode os.FileMode) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.WriteString(content); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Chmod(mode); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}

func loadAuthority(path string) (*collective.Authority, error) {
	if path == "" {
		return nil, cli.Usagef("--authority FILE (the private authority key) is required")
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	a, err := collective.ParseAuthority(string(b))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return a, nil
}

func collectiveIssue() *cli.Command {
	var auth, name, key, roles, notBefore string
	var valid time.Duration
	return &cli.Command{
		Name:    "issue",
		Summary: "sign a member certificate (printed on stdout, one line)",
		Usage:   "--authority FILE --name NAME --key MEMBER_PUBLIC_KEY [--roles client,relay] [--valid 8760h] [--not-before RFC3339]",
		Flags: func(fs *flag.FlagSet) {
			fs.StringVar(&auth, "authority", "", "the authority's private key file (collective init)")
			fs.StringVar(&name, "name", "", "the member's name (1-64 bytes), shown in relay logs and attribution")
			fs.StringVar(&key, "key", "", "the member's public key (mpdetour relay pubkey < member.key)")
			fs.StringVar(&roles, "roles", "client", "client, relay or client,relay")
			fs.DurationVar(&valid, "valid", 365*24*time.Hour, "validity from --not-before")
			fs.StringVar(&notBefore, "not-before", "", "start of validity (RFC 3339; default now)")
		},
		Run: func(ctx context.Context, args []string) error {
			if len(args) > 0 {
				return cli.Usagef("collective issue takes no arguments")
			}
			a, err := loadAuthority(auth)
			if err != nil {
				return err
			}
			m, err := proto.ParseKey(key)
			if err != nil {
				return cli.Usagef("--key: %v", err)
			}
			r, err := collective.ParseRoles(roles)
			if err != nil {
				return cli.Usagef("--roles: %v", err)
			}
			nb := time.Now()
			if notBefore != "" {
				if nb, err = time.Parse(time.RFC3339, notBefore); err != nil {
					return cli.Usagef("--not-before: %v", err)
				}
			}
			if valid <= 0 {
				return cli.Usagef("--valid must be positive")
			}
			c, err := a.Issue(m, name, r, nb, nb.Add(valid))
			if err != nil {
				return err
			}
			fmt.Println(c)
			fmt.Fprintf(os.Stderr, "issued serial %d to %s (%s), valid %s to %s\n", c.Serial, c.Name, c.Roles,
				c.NotBefore.Format(time.RFC3339), c.NotAfter.Format(time.RFC3339))
			return nil
		},
	}
}

func collectiveRevoke() *cli.Command {
	var auth, crl string
	return &cli.Command{
		Name:    "revoke",
		Summary: "add certificate serials to the signed revocation list (created if absent, replaced atomically)",
		Usage:   "--authority FILE --crl FILE SERIAL...",
		Flags: func(fs *flag.FlagSet) {
			fs.StringVar(&auth, "authority", "", "the authority's private key file")
			fs.StringVar(&crl, "crl", "", "the revocation list file to update")
		},
		Interspersed: true,
		Run: func(ctx context.Context, args []string) error {
			if crl == "" || len(args) == 0 {
				return cli.Usagef("collective revoke needs --crl FILE and at least one SERIAL")
			}
			a, err := loadAuthority(auth)
			if err != nil {
				return err
			}
			var serials []uint64
			for _, s := range args {
				n, err := strconv.ParseUint(s, 10, 64)
				if err != nil {
					return cli.Usagef("serial %q is not a number (collective show CERT prints it)", s)
				}
				serials = append(serials, n)
			}
			var prev *collective.RevocationList
			if b, err := os.ReadFile(crl); err == nil {
				if prev, err = collective.ParseRevocationList(string(b), a.Public()); err != nil {
					return fmt.Errorf("%s: %w", crl, err)
				}
			} else if !errors.Is(err, os.ErrNotExist) {
				return err
			}
			l := a.Revoke(prev, time.Now(), serials...)
			if err := writeAtomic(crl, l.String()+"\n", 0o644); err != nil {
				return err
			}
			fmt.Printf("%s: seq %d, %d serials revoked\n", crl, l.Seq, len(l.Serials))
			return nil
		},
	}
}

func collectiveShow() *cli.Command {
	var authPub string
	return &cli.Command{
		Name:    "show",
		Summary: "print a certificate or revocation list file (- = stdin), verified when --authority-pub is given",
		Usage:   "[--authority-pub FILE] FILE",
		Flags: func(fs *flag.FlagSet) {
			fs.StringVar(&authPub, "authority-pub", "", "the authority's public key file: verify the signature and dates")
		},
		Interspersed: true,
		Run: func(ctx context.Context, args []string) error {
			if len(args) != 1 {
				return cli.Usagef("collective show needs one FILE")
			}
			var b []byte
			var err error
			if args[0] == "-" {
				b, err = io.ReadAll(io.LimitReader(os.Stdin, 1<<20))
			} else {
				b, err = os.ReadFile(args[0])
			}
			if err != nil {
				return err
			}
			var ak *collective.AuthorityKey
			if authPub != "" {
				pb, err := os.ReadFile(authPub)
				if err != nil {
					return err
				}
				k, err := collective.ParseAuthorityKey(string(pb))
				if err != nil {
					return fmt.Errorf("%s: %w", authPub, err)
				}
				ak = &k
			}
			text := strings.TrimSpace(string(b))
			if strings.HasPrefix(text, "mpdetour-crl-") {
				if ak == nil {
					return cli.Usagef("a revocation list is shown only verified: give --authority-pub FILE")
				}
				l, err := collective.ParseRevocationList(text, *ak)
				if err != nil {
					return err
				}
				fmt.Printf("revocation list seq %d, issued %s, %d serials (signature ok)\n", l.Seq, l.Issued.Format(time.RFC3339), len(l.Serials))
				for _, s := range l.Serials {
					fmt.Println(" ", s)
				}
				return nil
			}
			c, err := collective.ParseCertificate(text)
			if err != nil {
				return err
			}
			fmt.Printf("certificate serial %d\n  name       %s\n  roles      %s\n  member key %s\n  valid      %s to %s\n",
				c.Serial, c.Name, c.Roles, c.Member, c.NotBefore.Format(time.RFC3339), c.NotAfter.Format(time.RFC3339))
			if ak != nil {
				if err := c.Verify(*ak, time.Now(), nil, 0); err != nil {
					return fmt.Errorf("certificate does not verify: %w", err)
				}
				fmt.Println("  signature  ok (authority " + ak.String() + ")")
			}
			return nil
		},
	}
}

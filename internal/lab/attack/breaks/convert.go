package breaks

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"
)

// convertDst is the destination the other user lies about (the lab's
// server, port 80: nothing listens, nothing is dialled).
const convertDstPort = 80

// rootView is what root's status says about the lie: lessons that answer
// root (uid 0, or no uid in builds that keep one table for all), and
// converters held or failed.
type rootView struct {
	lessons []string
	held    []string
}

func convertSocket(ctx context.Context, o Options) Result {
	r := Result{Break: 3, Metric: "cross-user effects", Target: "0"}
	if o.Self == "" || o.PeerCommand == "" {
		r.Error = "no lab binary to run as the other user"
		return r
	}
	if err := os.Chmod(o.Dir, 0o755); err != nil {
		return r.failed(err)
	}
	l, keys, err := begin(ctx, o, "c", 2)
	if err != nil {
		return r.failed(err)
	}
	defer l.close()
	relayKey, memberKey := keys[0], keys[1]
	relayAddr := netip.AddrPortFrom(l.Addr("detour1"), relayPort)
	if _, err := l.startRelay(ctx, o, "detour1", "relay", fmt.Sprintf("listen: %s\nprivate_key: %s\nports: 40000-40999\nlease: 1m\nmembers:\n  - {name: client, public_key: %s}\nconvert:\n  enabled: true\n  listen: %s\n",
		relayAddr, relayKey, memberKey.Public(), netip.AddrPortFrom(l.Addr("detour1"), 45674))); err != nil {
		return r.failed(err)
	}
	sock := filepath.Join(o.Dir, "convert.sock")
	agentCfg := filepath.Join(o.Dir, "agent.yaml")
	// subflow_lowat: 0: this case is not about the limit, and its BPF
	// program would attach to the cgroup v2 root (other labs' sockets);
	// the bench's per-runner cgroup (bench.withLabCgroup) is not
	// reachable from here (bench imports this package).
	if err := os.WriteFile(agentCfg, []byte(fmt.Sprintf("socket: %s\nsubflow_lowat: 0\nrelays:\n  key: %s\n  servers:\n    - {name: detour1, address: %s, public_key: %s}\nconvert:\n  enabled: true\n  socket: %s\n",
		filepath.Join(o.Dir, "agent.sock"), memberKey, relayAddr, relayKey.Public(), sock)), 0o600); err != nil {
		return r.failed(err)
	}
	if err := l.start(ctx, "client", filepath.Join(o.Dir, "agent.log"), o.Binary, "agent", "--config", agentCfg); err != nil {
		return r.failed(err)
	}
	before, err := convertReady(sock, 20*time.Second)
	if err != nil {
		r.Error = fmt.Sprintf("%v (logs in %s)", err, o.Dir)
		return r
	}
	dst := netip.AddrPortFrom(l.Addr("server"), convertDstPort).String()
	return r.judge(convertAttack(ctx, o, sock, dst, "detour1", before))
}

// convertReady waits for the agent's conversion socket to answer root
// with a converter known (tickets): root's view then.
func convertReady(sock string, wait time.Duration) (rootView, error) {
	var before rootView
	var converters int
	var err error
	for end := time.Now().Add(wait); ; time.Sleep(200 * time.Millisecond) {
		before, converters, err = view(sock, "")
		if err == nil && converters > 0 {
			return before, nil
		}
		if time.Now().After(end) {
			return before, fmt.Errorf("the agent's conversion socket did not answer root with a converter within %s (%v)", wait, err)
		}
	}
}

// convertAttack runs the other user's side (Self's PeerCommand as
// PeerUID) against the conversion socket sock: a lesson about dst, a
// converter failure of relay, a status request; then compares root's view
// with before. It returns the cross-user effects, whether there were none,
// and what it saw. An error: the attack could not be made.
func convertAttack(ctx context.Context, o Options, sock, dst, relay string, before rootView) (float64, bool, string, error) {
	if o.Self == "" || o.PeerCommand == "" {
		return 0, false, "", fmt.Errorf("no lab binary to run as the other user")
	}
	var mode os.FileMode
	if fi, err := os.Stat(sock); err == nil {
		mode = fi.Mode().Perm()
	}
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, o.Self, o.PeerCommand, "--socket", sock, "--dst", dst, "--relay", relay)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: PeerUID, Gid: PeerUID}}
	if err := cmd.Run(); err != nil {
		return 0, false, "", fmt.Errorf("the other user's side: %v: %s", err, stderr.String())
	}
	var peer map[string]string
	if err := json.Unmarshal(stdout.Bytes(), &peer); err != nil {
		return 0, false, "", fmt.Errorf("the other user's side printed %q: %v", stdout.String(), err)
	}
	after, _, err := view(sock, dst)
	if err != nil {
		return 0, false, "", fmt.Errorf("root's status after the attack: %w", err)
	}
	var effects []string
	if len(after.lessons) > 0 {
		effects = append(effects, "root's view holds the other user's lesson "+strings.Join(after.lessons, ", "))
	}
	if len(after.held) > len(before.held) {
		effects = append(effects, "the other user's report held converter "+strings.Join(after.held, ", ")+" for every user")
	}
	if peer["status"] == "" {
		effects = append(effects, "the status (every user's conversions) was answered to the other user")
	}
	var answers []string
	for _, op := range []string{"hello", "learn", "report", "status"} {
		a := peer[op]
		if a == "" {
			a = "answered"
		}
		answers = append(answers, op+": "+a)
	}
	sort.Strings(effects)
	detail := fmt.Sprintf("socket mode %04o; uid %d's requests: %s. ", mode, PeerUID, strings.Join(answers, "; "))
	if len(effects) == 0 {
		detail += "Root's view unchanged."
	} else {
		detail += "Effects: " + strings.Join(effects, "; ") + "."
	}
	return float64(len(effects)), len(effects) == 0, detail, nil
}

// view asks the conversion socket, as root, for its status: the lessons
// about dst that answer root and the converters held or failed, and how
// many converters it knows.
func view(sock, dst string) (rootView, int, error) {
	var v rootView
	rep, err := ask(sock, peerRequest{Op: "status"})
	if err != nil {
		return v, 0, err
	}
	if rep.Error != "" {
		return v, 0, fmt.Errorf("status refused to root: %s", rep.Error)
	}
	var st struct {
		Converters []struct {
			Relay       string    `json:"relay"`
			Failures    uint64    `json:"failures"`
			FailedUntil time.Time `json:"failed_until"`
		} `json:"converters"`
		NoMPTCP []struct {
			UID         *uint32 `json:"uid"`
			Destination string  `json:"destination"`
		} `json:"no_mptcp"`
	}
	if err := json.Unmarshal(rep.Status, &st); err != nil {
		return v, 0, fmt.Errorf("status %q: %w", rep.Status, err)
	}
	for _, d := range st.NoMPTCP {
		// A build with per-user lessons marks each with its uid (omitted
		// when 0, root's); one without keeps one table for every user.
		if d.Destination == dst && (d.UID == nil || *d.UID == 0) {
			v.lessons = append(v.lessons, d.Destination)
		}
	}
	for _, c := range st.Converters {
		if c.Failures > 0 || c.FailedUntil.After(time.Now()) {
			v.held = append(v.held, c.Relay)
		}
	}
	return v, len(st.Converters), nil
}

package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/mpdetour/mpdetour/internal/agent"
	"github.com/mpdetour/mpdetour/internal/cli"
	"github.com/mpdetour/mpdetour/internal/convclient"
	"github.com/mpdetour/mpdetour/internal/policy"
	"github.com/mpdetour/mpdetour/internal/subflowcc"
)

// statusCommand builds the status subcommand.
func statusCommand() *cli.Command {
	var socket string
	var asJSON bool
	var watch time.Duration
	return &cli.Command{
		Name:    "status",
		Summary: "show the agent's connections, subflows (path, role, RTT, rate, loss, last decision) and detours",
		Usage:   "[--json] [--watch INTERVAL] [--socket PATH]",
		Flags: func(fs *flag.FlagSet) {
			fs.StringVar(&socket, "socket", agent.DefaultSocket, "the agent's status socket")
			fs.BoolVar(&asJSON, "json", false, "print JSON (one document per refresh with --watch)")
			fs.DurationVar(&watch, "watch", 0, "refresh every INTERVAL (e.g. 1s) until interrupted")
		},
		Run: func(ctx context.Context, args []string) error {
			if len(args) > 0 {
				return cli.Usagef("status takes no arguments")
			}
			if watch < 0 || watch > 0 && watch < 100*time.Millisecond {
				return cli.Usagef("status --watch: interval %s too short (at least 100ms)", watch)
			}
			for {
				st, err := agent.FetchStatus(socket)
				if err != nil {
					return err
				}
				if asJSON {
					if err := printJSON(st); err != nil {
						return err
					}
				} else {
					if watch > 0 {
						fmt.Print("\033[H\033[2J") // clear the terminal
					}
					printStatus(st)
				}
				if watch == 0 {
					return nil
				}
				select {
				case <-ctx.Done():
					return nil
				case <-time.After(watch):
				}
			}
		},
	}
}

// printFamilies prints one line per address family: connections (and
// how many are on AF_INET6 sockets, the only ones that take subflows of
// the other family), subflows up (cross-family among them), detours.
func printFamilies(fs []agent.FamilyStatus) {
	for _, f := range fs {
		fmt.Printf("%s: %d connections (%d on AF_INET6), %d subflows up (%d cross-family), %d detours (%d healthy)\n",
			f.Family, f.Connections, f.OnInet6, f.Subflows, f.Cross, f.Detours, f.Healthy)
	}
}

func printStatus(st agent.Status) {
	c := st.Counters
	fmt.Printf("agent since %s, netns %q, policy %s (pm_type before: %s)\n", st.Started.Format("2006-01-02 15:04:05"), st.NetNS, st.Policy, st.PMTypeSaved)
	fmt.Printf("events %d, lost %d, resyncs %d, adopted %d, commands %d (%d failed)\n",
		c.Events, c.EventsLost, c.Resyncs, c.Adopted, c.Commands, c.CommandErrors)
	if l := st.Latency; l.Samples > 0 {
		fmt.Printf("ESTABLISHED -> SUBFLOW_CREATE sent: p50 %.2f ms, p99 %.2f ms, max %.2f ms (%d samples)\n", l.P50ms, l.P99ms, l.Maxms, l.Samples)
		a := st.LatencyAck
		fmt.Printf("ESTABLISHED -> SUBFLOW_CREATE acked: p50 %.2f ms, p99 %.2f ms, max %.2f ms\n", a.P50ms, a.P99ms, a.Maxms)
	}
	if st.DiagError != "" {
		fmt.Printf("inet_diag: %s\n", st.DiagError)
	}
	printFamilies(st.Families)
	printBlackhole(st.Blackhole)
	printCwndClamp(st.CwndClamp)
	printSubflowLowat(st.SubflowLowat)
	printSubflowPacing(st.SubflowPacing)
	printStale(st.StaleLossCnt)
	printSubflowCC(st.SubflowCongestion)
	printBuffers(st.BufferSizing)
	if g := st.PMTypeGuard; g != nil && (g.Restores > 0 || g.Error != "") {
		if g.Restores > 0 {
			fmt.Printf("WARNING: net.mptcp.pm_type was changed under the agent %d times (last: %s at %s) and set back to 1: another program changes it (mptcpd, NetworkManager, a sysctl.d file)\n",
				g.Restores, g.LastFound, g.LastRestore.Format("15:04:05"))
		}
		if g.Error != "" {
			fmt.Printf("ERROR: %s\n", g.Error)
		}
	}
	w := tabwriter.NewWriter(os.Stdout, 2, 4, 2, ' ', 0)
	fmt.Fprintf(w, "\nCONNECTION\tLOCAL\tREMOTE\tPATH\tROLE\tSTATE\tBACKUP\tSENT\tRECEIVED\tRTT ms\tMbit/s\tLOSS %%\tDECISION\n")
	convertedTo := map[string]string{} // local address -> destination
	conv, convErr := conversionsOf(st)
	if conv != nil {
		for _, c := range conv.Recent {
			convertedTo[c.Local] = c.Destination
		}
	}
	for _, cs := range st.Connections {
		tag := cs.Token
		if dst, ok := convertedTo[cs.Local]; ok {
			tag += " (converted to " + dst + ")"
		}
		if cs.Adopted {
			tag += " (adopted)"
		}
		note := cs.Decision
		if cs.CrossFamily != "" {
			note = strings.TrimSpace(note + " [" + cs.Socket + "; " + cs.CrossFamily + "]")
		}
		if !cs.HoldUntil.IsZero() {
			note = fmt.Sprintf("holding until %s: %s", cs.HoldUntil.Format("15:04:05.000"), note)
		}
		if len(cs.Refusals) > 0 {
			reasons := make([]string, 0, len(cs.Refusals))
			for r, n := range cs.Refusals {
				reasons = append(reasons, fmt.Sprintf("%dx %s", n, r))
			}
			sort.Strings(reasons)
			note += " refused: " + strings.Join(reasons, ", ")
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t\t\t%s\t\t\t\t\t\t\t%s\n", tag, cs.Local, cs.Remote, map[bool]string{true: "established", false: "connecting"}[cs.Established], note)
		for _, s := range cs.Subflows {
			fmt.Fprintf(w, "  \t%s\t%s\t%s\t%s\t%s\t%v\t%d\t%d\t%.1f\t%.2f\t%.1f\t%s\n", s.Local, s.Remote, s.Path, s.Role, s.State, s.Backup,
				s.BytesSent, s.BytesReceived, s.RTTms, s.RateMbps, s.LossPct, s.Decision)
		}
	}
	w.Flush()
	w = tabwriter.NewWriter(os.Stdout, 2, 4, 2, ' ', 0)
	fmt.Fprintf(w, "\nDETOUR\tLOCAL\tREMOTE\tSUBFLOWS\tESTABLISHED\tFAILED\tHEALTH\tLAST ERROR\n")
	for _, d := range st.Detours {
		health := "ok"
		switch {
		case d.Healthy:
		case !d.BackoffTill.IsZero():
			health = "backoff until " + d.BackoffTill.Format("15:04:05")
		default:
			health = "unusable"
		}
		local := d.Local
		if local == "" {
			local = "default"
		}
		fmt.Fprintf(w, "%s:%s\t%s\t%s\t%d\t%d\t%d\t%s\t%s\n", d.Kind, d.Relay, local, d.Remote, d.Subflows, d.Established, d.Failed, health, d.LastError)
	}
	w.Flush()
	printRelays(st.Relays)
	if conv != nil {
		printConversions(*conv, st.Connections)
	}
	if convErr != nil {
		fmt.Printf("conversions: %v\n", convErr)
	}
}

// conversionsOf decodes the converter router's status the agent passes on
// as JSON (nil when the agent converts nothing).
func conversionsOf(st agent.Status) (*convclient.Status, error) {
	if len(st.Conversions) == 0 {
		return nil, nil
	}
	var cs convclient.Status
	if err := json.Unmarshal(st.Conversions, &cs); err != nil {
		return nil, fmt.Errorf("the agent's conversion status does not decode: %w", err)
	}
	return &cs, nil
}

// printConversions shows the conversion Router: converters, counters, the
// destinations learned not to speak MPTCP, and the converted connections
// the agent manages now.
func printConversions(cv convclient.Status, conns []agent.ConnStatus) {
	c := cv.Counters
	var direct []string
	for why, n := range c.Direct {
		direct = append(direct, fmt.Sprintf("%s %d", why, n))
	}
	sort.Strings(direct)
	fmt.Printf("\nconversions: %d converted of %d connects; direct: %s; learned %d (%d without MPTCP); converter failures %d, policy refusals %d, destination errors %d; tickets fetched %d (%d request errors)\n",
		c.Converted, c.Routed, strings.Join(direct, ", "), c.Learned, c.LearnedNoMPTCP, c.ConverterFailed, c.PolicyRefused, c.DestinationError, c.TicketsFetched, c.TicketErrors)
	w := tabwriter.NewWriter(os.Stdout, 2, 4, 2, ' ', 0)
	fmt.Fprintf(w, "CONVERTER\tADDRESS\tTICKETS\tRTT ms\tUSED\tFAILURES\tSTATE\tLAST ERROR\n")
	for _, x := range cv.Converters {
		state := "ok"
		if !x.FailedUntil.IsZero() {
			state = "held until " + x.FailedUntil.Format("15:04:05")
		}
		fmt.Fprintf(w, "%s\t%s\t%d\t%.1f\t%d\t%d\t%s\t%s\n", x.Relay, x.Address, x.Tickets, x.RTTms, x.Used, x.Failures, state, x.LastError)
	}
	w.Flush()
	live := map[string]bool{}
	for _, cs := range conns {
		live[cs.Local] = true
	}
	w = tabwriter.NewWriter(os.Stdout, 2, 4, 2, ' ', 0)
	fmt.Fprintf(w, "\nCONVERTED CONNECTION\tCONVERTER\tDESTINATION\tSINCE\n")
	for _, x := range cv.Recent {
		if live[x.Local] {
			fmt.Fprintf(w, "%s\t%s (%s)\t%s\t%s\n", x.Local, x.Converter, x.Name, x.Destination, x.Since.Format("15:04:05"))
		}
	}
	w.Flush()
	if len(cv.NoMPTCP) > 0 {
		w = tabwriter.NewWriter(os.Stdout, 2, 4, 2, ' ', 0)
		fmt.Fprintf(w, "\nWITHOUT MPTCP (%d destinations known)\tUNTIL\tCONVERTED\tCONVERTIBLE\tLEARNED FOR\n", cv.Destinations)
		for _, d := range cv.NoMPTCP {
			who := "everyone (root)"
			if d.UID != convclient.Root {
				who = fmt.Sprintf("uid %d only", d.UID)
			}
			fmt.Fprintf(w, "%s\t%s\t%d\t%v\t%s\n", d.Destination, d.Expires.Format("15:04:05"), d.Conversions, d.Convertible, who)
		}
		w.Flush()
	}
}

// printBlackhole shows the kernel's MPTCP blackhole fallback when it
// matters: disabled now (with the fix), or the reading failed.
func printBlackhole(b *agent.BlackholeStatus) {
	switch {
	case b == nil:
	case b.Error != "":
		fmt.Printf("MPTCP blackhole detection: cannot read the kernel's counters: %s\n", b.Error)
	case b.State == agent.BlackholeDisabled:
		since := "since " + b.Since.Format("15:04:05")
		if !b.Until.IsZero() {
			since += ", at least until " + b.Until.Format("15:04:05")
		}
		fmt.Printf("WARNING: the kernel disabled MPTCP for new connections (%s; blackhole detection, %d connections made plain TCP since boot): they get no detours\n  fix: %s\n",
			since, b.Fallbacks, b.Fix)
	}
}

// printStale shows the stale_loss_cnt setting when configured.
func printStale(s *agent.StaleStatus) {
	switch {
	case s == nil:
	case s.State != "set":
		fmt.Printf("stale_loss_cnt: %s: %s (the namespace keeps its own)\n", s.State, s.Error)
	default:
		fmt.Printf("stale_loss_cnt: %d (the namespace had %s; restored at stop)\n", s.Want, s.Was)
	}
}

// printSubflowCC shows the detour subflows' congestion control when
// configured: failed (with the reason; they run the host's algorithm) or
// active with its routes and the destinations it could not serve.
func printSubflowCC(c *subflowcc.Status) {
	switch {
	case c == nil:
	case c.State != "active":
		fmt.Printf("subflow congestion control: %s: %s (detour subflows run the host's algorithm)\n", c.State, c.Error)
	default:
		fmt.Printf("subflow congestion control: detour subflows run %s, %d route(s) with congctl\n", c.Algorithm, len(c.Routes))
		for _, r := range c.Routes {
			fmt.Printf("  %s (table %d)\n", r.Dst, r.Table)
		}
		for _, r := range c.Failed {
			fmt.Printf("  %s: not applied (the host's algorithm): %s\n", r.Dst, r.Error)
		}
	}
}

// printBuffers shows buffer_sizing's state when it is on.
func printBuffers(b *agent.BufferStatus) {
	switch {
	case b == nil:
	case b.State != "on":
		fmt.Printf("buffer sizing: %s: %s (the namespace keeps its own tcp_rmem/tcp_wmem)\n", b.State, b.Error)
	case b.Max == 0:
		fmt.Printf("buffer sizing: on, tcp_rmem/tcp_wmem maxima as found (%s / %s): enough so far (%d changes)\n",
			b.Found["net.ipv4.tcp_rmem"], b.Found["net.ipv4.tcp_wmem"], b.Changes)
	default:
		fmt.Printf("buffer sizing: on, tcp_rmem/tcp_wmem maximum %d bytes (found %s / %s, restored at stop; %d changes)\n",
			b.Max, b.Found["net.ipv4.tcp_rmem"], b.Found["net.ipv4.tcp_wmem"], b.Changes)
	}
}

// printSubflowLowat shows the per-subflow unsent limit when configured:
// failed or refused (with the reason; the policy runs without it) or
// active with the limit, the subflows that have it and how often
// the program set it.
func printSubflowLowat(l *agent.LowatStatus) {
	switch {
	case l == nil:
	case l.State == "failed":
		fmt.Printf("subflow lowat: failed: %s (running without it%s)\n", l.Error, lowatDefault(l))
	case l.State == "refused":
		fmt.Printf("subflow lowat: refused: %s (running without it%s)\n", l.Refused, lowatDefault(l))
	case l.Error != "":
		// The count could not be read: no "set 0 times".
		fmt.Printf("subflow lowat: active, %s, %d subflows, settings unknown: %s%s\n", lowatLimit(l), l.Pairs, l.Error, l.Where())
	default:
		fmt.Printf("subflow lowat: active, %s, %d subflows, set %d times%s%s\n", lowatLimit(l), l.Pairs, l.Sets, lowatRewrites(l), l.Where())
	}
}

// lowatDefault says, for a limit the config does not set, that it is the
// default and how to turn it off.
func lowatDefault(l *agent.LowatStatus) string {
	if !l.Default {
		return ""
	}
	return "; the default: subflow_lowat: 0 turns it off"
}

// lowatLimit says what bounds each subflow's unsent bytes: one size, or
// (subflow_lowat_scale: rtt) the size scaled to the subflows' RTTs.
func lowatLimit(l *agent.LowatStatus) string {
	if l.Scale == "rtt" {
		return fmt.Sprintf("unsent limit scaled to the subflows' RTTs (scale rtt), %d-%d bytes per subflow", l.Bytes, l.Ceil)
	}
	return fmt.Sprintf("%d bytes unsent at most per subflow", l.Bytes)
}

// lowatRewrites is how often the scaled limit's RTT was rewritten.
func lowatRewrites(l *agent.LowatStatus) string {
	if l.Scale != "rtt" {
		return ""
	}
	return fmt.Sprintf(", connection RTT rewritten %d times", l.Rewrites)
}

// printSubflowPacing shows subflow pacing when configured: failed or
// refused (with the reason; the agent runs without it) or active with
// the address pairs that have it.
func printSubflowPacing(p *agent.PacingStatus) {
	switch {
	case p == nil:
	case p.State == "failed":
		fmt.Printf("subflow pacing: failed: %s (running without it)\n", p.Error)
	case p.State == "refused":
		fmt.Printf("subflow pacing: refused: %s (running without it)\n", p.Refused)
	default:
		fmt.Printf("subflow pacing: active, subflows pace at TCP's own rate (SO_MAX_PACING_RATE %d bytes/s), %d address pairs\n", p.MaxRate, p.Pairs)
	}
}

// printCwndClamp shows the clamps of tunnel subflows when configured:
// failed (with the reason; the policy runs without them) or active with
// the mode (and why it fell back, if it did) and each address pair's
// limits with the measurements behind them.
func printCwndClamp(c *policy.ClampStatus) {
	switch {
	case c == nil:
	case c.State != "active":
		fmt.Printf("cwnd clamps: %s: %s (running without them)\n", c.State, c.Error)
	default:
		fmt.Printf("cwnd clamps: active, mode %s, %d tunnel address pairs\n", c.Mode, len(c.Pairs))
		if c.Fallback != "" {
			fmt.Printf("  fallback: %s\n", c.Fallback)
		}
		if c.Refused != "" {
			fmt.Printf("  refused: %s\n", c.Refused)
		}
		for _, p := range c.Pairs {
			fmt.Printf("  %s -> %s (%s): ", p.Local, p.Remote, p.Path)
			var lim []string
			if p.Segments > 0 {
				lim = append(lim, fmt.Sprintf("%d segments", p.Segments))
			}
			if p.PacingRate > 0 {
				lim = append(lim, fmt.Sprintf("paced at most %.2f Mbit/s", float64(p.PacingRate)*8/1e6))
			}
			if len(lim) > 0 {
				fmt.Printf("%s (largest delivery rate %.2f Mbit/s, min RTT %s, MSS %d)", strings.Join(lim, ", "), p.MaxRate*8/1e6, p.MinRTT, p.MSS)
			} else {
				fmt.Print("none")
			}
			if p.Note != "" {
				fmt.Printf(": %s", p.Note)
			}
			fmt.Println()
		}
	}
}

// printRelays shows each relay's state as the client sees it, with what
// to check when it is not ok.
func printRelays(rs []agent.RelayStatus) {
	if len(rs) == 0 {
		return
	}
	w := tabwriter.NewWriter(os.Stdout, 2, 4, 2, ' ', 0)
	fmt.Fprintf(w, "\nRELAY\tSTATE\tSINCE\tLAST SUCCESS\tTUNNEL HANDSHAKE\tLAST ERROR\n")
	at := func(t time.Time) string {
		if t.IsZero() {
			return "never"
		}
		return t.Format("15:04:05")
	}
	for _, r := range rs {
		hs := "-"
		if r.Tunnel {
			hs = at(r.LastHandshake)
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\n", r.Name, r.State, at(r.Since), at(r.LastSuccess), hs, r.LastError)
	}
	w.Flush()
	for _, r := range rs {
		if r.State != agent.RelayOK && r.State != agent.RelayUnknown && r.Detail != "" {
			fmt.Printf("  %s: %s: %s\n", r.Name, r.State, r.Detail)
		}
	}
}

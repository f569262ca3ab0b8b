package convclient

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// DefaultSocket is where the agent serves conversion decisions to
// "mpdetour run" (agent config convert.socket).
const DefaultSocket = "/run/mpdetour/convert.sock"

// The socket speaks newline-delimited JSON, one request and one reply at a
// time per connection; a supervisor keeps one connection open.
type request struct {
	Op      string `json:"op"` // route, learn, report, status, hello
	Dst     string `json:"dst,omitempty"`
	Native  bool   `json:"native,omitempty"`
	Relay   string `json:"relay,omitempty"`
	Outcome string `json:"outcome,omitempty"`
	Local   string `json:"local,omitempty"`
	Detail  string `json:"detail,omitempty"`
}

type reply struct {
	Error     string  `json:"error,omitempty"`
	Convert   bool    `json:"convert,omitempty"`
	Converter string  `json:"converter,omitempty"`
	Relay     string  `json:"relay,omitempty"`
	Ticket    []byte  `json:"ticket,omitempty"`
	Learn     bool    `json:"learn,omitempty"`
	Why       string  `json:"why,omitempty"`
	Status    *Status `json:"status,omitempty"`
}

// maxRequest bounds one request line.
const maxRequest = 4096

// Listen opens the unix socket at path (removing a stale one; refusing a
// live one). Mode 0666: every local user can connect, and Serve then
// answers only the users its Users allow (the peer's uid from SO_PEERCRED,
// which the kernel sets at connect() and a client cannot choose).
func Listen(path string) (net.Listener, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, fmt.Errorf("convert socket: %w", err)
	}
	if c, err := net.DialTimeout("unix", path, time.Second); err == nil {
		c.Close()
		return nil, fmt.Errorf("convert socket %s: another agent is serving it", path)
	}
	_ = os.Remove(path)
	l, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("convert socket: %w", err)
	}
	if err := os.Chmod(path, 0o666); err != nil {
		l.Close()
		return nil, fmt.Errorf("convert socket: %w", err)
	}
	return l, nil
}

// Users are the local users whose programs may convert (config
// convert.users). Root always may.
type Users struct {
	// Any: every local user ("*" in the configuration).
	Any  bool
	UIDs []uint32
}

// Allows says whether uid may use the socket.
func (u Users) Allows(uid uint32) bool {
	return uid == Root || u.Any || slices.Contains(u.UIDs, uid)
}

// PeerUID returns the uid of the process that connected c (SO_PEERCRED).
func PeerUID(c net.Conn) (uint32, error) {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return 0, fmt.Errorf("peer credentials: %T is not a socket", c)
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return 0, fmt.Errorf("peer credentials: %w", err)
	}
	var cred *unix.Ucred
	var cerr error
	if err := raw.Control(func(fd uintptr) {
		cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return 0, fmt.Errorf("peer credentials: %w", err)
	}
	if cerr != nil {
		return 0, fmt.Errorf("peer credentials: %w", cerr)
	}
	return cred.Uid, nil
}

// Serve answers supervisors on l until it is closed: the users allowed
// get decisions made from their own lessons and root's (Router.Route);
// any other user gets one error reply naming the setting, and the
// connection is closed.
func (r *Router) Serve(l net.Listener, allowed Users) error {
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		c, err := l.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return nil
			}
			return err
		}
		wg.Go(func() {
			defer c.Close()
			uid, err := PeerUID(c)
			if err == nil && !allowed.Allows(uid) {
				err = fmt.Errorf("uid %d may not convert (the agent's convert.users)", uid)
			}
			if err != nil {
				// The refusal answers the first request (a reply
				// before it could meet a client still writing).
				r.refused(uid, err)
				c.SetDeadline(time.Now().Add(5 * time.Second))
				if _, rerr := bufio.NewReaderSize(c, maxRequest).ReadSlice('\n'); rerr == nil {
					_ = json.NewEncoder(c).Encode(reply{Error: err.Error()})
				}
				return
			}
			r.serveConn(c, uid)
		})
	}
}

// refused counts a connection of a user not allowed, logged once per uid
// (a bounded set: at most maxRefusedLogged uids are remembered).
func (r *Router) refused(uid uint32, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.ctr.Refused++
	if r.refusedUIDs == nil {
		r.refusedUIDs = map[uint32]bool{}
	}
	if r.refusedUIDs[uid] || len(r.refusedUIDs) >= maxRefusedLogged {
		return
	}
	r.refusedUIDs[uid] = true
	r.log.Warn("convert socket: refused a local user (logged once per user)", "err", err)
}

const maxRefusedLogged = 64

func (r *Router) serveConn(c net.Conn, uid uint32) {
	br := bufio.NewReaderSize(c, maxRequest)
	enc := json.NewEncoder(c)
	for {
		line, err := br.ReadSlice('\n')
		if err != nil {
			if !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) {
				r.log.Debug("convert socket client", "err", err)
			}
			return
		}
		var req request
		var rep reply
		if err := json.Unmarshal(line, &req); err != nil {
			rep.Error = "bad request: " + err.Error()
		} else {
			rep = r.answer(uid, req)
		}
		if err := enc.Encode(rep); err != nil {
			return
		}
	}
}

func (r *Router) answer(uid uint32, req request) reply {
	var dst netip.AddrPort
	if req.Op != "status" && req.Op != "hello" {
		var err error
		if dst, err = netip.ParseAddrPort(req.Dst); err != nil {
			return reply{Error: fmt.Sprintf("dst: %v", err)}
		}
	}
	switch req.Op {
	case "route":
		d := r.Route(uid, dst)
		rep := reply{Convert: d.Convert, Relay: d.Name, Ticket: d.Ticket, Learn: d.Learn, Why: d.Why}
		if d.Convert {
			rep.Converter = d.Converter.String()
		}
		return rep
	case "learn":
		r.Learn(uid, dst, req.Native)
	case "report":
		out := Outcome(req.Outcome)
		switch out {
		case OutcomeOK, OutcomeConverterFailed, OutcomeTicketRefused, OutcomePolicy, OutcomeDestination:
		default:
			return reply{Error: fmt.Sprintf("outcome %q unknown", req.Outcome)}
		}
		local, _ := netip.ParseAddrPort(req.Local)
		r.Report(uid, dst, req.Relay, out, local, req.Detail)
	case "hello":
		// A client checking that it may convert (refused users got the
		// error before any request).
	case "status":
		// Every user's conversions and lessons: root's only.
		if uid != Root {
			return reply{Error: "status: root only (mpdetour status)"}
		}
		st := r.Status()
		return reply{Status: &st}
	default:
		return reply{Error: fmt.Sprintf("op %q unknown", req.Op)}
	}
	return reply{}
}

// Client is a supervisor's connection to the agent's Router. It reconnects
// on demand; when the agent is not there, every answer is "direct" (the
// application is never held up by a missing agent). Safe for concurrent
// use (requests are serialised).
type Client struct {
	path    string
	timeout time.Duration

	mu      sync.Mutex
	c       net.Conn
	br      *bufio.Reader
	retryAt time.Time
	lastErr error
}

// NewClient returns a client of the socket at path; timeout bounds one
// exchange (default 250 ms: a connect() waits for it).
func NewClient(path string, timeout time.Duration) *Client {
	if timeout <= 0 {
		timeout = 250 * time.Millisecond
	}
	return &Client{path: path, timeout: timeout}
}

// Close closes the connection.
func (c *Client) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.c != nil {
		err := c.c.Close()
		c.c = nil
		return err
	}
	return nil
}

func (c *Client) do(req request) (reply, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.c == nil {
		if time.Now().Before(c.retryAt) {
			return reply{}, fmt.Errorf("convert socket %s: %w (retrying later)", c.path, c.lastErr)
		}
		conn, err := net.DialTimeout("unix", c.path, c.timeout)
		if err != nil {
			c.retryAt, c.lastErr = time.Now().Add(time.Second), err
			return reply{}, fmt.Errorf("convert socket %s: %w", c.path, err)
		}
		c.c, c.br = conn, bufio.NewReaderSize(conn, 64<<10)
	}
	fail := func(err error) (reply, error) {
		c.c.Close()
		c.c = nil
		c.retryAt, c.lastErr = time.Now().Add(time.Second), err
		return reply{}, fmt.Errorf("convert socket %s: %w", c.path, err)
	}
	b, err := json.Marshal(req)
	if err != nil {
		return reply{}, err
	}
	c.c.SetDeadline(time.Now().Add(c.timeout))
	if _, err := c.c.Write(append(b, '\n')); err != nil {
		return fail(err)
	}
	line, err := c.br.ReadBytes('\n')
	if err != nil {
		return fail(err)
	}
	var rep reply
	if err := json.Unmarshal(line, &rep); err != nil {
		return fail(err)
	}
	if rep.Error != "" {
		return rep, errors.New("convert socket: " + rep.Error)
	}
	return rep, nil
}

// Route asks how to connect to dst; on any error the answer is direct
// without learning.
func (c *Client) Route(dst netip.AddrPort) (Decision, error) {
	rep, err := c.do(request{Op: "route", Dst: dst.String()})
	if err != nil {
		return Decision{Why: "no-agent"}, err
	}
	d := Decision{Convert: rep.Convert, Name: rep.Relay, Ticket: rep.Ticket, Learn: rep.Learn, Why: rep.Why}
	if d.Convert {
		if d.Converter, err = netip.ParseAddrPort(rep.Converter); err != nil || len(d.Ticket) == 0 {
			return Decision{Why: "no-agent"}, fmt.Errorf("convert socket: bad route reply %+v", rep)
		}
	}
	return d, nil
}

// Learn reports whether dst spoke MPTCP.
func (c *Client) Learn(dst netip.AddrPort, native bool) error {
	_, err := c.do(request{Op: "learn", Dst: dst.String(), Native: native})
	return err
}

// Report reports a conversion's outcome.
func (c *Client) Report(dst netip.AddrPort, relay string, out Outcome, local netip.AddrPort, detail string) error {
	req := request{Op: "report", Dst: dst.String(), Relay: relay, Outcome: string(out), Detail: detail}
	if local.IsValid() {
		req.Local = local.String()
	}
	_, err := c.do(req)
	return err
}

// Hello checks that the agent at the socket answers this user (a user not
// in convert.users gets the agent's refusal as the error).
func (c *Client) Hello() error {
	_, err := c.do(request{Op: "hello"})
	return err
}

// FetchStatus asks the Router at path for its status.
func FetchStatus(path string) (Status, error) {
	c := NewClient(path, 5*time.Second)
	defer c.Close()
	rep, err := c.do(request{Op: "status"})
	if err != nil {
		return Status{}, err
	}
	if rep.Status == nil {
		return Status{}, errors.New("convert socket: no status in the reply")
	}
	return *rep.Status, nil
}

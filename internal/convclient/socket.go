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
	"sync"
	"time"
)

// DefaultSocket is where the agent serves conversion decisions to
// "mpdetour run" (agent config convert.socket).
const DefaultSocket = "/run/mpdetour/convert.sock"

// The socket speaks newline-delimited JSON, one request and one reply at a
// time per connection; a supervisor keeps one connection open.
type request struct {
	Op      string `json:"op"` // route, learn, report, status
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
// live one). Mode 0666: any local user's programs under "mpdetour run" may
// convert, as the agent adds detours to every user's connections.
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

// Serve answers supervisors on l until it is closed.
func (r *Router) Serve(l net.Listener) error {
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
			r.serveConn(c)
		})
	}
}

func (r *Router) serveConn(c net.Conn) {
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
			rep = r.answer(req)
		}
		if err := enc.Encode(rep); err != nil {
			return
		}
	}
}

func (r *Router) answer(req request) reply {
	var dst netip.AddrPort
	if req.Op != "status" {
		var err error
		if dst, err = netip.ParseAddrPort(req.Dst); err != nil {
			return reply{Error: fmt.Sprintf("dst: %v", err)}
		}
	}
	switch req.Op {
	case "route":
		d := r.Route(dst)
		rep := reply{Convert: d.Convert, Relay: d.Name, Ticket: d.Ticket, Learn: d.Learn, Why: d.Why}
		if d.Convert {
			rep.Converter = d.Converter.String()
		}
		return rep
	case "learn":
		r.Learn(dst, req.Native)
	case "report":
		out := Outcome(req.Outcome)
		switch out {
		case OutcomeOK, OutcomeConverterFailed, OutcomeTicketRefused, OutcomePolicy, OutcomeDestination:
		default:
			return reply{Error: fmt.Sprintf("outcome %q unknown", req.Outcome)}
		}
		local, _ := netip.ParseAddrPort(req.Local)
		r.Report(dst, req.Relay, out, local, req.Detail)
	case "status":
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

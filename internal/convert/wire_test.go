package convert

import (
	"bytes"
	"errors"
	"io"
	"net/netip"
	"reflect"
	"strings"
	"testing"
)

var ticket16 = []byte("0123456789abcdef")

func mustMarshal(t testing.TB, m *Message) []byte {
	t.Helper()
	b, err := m.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestRoundTrip(t *testing.T) {
	tcpHdr := make([]byte, 24)
	tcpHdr[12] = 6 << 4                         // data offset 6 words
	copy(tcpHdr[20:], []byte{2, 4, 0x05, 0xb4}) // MSS 1460
	cases := map[string]*Message{
		"empty":           {},
		"info":            {Info: true},
		"connect4":        {Connect: &Connect{Dst: netip.MustParseAddrPort("192.0.2.7:443")}, Ticket: ticket16},
		"connect6":        {Connect: &Connect{Dst: netip.MustParseAddrPort("[2001:db8::1]:80"), TCPOptions: []byte{1, 1, 2, 4, 5, 0xb4, 0, 0}}},
		"ticket64":        {Ticket: bytes.Repeat([]byte{0xab}, 64)},
		"ticket17":        {Ticket: bytes.Repeat([]byte{0xcd}, 17)},
		"ext":             {ExtendedTCPHeader: tcpHdr},
		"supported":       {SupportedTCPExtensions: []byte{30}},
		"supported-empty": {SupportedTCPExtensions: []byte{}},
		"cookie":          {Cookie: []byte{1, 2, 3, 4, 5, 6, 7, 8}},
		"error":           {Error: &ErrorTLV{Code: CodeDestinationUnreachable, Value: []byte{2}}},
		"error-long":      {Error: &ErrorTLV{Code: CodeUnsupportedMessage, Value: []byte{9, 8, 7, 6, 5}}},
		"all": {Info: true, Connect: &Connect{Dst: netip.MustParseAddrPort("198.51.100.1:8080")}, ExtendedTCPHeader: tcpHdr,
			SupportedTCPExtensions: []byte{30, 2, 3}, Cookie: []byte{9, 9, 9, 9}, Error: &ErrorTLV{Code: CodeNotAuthorized, Value: []byte{1}}, Ticket: ticket16},
	}
	for name, m := range cases {
		t.Run(name, func(t *testing.T) {
			b := mustMarshal(t, m)
			if len(b)%4 != 0 || int(b[1])*4 != len(b) || b[0] != Version || b[2] != 0x22 || b[3] != 0x63 {
				t.Fatalf("bad framing: % x", b)
			}
			got, err := Parse(b)
			if err != nil {
				t.Fatalf("parse % x: %v", b, err)
			}
			want := *m
			// Parsing keeps padding: the Error value is padded to 32 bits.
			if want.Error != nil {
				v := append([]byte{}, want.Error.Value...)
				for (3+len(v))%4 != 0 {
					v = append(v, 0)
				}
				want.Error = &ErrorTLV{Code: want.Error.Code, Value: v}
			}
			if want.Connect != nil && want.Connect.TCPOptions == nil {
				want.Connect = &Connect{Dst: want.Connect.Dst, TCPOptions: []byte{}}
			}
			if !reflect.DeepEqual(got, &want) {
				t.Fatalf("round trip:\n got %+v\nwant %+v", got, &want)
			}
			// Reading from a stream takes exactly the message.
			r := bytes.NewReader(append(append([]byte{}, b...), "payload"...))
			if _, err := ReadMessage(r); err != nil {
				t.Fatal(err)
			}
			if rest, _ := io.ReadAll(r); string(rest) != "payload" {
				t.Fatalf("ReadMessage consumed payload: left %q", rest)
			}
		})
	}
}

// TestConnectEncoding checks the Connect TLV byte for byte: IPv4 travels
// as an IPv4-mapped IPv6 address.
func TestConnectEncoding(t *testing.T) {
	b := mustMarshal(t, &Message{Connect: &Connect{Dst: netip.MustParseAddrPort("192.0.2.7:443")}})
	want := []byte{
		1, 6, 0x22, 0x63, // version 1, 6 words, magic
		10, 5, 0x01, 0xbb, // Connect, 5 words, port 443
		0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 192, 0, 2, 7,
	}
	if !bytes.Equal(b, want) {
		t.Fatalf("got  % x\nwant % x", b, want)
	}
	b = mustMarshal(t, &Message{Ticket: ticket16})
	want = append([]byte{1, 6, 0x22, 0x63, 192, 5, 0, 16}, ticket16...)
	if !bytes.Equal(b, want) {
		t.Fatalf("ticket: got  % x\nwant % x", b, want)
	}
	b = mustMarshal(t, &Message{Error: &ErrorTLV{Code: CodeConnectionReset}})
	if want := []byte{1, 2, 0x22, 0x63, 30, 1, 96, 0}; !bytes.Equal(b, want) {
		t.Fatalf("error: got  % x\nwant % x", b, want)
	}
}

func TestParseErrors(t *testing.T) {
	valid := mustMarshal(t, &Message{Connect: &Connect{Dst: netip.MustParseAddrPort("192.0.2.7:443")}, Ticket: ticket16})
	mod := func(f func(b []byte) []byte) []byte { return f(append([]byte{}, valid...)) }
	cases := []struct {
		name string
		in   []byte
		code ErrorCode
		msg  string
	}{
		{"nil", nil, CodeMalformedMessage, "fixed header truncated"},
		{"short header", []byte{1, 1, 0x22}, CodeMalformedMessage, "fixed header truncated"},
		{"version 0", []byte{0, 1, 0x22, 0x63}, CodeUnsupportedVersion, "version 0"},
		{"version 2", []byte{2, 1, 0x22, 0x63}, CodeUnsupportedVersion, "version 2"},
		{"total 0", []byte{1, 0, 0x22, 0x63}, CodeMalformedMessage, "total length 0"},
		{"bad magic", []byte{1, 1, 0, 0}, CodeMalformedMessage, "magic number 0x0000"},
		{"truncated", valid[:len(valid)-4], CodeMalformedMessage, "message truncated"},
		{"trailing", append(append([]byte{}, valid...), 0, 0, 0, 0), CodeMalformedMessage, "bytes after"},
		{"tlv length 0", []byte{1, 2, 0x22, 0x63, 1, 0, 0, 0}, CodeMalformedMessage, "Info TLV: length 0 words"},
		{"tlv past end", []byte{1, 2, 0x22, 0x63, 1, 2, 0, 0}, CodeMalformedMessage, "runs past the message end"},
		{"info too long", []byte{1, 3, 0x22, 0x63, 1, 2, 0, 0, 0, 0, 0, 0}, CodeMalformedMessage, "Info TLV: length 8"},
		{"connect short", []byte{1, 2, 0x22, 0x63, 10, 1, 0, 80}, CodeMalformedMessage, "Connect TLV: length 4 bytes"},
		{"duplicate", []byte{1, 3, 0x22, 0x63, 1, 1, 0, 0, 1, 1, 0, 0}, CodeMalformedMessage, "Info TLV appears twice"},
		{"unknown type", []byte{1, 2, 0x22, 0x63, 99, 1, 0, 0}, CodeUnsupportedMessage, "unknown TLV type 99"},
		{"private type", []byte{1, 2, 0x22, 0x63, 200, 1, 0, 0}, CodeUnsupportedMessage, "unknown TLV type 200"},
		{"ticket short", mod(func(b []byte) []byte { b[len(b)-16-1] = 15; return b }), CodeMalformedMessage, "ticket of 15 bytes"},
		{"ticket long", mod(func(b []byte) []byte { b[len(b)-16-1] = 65; return b }), CodeMalformedMessage, "ticket of 65 bytes"},
		{"ticket length mismatch", mod(func(b []byte) []byte { b[len(b)-16-1] = 20; return b }), CodeMalformedMessage, "a 20-byte ticket needs 24"},
		{"ticket reserved", mod(func(b []byte) []byte { b[len(b)-16-2] = 1; return b }), CodeMalformedMessage, "reserved byte"},
		{"ticket padding", func() []byte {
			b := mustMarshal(t, &Message{Ticket: append(append([]byte{}, ticket16...), 7)}) // 17 bytes: 3 of padding
			b[len(b)-1] = 7
			return b
		}(), CodeMalformedMessage, "padding byte is 7"},
		{"connect bad option", func() []byte {
			b := mustMarshal(t, &Message{Connect: &Connect{Dst: netip.MustParseAddrPort("192.0.2.7:443"), TCPOptions: []byte{2, 4, 5, 0xb4}}})
			b[len(b)-3] = 9 // MSS length 9 overruns
			return b
		}(), CodeMalformedMessage, "length 9 does not fit"},
		{"connect garbage after EOL", func() []byte {
			b := mustMarshal(t, &Message{Connect: &Connect{Dst: netip.MustParseAddrPort("192.0.2.7:443"), TCPOptions: []byte{0, 0, 0, 0}}})
			b[len(b)-1] = 1
			return b
		}(), CodeMalformedMessage, "after End of Option List"},
		{"ext header short", []byte{1, 3, 0x22, 0x63, 20, 2, 0, 0, 0, 0, 0, 0}, CodeMalformedMessage, "need at least 20"},
		{"supported zero inside", []byte{1, 3, 0x22, 0x63, 21, 2, 0, 0, 30, 0, 2, 0}, CodeMalformedMessage, "kind 0 (padding) before"},
		{"supported long padding", []byte{1, 3, 0x22, 0x63, 21, 2, 0, 0, 0, 0, 0, 0}, CodeMalformedMessage, "4 padding bytes"},
		{"cookie empty", []byte{1, 2, 0x22, 0x63, 22, 1, 0, 0}, CodeMalformedMessage, "Cookie TLV: no opaque value"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			m, err := Parse(c.in)
			var pe *ParseError
			if !errors.As(err, &pe) {
				t.Fatalf("Parse(% x) = %+v, %v; want a *ParseError", c.in, m, err)
			}
			if pe.Code != c.code || !strings.Contains(pe.Error(), c.msg) {
				t.Fatalf("Parse(% x): %v (code %d); want code %d and %q", c.in, err, pe.Code, c.code, c.msg)
			}
		})
	}
}

func TestReadMessageEOF(t *testing.T) {
	if _, err := ReadMessage(bytes.NewReader(nil)); err != io.EOF {
		t.Fatalf("empty stream: %v, want io.EOF", err)
	}
	b := mustMarshal(t, &Message{Ticket: ticket16})
	if _, err := ReadMessage(bytes.NewReader(b[:2])); err != io.ErrUnexpectedEOF {
		t.Fatalf("cut header: %v, want io.ErrUnexpectedEOF", err)
	}
	if _, err := ReadMessage(bytes.NewReader(b[:10])); err != io.ErrUnexpectedEOF {
		t.Fatalf("cut body: %v, want io.ErrUnexpectedEOF", err)
	}
}

func TestMarshalErrors(t *testing.T) {
	for name, m := range map[string]*Message{
		"short ticket":   {Ticket: make([]byte, 15)},
		"long ticket":    {Ticket: make([]byte, 65)},
		"no dst":         {Connect: &Connect{}},
		"bad options":    {Connect: &Connect{Dst: netip.MustParseAddrPort("192.0.2.1:1"), TCPOptions: []byte{2, 9}}},
		"cookie 3":       {Cookie: []byte{1, 2, 3}},
		"kind 0":         {SupportedTCPExtensions: []byte{30, 0}},
		"bad ext header": {ExtendedTCPHeader: make([]byte, 20)},
		"too long":       {Cookie: make([]byte, 1100)},
	} {
		if b, err := m.Marshal(); err == nil {
			t.Errorf("%s: marshalled to % x, want an error", name, b)
		}
	}
}

func TestTCPOptionKinds(t *testing.T) {
	got := TCPOptionKinds([]byte{1, 1, 2, 4, 5, 0xb4, 30, 4, 0, 0, 0, 0})
	if !bytes.Equal(got, []byte{2, 30}) {
		t.Fatalf("got %v", got)
	}
}

// FuzzParse: Parse never panics, errors are *ParseError, and whatever it
// accepts encodes back to a message that parses to the same value.
func FuzzParse(f *testing.F) {
	for _, m := range []*Message{
		{Info: true},
		{Connect: &Connect{Dst: netip.MustParseAddrPort("192.0.2.7:443")}, Ticket: ticket16},
		{Connect: &Connect{Dst: netip.MustParseAddrPort("[2001:db8::1]:80"), TCPOptions: []byte{1, 1, 2, 4, 5, 0xb4, 0, 0}}},
		{Error: &ErrorTLV{Code: CodeConnectionReset}},
		{SupportedTCPExtensions: []byte{30}},
		{Cookie: []byte{1, 2, 3, 4}},
	} {
		b, err := m.Marshal()
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte{1, 2, 0x22, 0x63, 99, 1, 0, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := Parse(b)
		if err != nil {
			var pe *ParseError
			if !errors.As(err, &pe) {
				t.Fatalf("error %v is %T, not *ParseError", err, err)
			}
			return
		}
		out, err := m.Marshal()
		if err != nil {
			t.Fatalf("accepted % x but cannot encode %+v: %v", b, m, err)
		}
		m2, err := Parse(out)
		if err != nil {
			t.Fatalf("re-encoded % x does not parse: %v", out, err)
		}
		if !reflect.DeepEqual(m, m2) {
			t.Fatalf("round trip changed the message:\n%+v\n%+v", m, m2)
		}
		if _, err := ReadMessage(bytes.NewReader(b)); err != nil {
			t.Fatalf("Parse accepted % x, ReadMessage did not: %v", b, err)
		}
	})
}

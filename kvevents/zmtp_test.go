package kvevents

import (
	"bytes"
	"errors"
	"io"
	"strings"
	"testing"
)

// rw is a connection whose reads come from r and whose writes are kept.
type rw struct {
	io.Reader
	out bytes.Buffer
}

func (c *rw) Write(p []byte) (int, error) { return c.out.Write(p) }

// pubHandshake is what a libzmq PUB sends: greeting (ZMTP 3.1) and READY.
func pubHandshake() []byte {
	g := greeting()
	g[11] = 1
	var body []byte
	body = append(body, 11)
	body = append(body, "Socket-Type"...)
	body = append(body, 0, 0, 0, 3)
	body = append(body, "PUB"...)
	return append(g, command("READY", body)...)
}

func frame(more bool, b []byte) []byte {
	var f byte
	if more {
		f = flagMore
	}
	if len(b) > 255 {
		out := []byte{f | flagLong, 0, 0, 0, 0, 0, 0, byte(len(b) >> 8), byte(len(b))}
		return append(out, b...)
	}
	return append([]byte{f, byte(len(b))}, b...)
}

func TestZMTPReader(t *testing.T) {
	long := bytes.Repeat([]byte{7}, 300)
	tests := []struct {
		name   string
		wire   []byte
		frames [][]byte // nil: want an error
		err    error
	}{
		{"three frames", concat(frame(true, []byte("kv@t")), frame(true, []byte{0, 0, 0, 0, 0, 0, 0, 1}), frame(false, long)),
			[][]byte{[]byte("kv@t"), {0, 0, 0, 0, 0, 0, 0, 1}, long}, nil},
		{"ping answered, then message", concat(command("PING", []byte{0, 10, 'c'}), frame(false, []byte("x"))),
			[][]byte{[]byte("x")}, nil},
		{"too large", concat(frame(true, []byte("a")), frame(false, bytes.Repeat([]byte{1}, 2000)), frame(false, []byte("next"))),
			nil, errTooLarge},
		{"reserved flags", []byte{0x80, 1, 0}, nil, errZMTP},
		// Not worth reading past (nor ever allocated): the connection is broken.
		{"huge announced frame", []byte{flagLong, 0x40, 0, 0, 0, 0, 0, 0, 0, 1, 2, 3}, nil, errZMTP},
		{"2^40 bytes announced", []byte{flagLong, 0, 0, 1, 0, 0, 0, 0, 0, 1, 2, 3}, nil, errZMTP},
		// Over the bound but plausible: read past until the bytes run out.
		{"large announced frame", []byte{flagLong, 0, 0, 0, 0, 0x01, 0, 0, 0, 1, 2, 3}, nil, io.EOF},
		{"command inside message", concat(frame(true, []byte("a")), command("PING", []byte{0, 1})), nil, errZMTP},
		{"truncated", []byte{0, 5, 'a'}, nil, io.ErrUnexpectedEOF},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := &rw{Reader: bytes.NewReader(append(pubHandshake(), tc.wire...))}
			z := newZMTPReader(c, 1024)
			if err := z.handshake([]byte("kv@")); err != nil {
				t.Fatal(err)
			}
			if !bytes.HasSuffix(c.out.Bytes(), subscribeMessage([]byte("kv@"))) {
				t.Errorf("no subscription sent: %q", c.out.Bytes())
			}
			got, err := z.readMessage()
			if tc.frames == nil {
				if !errors.Is(err, tc.err) {
					t.Fatalf("err = %v, want %v", err, tc.err)
				}
				if tc.err == errTooLarge {
					// The connection goes on with the next message.
					if next, err := z.readMessage(); err == nil && string(next[0]) != "next" {
						t.Errorf("after a large message: %q", next)
					}
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != len(tc.frames) {
				t.Fatalf("%d frames, want %d", len(got), len(tc.frames))
			}
			for i := range got {
				if !bytes.Equal(got[i], tc.frames[i]) {
					t.Errorf("frame %d = %q", i, got[i])
				}
			}
			if tc.name == "ping answered, then message" && !strings.Contains(c.out.String(), "\x04PONGc") {
				t.Errorf("no PONG: %q", c.out.String())
			}
		})
	}
}

func TestZMTPHandshakeRefusals(t *testing.T) {
	push := pubHandshake()
	i := bytes.Index(push, []byte("PUB"))
	copy(push[i:], "PSH")
	curve := pubHandshake()
	copy(curve[12:], "CURVE")
	tests := []struct {
		name, want string
		wire       []byte
	}{
		{"not zmtp", "not a ZMTP peer", append([]byte("GET / HTTP/1.1\r\n"), make([]byte, 64)...)},
		{"zmtp 2", "ZMTP 1.x", func() []byte { g := greeting(); g[10] = 1; return g }()},
		{"curve", "mechanism", curve},
		{"not a pub", "want PUB", push},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			z := newZMTPReader(&rw{Reader: bytes.NewReader(tc.wire)}, 1024)
			err := z.handshake([]byte("kv@"))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want %q", err, tc.want)
			}
		})
	}
}

// TestZMTPGreetDealer: the replay client greets as a DEALER and accepts only a ROUTER;
// its request is one two-frame message.
func TestZMTPGreetDealer(t *testing.T) {
	peer := func(socketType string) []byte {
		g := greeting()
		return append(g, readyCommand(socketType)...)
	}
	for _, tc := range []struct{ peer, err string }{{"ROUTER", ""}, {"PUB", "want ROUTER"}} {
		t.Run(tc.peer, func(t *testing.T) {
			c := &rw{Reader: bytes.NewReader(peer(tc.peer))}
			err := newZMTPReader(c, 1024).greet("DEALER", "ROUTER")
			if tc.err == "" && err != nil || tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)) {
				t.Fatalf("err = %v, want %q", err, tc.err)
			}
			if want := concat(greeting(), readyCommand("DEALER")); !bytes.Equal(c.out.Bytes(), want) {
				t.Errorf("sent %q, want %q", c.out.Bytes(), want)
			}
		})
	}
	req := appendMessage(nil, nil, []byte{0, 0, 0, 0, 0, 0, 0, 9})
	if want := []byte{flagMore, 0, 0, 8, 0, 0, 0, 0, 0, 0, 0, 9}; !bytes.Equal(req, want) {
		t.Errorf("request %v, want %v", req, want)
	}
}

func concat(bs ...[]byte) []byte { return bytes.Join(bs, nil) }

// FuzzZMTPReader: whatever follows a valid handshake, reading never panics, never
// returns more than the bound, and ends in an error once the bytes run out.
func FuzzZMTPReader(f *testing.F) {
	f.Add(concat(frame(true, []byte("kv@t")), frame(false, []byte("p"))))
	f.Add([]byte{flagLong, 0x7f, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff})
	f.Add(command("PING", []byte{0, 1, 2}))
	f.Add([]byte{flagCommand | flagLong, 0, 0, 0, 0, 0, 0, 1, 0})
	f.Fuzz(func(t *testing.T, wire []byte) {
		z := newZMTPReader(&rw{Reader: bytes.NewReader(append(pubHandshake(), wire...))}, 256)
		if err := z.handshake([]byte("kv@")); err != nil {
			t.Fatal(err)
		}
		for range len(wire) + 1 {
			frames, err := z.readMessage()
			if err != nil {
				if errors.Is(err, errTooLarge) && !errors.Is(err, errZMTP) {
					continue // read past: the connection goes on
				}
				return
			}
			n := 0
			for _, fr := range frames {
				n += len(fr)
			}
			if n > 256 || len(frames) == 0 {
				t.Fatalf("%d frames of %d bytes", len(frames), n)
			}
		}
		t.Fatal("reader did not stop at the end of its input")
	})
}

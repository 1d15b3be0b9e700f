package kvevents

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"slices"
	"sync/atomic"
)

// The client end of one ZMTP 3.0 connection (NULL security), used for every ZeroMQ
// socket kvevents speaks: the SUB that dials a pod's PUB (per-pod mode), the SUB side of
// a connection a PUB made to central mode's bound socket, and the DEALER that asks a pod's
// replay ROUTER for missed batches. It is written here rather than taken from
// go-zeromq/zmq4 because zmq4 allocates a frame of whatever size the peer announces (a
// 10-byte header claiming 2^40 bytes kills the process with an unrecoverable
// out-of-memory), runs its reads in goroutines whose panics nobody can recover, reports a
// dialled socket as connected after the peer is gone (auto-reconnect), and its listening
// socket handshakes in its accept loop with no deadline and cannot say which peer sent a
// message. Here the caller owns the connection and its goroutine, deadlines bound the
// handshake, messages have a size bound, allocation follows the bytes actually received,
// and a frame announcing an absurd size ends the connection.

const (
	zmtpGreetingLen = 64
	flagMore        = 0x01
	flagLong        = 0x02
	flagCommand     = 0x04
)

// errZMTP marks a peer that broke the protocol (as opposed to a closed connection).
var errZMTP = errors.New("kvevents: zmtp")

// errTooLarge is returned (wrapped) by readMessage for a message over the bound: its
// bytes were discarded and the connection is still usable, unless the error also wraps
// errZMTP (a message announcing more than zmtpMaxDiscard bytes, not worth reading past).
var errTooLarge = errors.New("kvevents: message over max_message_bytes")

// zmtpMaxDiscard: a message over the bound is read past (the connection goes on) only up
// to this many announced bytes, or the bound if larger; a longer announcement is treated
// as a broken peer. vLLM's largest batches are tens of MB.
const zmtpMaxDiscard = 1 << 30

type zmtpReader struct {
	r   *bufio.Reader
	w   io.Writer
	max int
	// ponged is set once the peer answered a PING: it keeps its connection alive, so
	// its silence means the connection is dead. Read from other goroutines.
	ponged atomic.Bool
	// peerMinor is the ZMTP 3.x minor version the peer's greeting announced.
	peerMinor byte
	// frames and the backing buffer are reused by the next readMessage.
	frames [][]byte
	ends   []int
	buf    []byte
}

func newZMTPReader(rw io.ReadWriter, maxMessage int) *zmtpReader {
	return &zmtpReader{r: bufio.NewReaderSize(rw, 64<<10), w: rw, max: maxMessage}
}

// greeting is ZMTP 3.0's: signature, version 3.0, mechanism NULL, as-server 0 (NULL has
// no roles).
func greeting() []byte {
	g := make([]byte, zmtpGreetingLen)
	g[0], g[9] = 0xff, 0x7f
	g[10], g[11] = 3, 0
	copy(g[12:32], "NULL")
	return g
}

// command encodes a ZMTP command frame.
func command(name string, body []byte) []byte {
	n := 1 + len(name) + len(body)
	var out []byte
	if n > 255 {
		out = binary.BigEndian.AppendUint64([]byte{flagCommand | flagLong}, uint64(n))
	} else {
		out = []byte{flagCommand, byte(n)}
	}
	out = append(out, byte(len(name)))
	out = append(out, name...)
	return append(out, body...)
}

// readyCommand is READY with Socket-Type=socketType.
func readyCommand(socketType string) []byte {
	var body []byte
	body = append(body, byte(len("Socket-Type")))
	body = append(body, "Socket-Type"...)
	body = binary.BigEndian.AppendUint32(body, uint32(len(socketType)))
	body = append(body, socketType...)
	return command("READY", body)
}

// pingCommand is a PING with TTL 0 (the peer keeps no timer of its own: a busy
// publisher would otherwise drop a subscriber that sends nothing) and no context.
func pingCommand() []byte { return command("PING", []byte{0, 0}) }

// appendMessage encodes frames as one message (MORE on all but the last).
func appendMessage(dst []byte, frames ...[]byte) []byte {
	for i, f := range frames {
		var flags byte
		if i < len(frames)-1 {
			flags = flagMore
		}
		if len(f) > 255 {
			dst = binary.BigEndian.AppendUint64(append(dst, flags|flagLong), uint64(len(f)))
		} else {
			dst = append(dst, flags, byte(len(f)))
		}
		dst = append(dst, f...)
	}
	return dst
}

// subscribeMessage is a ZMTP 3.0 subscription: one frame, 0x01 then the prefix (libzmq
// accepts this form from every peer; the SUBSCRIBE command is 3.1 only).
func subscribeMessage(prefix []byte) []byte {
	body := append([]byte{1}, prefix...)
	if len(body) > 255 {
		return append(binary.BigEndian.AppendUint64([]byte{flagLong}, uint64(len(body))), body...)
	}
	return append([]byte{0, byte(len(body))}, body...)
}

// handshake is a SUB's handshake with a PUB or XPUB peer, then the subscription. The
// caller bounds it with a deadline.
func (z *zmtpReader) handshake(prefix []byte) error {
	if err := z.greet("SUB", "PUB", "XPUB"); err != nil {
		return err
	}
	_, err := z.w.Write(subscribeMessage(prefix))
	return err
}

// greet exchanges greetings and READY commands as a socketType socket with a peer whose
// Socket-Type is one of peers. The caller bounds it with a deadline.
func (z *zmtpReader) greet(socketType string, peers ...string) error {
	out := greeting()
	out = append(out, readyCommand(socketType)...)
	if _, err := z.w.Write(out); err != nil {
		return err
	}
	var g [zmtpGreetingLen]byte
	if _, err := io.ReadFull(z.r, g[:]); err != nil {
		return err
	}
	if g[0] != 0xff || g[9]&1 != 1 {
		return fmt.Errorf("%w: not a ZMTP peer", errZMTP)
	}
	if g[10] < 3 {
		return fmt.Errorf("%w: peer speaks ZMTP %d.x, want 3", errZMTP, g[10])
	}
	if mech := string(bytes.TrimRight(g[12:32], "\x00")); mech != "NULL" {
		return fmt.Errorf("%w: security mechanism %q, want NULL", errZMTP, mech)
	}
	if g[10] == 3 {
		z.peerMinor = g[11]
	} else {
		z.peerMinor = 0xff // a later major version: assume it knows PING
	}
	name, body, err := z.readCommand()
	if err != nil {
		return err
	}
	switch name {
	case "READY":
	case "ERROR":
		return fmt.Errorf("%w: peer refused: %q", errZMTP, body)
	default:
		return fmt.Errorf("%w: got %q before READY", errZMTP, name)
	}
	props, err := parseProperties(body)
	if err != nil {
		return err
	}
	if st := props["socket-type"]; !slices.Contains(peers, st) {
		return fmt.Errorf("%w: peer is a %q socket, want %s", errZMTP, st, peers[0])
	}
	return nil
}

// heartbeats reports whether the peer speaks ZMTP 3.1 or later, which defines PING and
// PONG (libzmq 4.2+ does, and answers every PING). A 3.0 peer may not expect commands
// after the handshake: go-zeromq/zmq4's PUB (3.0) queues each PING as an inbound
// message in a 10-slot channel nobody reads, and then stops reading every subscriber's
// connection, so 3.0 peers are never pinged.
func (z *zmtpReader) heartbeats() bool { return z.peerMinor >= 1 }

// waitMessage blocks until the next message's first byte has arrived, consuming
// nothing: a deadline that expires here leaves the connection usable.
func (z *zmtpReader) waitMessage() error {
	_, err := z.r.Peek(1)
	return err
}

// parseProperties reads READY's metadata: name-length, name, 4-byte value-length, value.
// Names are case-insensitive (lowered here).
func parseProperties(b []byte) (map[string]string, error) {
	props := map[string]string{}
	for len(b) > 0 {
		n := int(b[0])
		if n == 0 || len(b) < 1+n+4 {
			return nil, fmt.Errorf("%w: bad READY metadata", errZMTP)
		}
		name := string(bytes.ToLower(b[1 : 1+n]))
		v := binary.BigEndian.Uint32(b[1+n:])
		b = b[1+n+4:]
		if uint64(v) > uint64(len(b)) {
			return nil, fmt.Errorf("%w: bad READY metadata", errZMTP)
		}
		props[name] = string(b[:v])
		b = b[v:]
	}
	return props, nil
}

// frameHeader reads one frame's flags and size.
func (z *zmtpReader) frameHeader() (flags byte, size uint64, err error) {
	var h [9]byte
	if _, err := io.ReadFull(z.r, h[:2]); err != nil {
		return 0, 0, err
	}
	flags = h[0]
	if flags&^(flagMore|flagLong|flagCommand) != 0 {
		return 0, 0, fmt.Errorf("%w: reserved frame flags %#x", errZMTP, flags)
	}
	if flags&flagLong == 0 {
		return flags, uint64(h[1]), nil
	}
	if _, err := io.ReadFull(z.r, h[2:9]); err != nil {
		return 0, 0, err
	}
	return flags, binary.BigEndian.Uint64(h[1:9]), nil
}

// readCommand reads one command frame (bounded like a message) and splits its name.
func (z *zmtpReader) readCommand() (string, []byte, error) {
	flags, size, err := z.frameHeader()
	if err != nil {
		return "", nil, err
	}
	if flags&flagCommand == 0 || flags&flagMore != 0 {
		return "", nil, fmt.Errorf("%w: want a command frame", errZMTP)
	}
	body, err := z.readBody(nil, size)
	if err != nil {
		return "", nil, err
	}
	if len(body) == 0 || int(body[0]) > len(body)-1 {
		return "", nil, fmt.Errorf("%w: bad command frame", errZMTP)
	}
	return string(body[1 : 1+body[0]]), body[1+body[0]:], nil
}

// readBody appends size bytes to dst, growing it as the bytes arrive (never by the
// announced size alone); size must already be within the bound.
func (z *zmtpReader) readBody(dst []byte, size uint64) ([]byte, error) {
	if size > uint64(z.max) {
		return dst, fmt.Errorf("%w: frame of %d bytes", errTooLarge, size)
	}
	want := len(dst) + int(size)
	for len(dst) < want {
		if len(dst) == cap(dst) {
			dst = slices.Grow(dst, min(max(cap(dst), 4096), want-len(dst)))
		}
		n, err := z.r.Read(dst[len(dst):min(cap(dst), want)])
		dst = dst[:len(dst)+n]
		if err != nil {
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return dst, err
		}
	}
	return dst, nil
}

// readMessage returns the next message's frames, valid until the next call. Commands
// between messages are consumed: PING is answered with PONG, others are ignored. A
// message over the bound is read past and reported with errTooLarge; a protocol error
// (errZMTP) or an I/O error ends the connection.
func (z *zmtpReader) readMessage() ([][]byte, error) {
	z.frames, z.buf, z.ends = z.frames[:0], z.buf[:0], z.ends[:0]
	total, tooLarge := uint64(0), false
	for {
		flags, size, err := z.frameHeader()
		if err != nil {
			return nil, err
		}
		if flags&flagCommand != 0 {
			if len(z.ends) > 0 || flags&flagMore != 0 {
				return nil, fmt.Errorf("%w: command inside a message", errZMTP)
			}
			if err := z.command(size); err != nil {
				return nil, err
			}
			continue
		}
		total += size
		if total > uint64(max(z.max, zmtpMaxDiscard)) {
			return nil, fmt.Errorf("%w: %w: a message announcing %d bytes or more", errZMTP, errTooLarge, total)
		}
		if tooLarge || total > uint64(z.max) {
			tooLarge = true
			if _, err := io.CopyN(io.Discard, z.r, int64(size)); err != nil {
				return nil, err
			}
		} else if z.buf, err = z.readBody(z.buf, size); err != nil {
			return nil, err
		}
		z.ends = append(z.ends, len(z.buf))
		if flags&flagMore == 0 {
			break
		}
		if len(z.ends) > 64 {
			return nil, fmt.Errorf("%w: more than 64 frames in a message", errZMTP)
		}
	}
	if tooLarge {
		return nil, fmt.Errorf("%w: %d bytes", errTooLarge, total)
	}
	start := 0
	for _, e := range z.ends {
		z.frames = append(z.frames, z.buf[start:e:e])
		start = e
	}
	return z.frames, nil
}

// command handles a command frame after the handshake.
func (z *zmtpReader) command(size uint64) error {
	if size > 512 {
		return fmt.Errorf("%w: command of %d bytes", errZMTP, size)
	}
	body, err := z.readBody(make([]byte, 0, size), size)
	if err != nil {
		return err
	}
	if len(body) == 0 || int(body[0]) > len(body)-1 {
		return fmt.Errorf("%w: bad command frame", errZMTP)
	}
	name, rest := string(body[1:1+body[0]]), body[1+body[0]:]
	switch {
	case name == "PING" && len(rest) >= 2:
		// PING: 2-byte TTL, then a context the PONG echoes.
		_, err := z.w.Write(command("PONG", rest[2:]))
		return err
	case name == "PONG":
		z.ponged.Store(true)
	}
	return nil
}

package kvevents

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"os"
	"time"
)

// endSeq is the sequence number vLLM's replay socket sends to end a reply.
var endSeq = [8]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}

type replayResult int

const (
	replayOK replayResult = iota
	replayEvicted
	replayFailed
)

// countGap counts batches [from, upto) as lost.
func (st *stream) countGap(from, upto uint64) {
	st.s.m.gaps.Inc()
	st.mu.Lock()
	st.st.Gaps++
	st.mu.Unlock()
	st.report(failGap, "KV events gap", fmt.Errorf("gap: batches %d..%d lost", from, upto-1))
}

// recover fetches and applies batches [from, upto) through the replay socket. When that
// is impossible or incomplete, the endpoint's entries are cleared (a partially applied
// replay leaves a hole too).
func (st *stream) recover(ctx context.Context, from, upto uint64) {
	if st.replay == "" {
		st.clear(ClearGap)
		return
	}
	res, _, _ := st.replayRange(ctx, from, upto, false)
	if ctx.Err() != nil {
		return // stopping (Run ended or the endpoint was removed): not a replay failure
	}
	st.mu.Lock()
	st.st.Replays++
	if res != replayOK {
		st.st.ReplayFailures++
	}
	st.mu.Unlock()
	switch res {
	case replayOK:
		st.s.m.replays.WithLabelValues("ok").Inc()
	case replayEvicted:
		st.s.m.replays.WithLabelValues("evicted").Inc()
		st.report(failReplay, "KV events replay failed", fmt.Errorf("replay of %d..%d: evicted from the publisher's buffer", from, upto-1))
		st.clear(ClearEvicted)
	default:
		st.s.m.replays.WithLabelValues("failed").Inc()
		st.report(failReplay, "KV events replay failed", fmt.Errorf("replay of %d..%d from %s: unreachable, silent or garbled", from, upto-1, st.replay))
		st.clear(ClearReplayFailed)
	}
}

// rebuild asks the replay socket for everything it holds, from sequence 0, as soon as a
// new connection to the publisher is up, before any live batch is read: a router that
// (re)starts, or reconnects after a dropped connection, while the pod keeps its cache,
// learns that cache without waiting for the pod's next batch (an idle pod may send none
// for a long time). The SUB connection is already subscribed, so a batch published
// during the rebuild arrives live as well (handle skips what the replay applied), and
// one published between the replay's end and the subscription taking effect shows as a
// gap on the first live batch. A buffer that no longer starts at 0 (vLLM keeps the last
// buffer_steps batches) is applied from its oldest batch: the index then misses the
// blocks stored before it that the pod still caches, and holds nothing the pod does not
// (removals of unknown blocks are no-ops, continuations of unknown parents are orphans).
// It reports whether the replay socket answered; an empty buffer is not counted as a
// replay.
func (st *stream) rebuild(ctx context.Context) (answered bool) {
	res, oldest, applied := st.replayRange(ctx, 0, math.MaxUint64, true)
	if ctx.Err() != nil {
		return false
	}
	if res == replayOK && applied == 0 {
		return true
	}
	st.mu.Lock()
	st.st.Replays++
	if res != replayOK || oldest > 0 {
		st.st.ReplayFailures++
	}
	st.mu.Unlock()
	switch {
	case res == replayOK && oldest == 0:
		st.s.m.replays.WithLabelValues("ok").Inc()
	case res == replayOK:
		st.s.m.replays.WithLabelValues("evicted").Inc()
		st.report(failReplay, "KV events replay incomplete", fmt.Errorf("rebuild on connect: batches 0..%d evicted from the publisher's buffer; "+
			"the blocks they stored are not indexed", oldest-1))
	case res == replayEvicted:
		// A hole that left the buffer between two rounds: what was applied may miss
		// a removal.
		st.s.m.replays.WithLabelValues("evicted").Inc()
		st.report(failReplay, "KV events replay failed", errors.New("rebuild on connect: batches evicted from the publisher's buffer between rounds"))
		st.clear(ClearEvicted)
	default:
		st.s.m.replays.WithLabelValues("failed").Inc()
		st.report(failReplay, "KV events replay failed", fmt.Errorf("rebuild on connect from %s: unreachable, silent or garbled", st.replay))
		st.clear(ClearReplayFailed)
	}
	return res != replayFailed
}

// replayRange runs the replay protocol against vLLM's ROUTER: send ["", seq]; replies
// are ["", topic, seq, payload] (vLLM >= 0.26) or ["", seq, payload], ending with seq
// 0xFF x 8. The ROUTER's send high-water mark truncates long replays with holes, so only
// the contiguous prefix is applied and the next round asks again from the first hole. A
// round ends on END or after ReplayIdle without a reply. A first reply past the requested
// seq means the batches were evicted from the replay buffer. In rebuild mode (upto
// unbounded) the replay ends with the first round that brings nothing new, and a first
// reply past from is applied from there (oldest says where the buffer started).
func (st *stream) replayRange(ctx context.Context, from, upto uint64, rebuild bool) (res replayResult, oldest uint64, applied int) {
	cfg := &st.s.cfg
	rctx, cancel := context.WithTimeout(ctx, cfg.ReplayTimeout)
	defer cancel() // closes the connection
	deadline, _ := rctx.Deadline()
	lc, z, err := st.s.dial(rctx, st.replay, func(z *zmtpReader) error { return z.greet("DEALER", "ROUTER") })
	if err != nil {
		return replayFailed, from, 0
	}
	_ = lc.SetWriteDeadline(deadline)

	want := from
	oldest = from
	var req []byte
	for round := 0; round < cfg.ReplayMaxRounds && want < upto; round++ {
		req = appendMessage(req[:0], nil, binary.BigEndian.AppendUint64(nil, want))
		if _, err := lc.Write(req); err != nil {
			return replayFailed, oldest, applied
		}
		st.mu.Lock()
		st.st.ReplayRounds++
		st.mu.Unlock()
		first, holed, progressed, answered, ended := true, false, false, false, false
	round:
		for {
			// The idle timeout applies between messages only; a message that has
			// started arriving has until the recovery's deadline.
			idle := time.Now().Add(cfg.ReplayIdle)
			if idle.After(deadline) {
				idle = deadline
			}
			_ = lc.SetReadDeadline(idle)
			if err := z.waitMessage(); err != nil {
				if errors.Is(err, os.ErrDeadlineExceeded) && time.Now().Before(deadline) {
					break round
				}
				return replayFailed, oldest, applied
			}
			_ = lc.SetReadDeadline(deadline)
			frames, err := z.readMessage()
			if err != nil {
				if errors.Is(err, errTooLarge) {
					st.drop(badTooLarge) // a batch that cannot be read: cannot recover
				}
				return replayFailed, oldest, applied
			}
			answered = true
			f := frames
			if len(f) > 0 && len(f[0]) == 0 {
				f = f[1:] // the DEALER's empty delimiter
			}
			var seqB, payload []byte
			switch len(f) {
			case 2:
				seqB, payload = f[0], f[1]
			case 3:
				seqB, payload = f[1], f[2]
			default:
				st.drop(badFrames)
				continue
			}
			if len(seqB) != 8 {
				st.drop(badSeq)
				continue
			}
			if [8]byte(seqB) == endSeq {
				ended = true
				break round
			}
			if holed || want >= upto {
				continue // drain the round
			}
			seq := binary.BigEndian.Uint64(seqB)
			if first && seq > want {
				if !rebuild || round > 0 {
					return replayEvicted, oldest, applied
				}
				oldest, want = seq, seq // rebuild: from the oldest batch buffered
			}
			first = false
			switch {
			case seq < want:
				continue
			case seq > want:
				holed = true
				continue
			}
			if err := Decode(payload, &st.batch); err != nil {
				st.decodeError(err)
				return replayFailed, oldest, applied
			}
			st.apply(&st.batch)
			st.advance(seq)
			want++
			applied++
			progressed = true
			if want >= upto {
				return replayOK, oldest, applied
			}
		}
		switch {
		case rebuild && (!progressed && answered || ended && !holed):
			// Caught up with the buffer; what comes after arrives live (or shows as
			// a gap on the first live batch).
			return replayOK, oldest, applied
		case !progressed:
			return replayFailed, oldest, applied
		}
	}
	if want >= upto || rebuild {
		return replayOK, oldest, applied
	}
	return replayFailed, oldest, applied
}

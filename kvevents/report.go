package kvevents

import (
	"strconv"
	"time"

	"go.uber.org/zap"
)

// logEvery bounds how often one stream logs one kind of failure: a pod down for an hour
// or a publisher garbling every batch logs once per interval, with the count of what was
// not logged, instead of once per dial or message. Every failure is still counted in the
// metrics and shown as the stream's LastError.
const logEvery = 30 * time.Second

// failure is a kind of stream failure, rate-limited in the log on its own.
type failure uint8

const (
	failDial failure = iota
	failConnection
	failGap
	failReplay
	failClear
	failDecode
	failTopic
	numFailures
)

// logLimit is a stream's log rate limiter, one slot per failure kind (under stream.mu).
type logLimit struct {
	last       [numFailures]time.Time
	suppressed [numFailures]int
}

// report records err as the stream's last error and logs it at Warn with the endpoint,
// rank, address and fields, unless a failure of the same kind was logged for this
// stream within logEvery.
func (st *stream) report(kind failure, msg string, err error, fields ...zap.Field) {
	st.mu.Lock()
	st.st.LastError, st.st.LastErrorAt = err.Error(), st.s.clock.Now()
	st.mu.Unlock()
	st.logLimited(kind, msg, err, fields...)
}

// logLimited is report without recording err as the stream's last error.
func (st *stream) logLimited(kind failure, msg string, err error, fields ...zap.Field) {
	now := st.s.clock.Now()
	st.mu.Lock()
	l := &st.logs
	if last := l.last[kind]; !last.IsZero() && now.Sub(last) < logEvery && now.Sub(last) >= 0 {
		l.suppressed[kind]++
		st.mu.Unlock()
		return
	}
	suppressed := l.suppressed[kind]
	l.last[kind], l.suppressed[kind] = now, 0
	st.mu.Unlock()
	fields = append(fields, zap.String("endpoint", st.name), zap.Int("rank", st.rank),
		zap.String("address", st.addr), zap.Error(err))
	if suppressed > 0 {
		fields = append(fields, zap.Int("suppressed_since_last_log", suppressed))
	}
	st.s.log.Warn(msg, fields...)
}

// foreignTopic records a message dropped for its topic.
func (st *stream) foreignTopic(topic []byte) {
	st.mu.Lock()
	st.st.ForeignTopic = string(topic)
	st.mu.Unlock()
	st.report(failTopic, "KV events on another topic dropped", &topicError{got: string(topic), want: string(st.topic)})
}

// topicError is a message whose topic does not start with the configured one.
type topicError struct{ got, want string }

func (e *topicError) Error() string {
	return "topic " + strconv.Quote(e.got) + " does not start with the configured topic " + strconv.Quote(e.want)
}

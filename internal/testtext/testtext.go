package testtext

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"encoding/json"
	"io"
	"math/rand/v2"
	"os"
	"strings"
	"testing"
)

// words are common English words plus the project's own vocabulary.
var words = strings.Fields(`the of and to in is that for it as was with be by on not he this are or his
from at which but have an they you were her she there been one all we their has would when if so no
will can more about said into its only other than then them these some time very could make like
router cache block token prefix request latency throughput model server pod weight score index event`)

// Prose returns deterministic prose of about n tokens: three words for every four
// tokens, a sentence every 17 words. The same seed and n give the same text; different
// seeds give texts that share no long prefix.
func Prose(seed uint64, n int) string {
	r := rand.New(rand.NewPCG(seed, 7))
	var b strings.Builder
	for i := 0; i < n*3/4; i++ {
		if i > 0 {
			if i%17 == 0 {
				b.WriteString(".\n")
			} else {
				b.WriteByte(' ')
			}
		}
		b.WriteString(words[r.IntN(len(words))])
	}
	return b.String()
}

// Conversation returns the messages of a chat of about tokens tokens, a system prompt
// then alternating user (~250-token) and assistant (~350-token) turns, as a JSON array
// without its closing bracket, so that a caller can append the next turn's messages.
// Conversations share only their system prompt (the same for every conv).
func Conversation(tokens int, conv uint64) []byte {
	msgs := []map[string]string{{"role": "system", "content": Prose(1, 500)}}
	for n, i := 400, 0; n < tokens; i++ {
		role, size := "user", 250
		if i%2 == 1 {
			role, size = "assistant", 350
		}
		msgs = append(msgs, map[string]string{"role": role, "content": Prose(conv<<32+uint64(1000+i), size)})
		n += size * 4 / 5
	}
	raw, err := json.Marshal(msgs)
	if err != nil {
		panic(err)
	}
	return raw[:len(raw)-1]
}

// maxLine is the longest JSON Lines record ReadJSONL accepts.
const maxLine = 16 << 20

// ReadJSONL decodes the JSON Lines file at path, one T a line, skipping blank lines; a
// path ending in .gz is read through gzip. Any error fails tb.
func ReadJSONL[T any](tb testing.TB, path string) []T {
	tb.Helper()
	f, err := os.Open(path)
	if err != nil {
		tb.Fatal(err)
	}
	defer f.Close()
	var r io.Reader = f
	if strings.HasSuffix(path, ".gz") {
		zr, err := gzip.NewReader(f)
		if err != nil {
			tb.Fatalf("%s: %v", path, err)
		}
		r = zr
	}
	var out []T
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), maxLine)
	for line := 1; sc.Scan(); line++ {
		if len(bytes.TrimSpace(sc.Bytes())) == 0 {
			continue
		}
		var v T
		if err := json.Unmarshal(sc.Bytes(), &v); err != nil {
			tb.Fatalf("%s line %d: %v", path, line, err)
		}
		out = append(out, v)
	}
	if err := sc.Err(); err != nil {
		tb.Fatalf("%s: %v", path, err)
	}
	return out
}

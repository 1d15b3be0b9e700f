package tokenizer

import (
	"encoding/json"
	"fmt"
	"strconv"
)

// The vocabulary and merges are most of tokenizer.json (300,000 entries for Qwen3);
// scanning them by hand is several times faster than encoding/json's reflection and
// allocates far less. Everything else in the file goes through encoding/json.

type scanner struct {
	b []byte
	i int
}

func (s *scanner) ws() {
	for s.i < len(s.b) {
		switch s.b[s.i] {
		case ' ', '\t', '\n', '\r':
			s.i++
		default:
			return
		}
	}
}

func (s *scanner) errorf(format string, args ...any) error {
	return fmt.Errorf("offset %d: %s", s.i, fmt.Sprintf(format, args...))
}

// expect consumes c after optional white space.
func (s *scanner) expect(c byte) error {
	s.ws()
	if s.i >= len(s.b) || s.b[s.i] != c {
		return s.errorf("want %q", c)
	}
	s.i++
	return nil
}

// peek returns the next non-space byte, or 0 at the end.
func (s *scanner) peek() byte {
	s.ws()
	if s.i >= len(s.b) {
		return 0
	}
	return s.b[s.i]
}

// str reads a JSON string.
func (s *scanner) str() (string, error) {
	if err := s.expect('"'); err != nil {
		return "", err
	}
	start := s.i
	escaped := false
	for s.i < len(s.b) {
		switch c := s.b[s.i]; {
		case c == '"':
			s.i++
			if !escaped {
				return string(s.b[start : s.i-1]), nil
			}
			var out string
			if err := json.Unmarshal(s.b[start-1:s.i], &out); err != nil {
				return "", s.errorf("%v", err)
			}
			return out, nil
		case c == '\\':
			escaped = true
			s.i += 2
		case c < 0x20:
			return "", s.errorf("control character in string")
		default:
			s.i++
		}
	}
	return "", s.errorf("unterminated string")
}

// uint reads a non-negative integer that fits in uint32.
func (s *scanner) uint() (uint32, error) {
	s.ws()
	start := s.i
	for s.i < len(s.b) && s.b[s.i] >= '0' && s.b[s.i] <= '9' {
		s.i++
	}
	v, err := strconv.ParseUint(string(s.b[start:s.i]), 10, 32)
	if err != nil {
		return 0, s.errorf("want a token id: %v", err)
	}
	return uint32(v), nil
}

// list calls item for each element of a JSON array (open selects '[' or '{').
func (s *scanner) list(open, close byte, item func() error) error {
	if err := s.expect(open); err != nil {
		return err
	}
	if s.peek() == close {
		s.i++
		return nil
	}
	for {
		if err := item(); err != nil {
			return err
		}
		switch s.peek() {
		case ',':
			s.i++
		case close:
			s.i++
			return nil
		default:
			return s.errorf("want ',' or %q", close)
		}
	}
}

func (s *scanner) end() error {
	if s.peek() != 0 {
		return s.errorf("trailing data")
	}
	return nil
}

// key reads an object member's name and the ':' after it.
func (s *scanner) key() (string, error) {
	k, err := s.str()
	if err != nil {
		return "", err
	}
	return k, s.expect(':')
}

// document is list for an array or object that must be the whole input: anything but
// white space after it is an error.
func (s *scanner) document(open, close byte, item func() error) error {
	if err := s.list(open, close, item); err != nil {
		return err
	}
	return s.end()
}

// scanVocab parses the model's "vocab" object {"token": id, ...}.
func scanVocab(raw []byte) (map[string]uint32, error) {
	s := &scanner{b: raw}
	vocab := make(map[string]uint32, len(raw)/16)
	err := s.document('{', '}', func() error {
		k, err := s.key()
		if err != nil {
			return err
		}
		id, err := s.uint()
		if err != nil {
			return err
		}
		vocab[k] = id
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("vocab: %w", err)
	}
	return vocab, nil
}

// scanMerges parses the model's "merges": [["a", "b"], ...] or the older ["a b", ...].
func scanMerges(raw []byte) ([][2]string, error) {
	s := &scanner{b: raw}
	merges := make([][2]string, 0, len(raw)/12)
	err := s.document('[', ']', func() error {
		if s.peek() == '"' {
			l, err := s.str()
			if err != nil {
				return err
			}
			for i := 0; i < len(l); i++ {
				if l[i] == ' ' {
					merges = append(merges, [2]string{l[:i], l[i+1:]})
					return nil
				}
			}
			return s.errorf("merge %q has no space", l)
		}
		var pair [2]string
		n := 0
		err := s.list('[', ']', func() error {
			if n == 2 {
				return s.errorf("merge with more than two parts")
			}
			var err error
			pair[n], err = s.str()
			n++
			return err
		})
		if err == nil && n != 2 {
			err = s.errorf("merge with %d parts", n)
		}
		merges = append(merges, pair)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("merges: %w", err)
	}
	return merges, nil
}

// skip passes over one JSON value without decoding it. It checks brackets and strings;
// the values that matter are decoded (and validated) afterwards.
func (s *scanner) skip() error {
	switch s.peek() {
	case '"':
		_, err := s.rawString()
		return err
	case '{':
		return s.list('{', '}', func() error {
			if _, err := s.rawString(); err != nil {
				return err
			}
			if err := s.expect(':'); err != nil {
				return err
			}
			return s.skip()
		})
	case '[':
		return s.list('[', ']', s.skip)
	case 0:
		return s.errorf("unexpected end")
	}
	start := s.i
	for s.i < len(s.b) {
		switch s.b[s.i] {
		case ',', '}', ']', ' ', '\t', '\n', '\r':
			if s.i == start {
				return s.errorf("want a value")
			}
			return nil
		}
		s.i++
	}
	return nil
}

// rawString passes over a JSON string and returns its undecoded contents.
func (s *scanner) rawString() ([]byte, error) {
	if err := s.expect('"'); err != nil {
		return nil, err
	}
	start := s.i
	for s.i < len(s.b) {
		switch c := s.b[s.i]; {
		case c == '"':
			s.i++
			return s.b[start : s.i-1], nil
		case c == '\\':
			s.i += 2
		default:
			s.i++
		}
	}
	return nil, s.errorf("unterminated string")
}

// fields splits a JSON object into its members' raw values. Keys are expected without
// escapes (as tokenizer.json writes them); a later duplicate wins, as in encoding/json.
func fields(raw []byte) (map[string][]byte, error) {
	s := &scanner{b: raw}
	out := map[string][]byte{}
	err := s.document('{', '}', func() error {
		k, err := s.key()
		if err != nil {
			return err
		}
		s.ws()
		start := s.i
		if err := s.skip(); err != nil {
			return err
		}
		out[k] = raw[start:s.i]
		return nil
	})
	return out, err
}

// object re-assembles members of a JSON object, leaving out the keys in skip.
func object(f map[string][]byte, skip ...string) []byte {
	b := []byte{'{'}
next:
	for k, v := range f {
		for _, sk := range skip {
			if k == sk {
				continue next
			}
		}
		if len(b) > 1 {
			b = append(b, ',')
		}
		b = strconv.AppendQuote(b, k)
		b = append(b, ':')
		b = append(b, v...)
	}
	return append(b, '}')
}

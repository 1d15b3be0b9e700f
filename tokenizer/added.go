package tokenizer

import (
	"bytes"
	"strings"
	"unicode"
	"unicode/utf8"
)

// addedToken is one entry of tokenizer.json's added_tokens.
type addedToken struct {
	ID         uint32 `json:"id"`
	Content    string `json:"content"`
	SingleWord bool   `json:"single_word"`
	LStrip     bool   `json:"lstrip"`
	RStrip     bool   `json:"rstrip"`
	Normalized bool   `json:"normalized"`
	Special    bool   `json:"special"`
}

// trieNode is a byte trie node; tok is the index of the token ending here, or -1.
// Its edges are parallel slices searched with IndexByte: most nodes have one child,
// and a long conversation walks the trie at every added token it holds.
type trieNode struct {
	edges []byte  // the bytes of the edges
	next  []int32 // the node each edge leads to
	tok   int32
}

// child returns the node the edge labelled c leads to, or -1. Small nodes (most of
// a token's path) are searched with a plain loop: a call to IndexByte costs more than
// the few comparisons, and a long conversation walks a token's whole path at every
// added token it holds.
func (n *trieNode) child(c byte) int32 {
	if len(n.edges) <= 8 {
		for k, e := range n.edges {
			if e == c {
				return n.next[k]
			}
		}
		return -1
	}
	if k := bytes.IndexByte(n.edges, c); k >= 0 {
		return n.next[k]
	}
	return -1
}

// matcher finds added tokens leftmost-longest, as HF's aho-corasick
// (MatchKind::LeftmostLongest) does.
type matcher struct {
	tokens []addedToken
	nodes  []trieNode
	first  [256]bool
	// only is the single first byte of every token, when they share one (e.g. '<'),
	// so candidates are found with strings.IndexByte.
	only    byte
	hasOnly bool
}

func newMatcher(tokens []addedToken) *matcher {
	m := &matcher{tokens: tokens, nodes: []trieNode{{tok: -1}}}
	firsts := map[byte]bool{}
	for i, t := range tokens {
		if t.Content == "" {
			continue
		}
		n := int32(0)
		for j := 0; j < len(t.Content); j++ {
			c := t.Content[j]
			nx := m.nodes[n].child(c)
			if nx < 0 {
				nx = int32(len(m.nodes))
				m.nodes = append(m.nodes, trieNode{tok: -1})
				m.nodes[n].edges = append(m.nodes[n].edges, c)
				m.nodes[n].next = append(m.nodes[n].next, nx)
			}
			n = nx
		}
		if m.nodes[n].tok < 0 {
			m.nodes[n].tok = int32(i)
		}
		m.first[t.Content[0]] = true
		firsts[t.Content[0]] = true
	}
	if len(firsts) == 1 {
		for c := range firsts {
			m.only, m.hasOnly = c, true
		}
	}
	return m
}

func (m *matcher) empty() bool { return len(m.nodes) == 1 }

// longestAt returns the token index and end of the longest token starting at s[i].
func (m *matcher) longestAt(s string, i int) (tok int32, end int) {
	tok, n := -1, int32(0)
	for j := i; j < len(s); j++ {
		nx := m.nodes[n].child(s[j])
		if nx < 0 {
			break
		}
		n = nx
		if t := m.nodes[n].tok; t >= 0 {
			tok, end = t, j+1
		}
	}
	return tok, end
}

// nextMatch returns the leftmost-longest match at or after s[from], or tok -1.
func (m *matcher) nextMatch(s string, from int) (tok int32, start, end int) {
	for i := from; i < len(s); i++ {
		if m.hasOnly {
			k := strings.IndexByte(s[i:], m.only)
			if k < 0 {
				return -1, 0, 0
			}
			i += k
		} else if !m.first[s[i]] {
			continue
		}
		if t, e := m.longestAt(s, i); t >= 0 {
			return t, i, e
		}
	}
	return -1, 0, 0
}

// piece is a part of the input: an added token (tok >= 0) or text to tokenize.
type piece struct {
	text string
	tok  int32
	at   int // an added token's start in the input (after lstrip)
}

// split cuts s into text and added tokens the way HF's AddedVocabulary::find_matches
// does, honouring single_word, lstrip and rstrip, and appends the pieces to out.
func (m *matcher) split(s string, out []piece) []piece {
	var buf [16]addedMatch
	matches := buf[:0]
	return m.splitWith(s, out, &matches)
}

// addedMatch is an added token found in a text, before HF's filters.
type addedMatch struct {
	tok        int32
	start, end int
}

// splitWith is split with a buffer for the matches (a long text has thousands),
// which it leaves grown in *buf.
func (m *matcher) splitWith(s string, out []piece, buf *[]addedMatch) []piece {
	if m.empty() {
		return append(out, piece{text: s, tok: -1})
	}
	matches := (*buf)[:0]
	defer func() { *buf = matches[:0] }()
	// HF collects every non-overlapping match first, then filters and widens them.
	for from := 0; from < len(s); {
		t, st, e := m.nextMatch(s, from)
		if t < 0 {
			break
		}
		matches = append(matches, addedMatch{t, st, e})
		from = e
	}
	offset := 0
	for _, mt := range matches {
		tk := &m.tokens[mt.tok]
		start, stop := mt.start, mt.end
		if tk.SingleWord {
			startSpace := start == 0 || !endsWithWord(s[:start])
			stopSpace := stop == len(s) || !startsWithWord(s[stop:])
			if !startSpace || !stopSpace {
				continue
			}
		}
		if tk.LStrip {
			start = max(spaceLeftmostAtEnd(s[:start]), offset)
		}
		if tk.RStrip {
			stop += spaceRightmostAtStart(s[stop:])
		}
		if offset < start {
			out = append(out, piece{text: s[offset:start], tok: -1})
		}
		// A match overlapping the previous token's rstrip still counts, as in HF.
		out = append(out, piece{tok: mt.tok, at: start})
		offset = stop
	}
	if offset < len(s) {
		out = append(out, piece{text: s[offset:], tok: -1})
	}
	return out
}

// isWordRune is the regex crate's Unicode \w, which HF uses for single_word:
// Alphabetic, Mark, Decimal_Number, Connector_Punctuation and Join_Control.
func isWordRune(r rune) bool {
	return unicode.IsLetter(r) || unicode.Is(unicode.Nl, r) || unicode.Is(unicode.Other_Alphabetic, r) ||
		unicode.IsMark(r) || unicode.Is(unicode.Nd, r) || unicode.Is(unicode.Pc, r) || r == 0x200C || r == 0x200D
}

func endsWithWord(s string) bool {
	r, _ := utf8.DecodeLastRuneInString(s)
	return s != "" && isWordRune(r)
}

func startsWithWord(s string) bool {
	r, _ := utf8.DecodeRuneInString(s)
	return s != "" && isWordRune(r)
}

// spaceLeftmostAtEnd returns the start of the run of white space that ends s.
func spaceLeftmostAtEnd(s string) int {
	i := len(s)
	for i > 0 {
		r, n := utf8.DecodeLastRuneInString(s[:i])
		if !unicode.IsSpace(r) {
			break
		}
		i -= n
	}
	return i
}

// spaceRightmostAtStart returns the length of the run of white space that starts s.
func spaceRightmostAtStart(s string) int {
	i := 0
	for i < len(s) {
		r, n := utf8.DecodeRuneInString(s[i:])
		if !unicode.IsSpace(r) {
			break
		}
		i += n
	}
	return i
}

// cutSafe reports whether text splits exactly before every raw match of tok: the ids of
// text are those of text[:c] followed by those of text[c:] when tok is matched at c.
// That holds when the split of text[:c] does not depend on what follows c and the
// match itself does not depend on what precedes it: tok must not strip the white space
// before it (lstrip) nor be matched as a single word only (single_word looks at the
// character before it), and its first character must be neither white space (an
// earlier token's rstrip would run into it) nor a word character (an earlier
// single_word token ending at c looks at it). Segments between raw matches are then
// normalised, pre-tokenised and merged on their own, and the leftmost-longest scan
// finds the same matches before c in text[:c] as in text, because no match it took
// before c ends after c (it would overlap the match at c).
func cutSafe(tk addedToken) bool {
	if tk.LStrip || tk.SingleWord || tk.Normalized || tk.Content == "" {
		return false
	}
	r, _ := utf8.DecodeRuneInString(tk.Content)
	return !unicode.IsSpace(r) && !isWordRune(r)
}

package tokenizer

import "unicode/utf8"

// splitKind names a pre-tokenizer regex that has a hand-written matcher. Each matcher
// reproduces Oniguruma's leftmost-first alternation for its exact pattern.
type splitKind uint8

const (
	splitNone splitKind = iota
	// splitQwen2 is the Qwen2/Qwen3 Split regex (one digit per piece).
	splitQwen2
	// splitLlama3 is the Llama 3 Split regex (up to three digits per piece).
	splitLlama3
	// splitGPT2 is the regex of ByteLevel with use_regex=true (GPT-2).
	splitGPT2
)

// Patterns exactly as they appear in tokenizer.json.
const (
	patternQwen2  = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
	patternLlama3 = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
)

// decode returns the rune at s[i] and its width; s is valid UTF-8.
func decode(s string, i int) (rune, int) {
	if c := s[i]; c < utf8.RuneSelf {
		return rune(c), 1
	}
	return utf8.DecodeRuneInString(s[i:])
}

func isOther(c uint8) bool { return c&(clsLetter|clsNumber|clsSpace) == 0 }

// foldEq reports whether r equals the ASCII lower-case letter l under Unicode simple
// case folding, as Oniguruma's (?i) does: 'S', 's' and U+017F (long s) all fold to 's'.
func foldEq(r rune, l byte) bool {
	if r == rune(l) || r == rune(l-'a'+'A') {
		return true
	}
	return l == 's' && r == 0x17F
}

// contraction returns the end of a match of 's|'t|'re|'ve|'m|'ll|'d at s[i] (which
// holds an apostrophe), or -1. fold selects case-insensitive matching.
func contraction(s string, i int, fold bool) int {
	j := i + 1
	if j >= len(s) {
		return -1
	}
	eq := func(r rune, l byte) bool {
		if fold {
			return foldEq(r, l)
		}
		return r == rune(l)
	}
	r1, n1 := decode(s, j)
	for _, l := range [...]byte{'s', 't', 'm', 'd'} {
		if eq(r1, l) {
			return j + n1
		}
	}
	if k := j + n1; k < len(s) {
		r2, n2 := decode(s, k)
		switch {
		case eq(r1, 'r') && eq(r2, 'e'), eq(r1, 'v') && eq(r2, 'e'), eq(r1, 'l') && eq(r2, 'l'):
			return k + n2
		}
	}
	return -1
}

// run returns the end of the longest run at s[i:] of runes whose class satisfies ok.
func run(s string, i int, ok func(uint8) bool) int {
	for i < len(s) {
		if c := s[i]; c < utf8.RuneSelf {
			// ASCII: its class is in the table's first block (classIdx[0] == 0).
			if !ok(classBlocks[c]) {
				break
			}
			i++
			continue
		}
		r, n := decode(s, i)
		if !ok(classOf(r)) {
			break
		}
		i += n
	}
	return i
}

func isLetter(c uint8) bool { return c&clsLetter != 0 }
func isNumber(c uint8) bool { return c&clsNumber != 0 }
func isSpace(c uint8) bool  { return c&clsSpace != 0 }

// matchQwen returns the end of the match that starts at s[i] for the Qwen2/Llama 3
// pattern: (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,maxDigits}|
// ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
func matchQwen(s string, i, maxDigits int) int {
	r0, n0 := decode(s, i)
	c0 := classOf(r0)
	// (?i:'s|'t|'re|'ve|'m|'ll|'d)
	if r0 == '\'' {
		if e := contraction(s, i, true); e >= 0 {
			return e
		}
	}
	// [^\r\n\p{L}\p{N}]?\p{L}+
	if isLetter(c0) {
		return run(s, i, isLetter)
	}
	if !isNumber(c0) && r0 != '\r' && r0 != '\n' && i+n0 < len(s) {
		if r1, _ := decode(s, i+n0); isLetter(classOf(r1)) {
			return run(s, i+n0, isLetter)
		}
	}
	// \p{N}{1,maxDigits}
	if isNumber(c0) {
		j := i + n0
		for k := 1; k < maxDigits && j < len(s); k++ {
			r, n := decode(s, j)
			if !isNumber(classOf(r)) {
				break
			}
			j += n
		}
		return j
	}
	// ' ?[^\s\p{L}\p{N}]+[\r\n]*'
	j := i
	if r0 == ' ' {
		j++
	}
	if e := run(s, j, isOther); e > j {
		for e < len(s) && (s[e] == '\r' || s[e] == '\n') {
			e++
		}
		return e
	}
	return matchSpace(s, i, true)
}

// matchSpace handles the whitespace alternatives at s[i] (a \s rune):
// [\s*[\r\n]+ when crlf] | \s+(?!\S) | \s+
func matchSpace(s string, i int, crlf bool) int {
	end := i
	lastNL := -1
	last := i // start of the last rune of the run
	for end < len(s) {
		r, n := decode(s, end)
		if !isSpace(classOf(r)) {
			break
		}
		if r == '\r' || r == '\n' {
			lastNL = end
		}
		last = end
		end += n
	}
	if crlf && lastNL >= 0 {
		return lastNL + 1
	}
	if end == len(s) || last == i {
		return end
	}
	return last
}

// matchGPT2 returns the end of the match at s[i] for the GPT-2 pattern:
// 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
func matchGPT2(s string, i int) int {
	r0, _ := decode(s, i)
	if r0 == '\'' {
		if e := contraction(s, i, false); e >= 0 {
			return e
		}
	}
	j := i
	if r0 == ' ' {
		j++
	}
	if j < len(s) {
		r, _ := decode(s, j)
		c := classOf(r)
		switch {
		case isLetter(c):
			return run(s, j, isLetter)
		case isNumber(c):
			return run(s, j, isNumber)
		case isOther(c):
			return run(s, j, isOther)
		}
	}
	return matchSpace(s, i, false)
}

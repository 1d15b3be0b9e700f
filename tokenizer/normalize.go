package tokenizer

import (
	"strings"

	"golang.org/x/text/unicode/norm"
)

// nfc normalises s to NFC the way HuggingFace tokenizers does. HF's NFC (crate
// unicode-normalization-alignments 0.1.12) has Unicode 9.0 tables: characters assigned
// later are inert starters to it, while x/text/unicode/norm (Unicode 15.0) may reorder
// or compose them. So s is normalised in chunks separated by such characters, which are
// copied unchanged.
func nfc(s string) string {
	if isASCII(s) || norm.NFC.IsNormalString(s) {
		return s
	}
	var b strings.Builder
	b.Grow(len(s))
	start := 0
	for i := 0; i < len(s); {
		r, n := decode(s, i)
		if r >= 0x300 && classOf(r)&clsNew9 != 0 {
			b.WriteString(norm.NFC.String(s[start:i]))
			b.WriteString(s[i : i+n])
			start = i + n
		}
		i += n
	}
	b.WriteString(norm.NFC.String(s[start:]))
	return b.String()
}

func isASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] >= 0x80 {
			return false
		}
	}
	return true
}

package server

// words make the deterministic pseudo-text of generated tokens.
var words = [...]string{"the", "of", "and", "to", "in", "a", "is", "that", "for", "it", "as",
	"was", "with", "be", "by", "on", "not", "he", "this", "are", "or", "his", "from", "at",
	"which", "but", "have", "an", "had", "they", "you", "were", "their", "one", "all", "we",
	"can", "her", "has", "there", "been", "if", "more", "when", "will", "would", "who", "so",
	"no", "cache", "block", "prefix", "token", "route", "server", "model", "fleet", "event"}

// tokenText is the text of one generated token: a space and a word chosen by the id.
func tokenText(tok uint32) string { return " " + words[tok%uint32(len(words))] }

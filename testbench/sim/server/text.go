package server

import "fmt"

// words make the deterministic pseudo-text of generated tokens.
var words = [...]string{"the", "of", "and", "to", "in", "a", "is", "that", "for", "it", "as",
	"was", "with", "be", "by", "on", "not", "he", "this", "are", "or", "his", "from", "at",
	"which", "but", "have", "an", "had", "they", "you", "were", "their", "one", "all", "we",
	"can", "her", "has", "there", "been", "if", "more", "when", "will", "would", "who", "so",
	"no", "cache", "block", "prefix", "token", "route", "server", "model", "fleet", "event"}

// vocabulary makes generated tokens real when the server has the model's tokenizer: the
// engines generate only the ids of the words that are one token each, and each id's text
// is its word, so a client that sends an answer back (the next turn of a chat) renders
// it to the very ids the server generated and cached, as a real model's answers mostly
// re-tokenize. Without a tokenizer ids are arbitrary and tokenText picks a word by id.
func (s *Server) vocabulary() ([]uint32, error) {
	if s.opts.Tokenizer == nil {
		return nil, nil
	}
	s.text = map[uint32]string{}
	var vocab []uint32
	for _, w := range words {
		ids, err := s.opts.Tokenizer.Encode(" "+w, false)
		if err != nil {
			return nil, fmt.Errorf("server: tokenizing %q: %w", w, err)
		}
		if len(ids) == 1 && s.text[ids[0]] == "" {
			vocab = append(vocab, ids[0])
			s.text[ids[0]] = " " + w
		}
	}
	if len(vocab) == 0 {
		return nil, nil
	}
	return vocab, nil
}

// tokenText is the text of one generated token: its word with the model's tokenizer,
// else a space and a word chosen by the id.
func (s *Server) tokenText(tok uint32) string {
	if t, ok := s.text[tok]; ok {
		return t
	}
	return " " + words[tok%uint32(len(words))]
}

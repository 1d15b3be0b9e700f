// Package tokenizer is a pure-Go HuggingFace byte-level BPE tokenizer (Qwen2/Qwen3,
// Llama 3, GPT-2 style) that reproduces HuggingFace tokenizers' encode exactly: added
// tokens split first (leftmost-longest), NFC per segment with HF's Unicode 9.0
// behaviour, the Split pre-tokenizer regexes as hand-written matchers with Oniguruma
// semantics and Unicode 16.0 classes, byte-level BPE merges by rank, and the
// TemplateProcessing post-processor. tokenizer.json files of any other kind fail to
// load with an *UnsupportedError.
//
// A prefix cache memoises the ids of text prefixes that end before an added token
// where the split is exact (see prefixcache.go and the README), so a conversation's
// next turn tokenizes only its new messages.
//
// Concurrency: a *Tokenizer is immutable after loading except for its internal,
// locked prefix cache (an LRU under a byte budget); all methods are safe for
// concurrent use.
package tokenizer

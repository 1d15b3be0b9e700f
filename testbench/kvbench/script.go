package kvbench

import (
	"cmp"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"slices"
	"strings"
	"time"
)

// Script is an open-loop workload of sessions: each session starts at its own time and
// sends its turns one after another, each turn Think after the previous response ended.
// A trace is sessions of one turn each; a chat or an agent re-sends its whole history
// with every turn. Scripts are immutable once built and safe for concurrent use.
type Script struct {
	// Name labels the workload in reports ("trace", "chat", "agent", "mixed").
	Name string
	// API is completions (trace turns: token-id prompts) or chat (history as messages,
	// rendered by the model's chat template).
	API      API
	Sessions []Session
	// vocab are the one-token words texts and trace prompts are made of, and the ids
	// simulated servers generate; text maps an id to its text (" word").
	vocab []uint32
	text  map[uint32]string
}

// Session is one conversation, agent or one-shot request.
type Session struct {
	// Start is when its first turn is sent, from the start of the run.
	Start time.Duration
	// System is the chat's system message ("" for none): a shared prompt or an agent's
	// long context.
	System string
	Turns  []Turn
}

// Turn is one request of a session.
type Turn struct {
	// Think is the pause between the previous turn's response and this turn.
	Think time.Duration
	// User is the new user message (chat).
	User string
	// Trace is the record whose hash ids make the prompt (completions).
	Trace *TraceRecord
	// Output is max_tokens (with ignore_eos, the exact count).
	Output int
}

// Requests is the number of turns of every session.
func (s *Script) Requests() int {
	n := 0
	for i := range s.Sessions {
		n += len(s.Sessions[i].Turns)
	}
	return n
}

// Vocabulary returns the token ids simulated servers generate from; their texts
// tokenize back to them, so a chat's history renders to the ids the server cached.
func (s *Script) Vocabulary() []uint32 { return s.vocab }

// Path is the HTTP path of the script's API.
func (s *Script) Path() string {
	if s.API == APIChat {
		return "/v1/chat/completions"
	}
	return "/v1/completions"
}

// OutputText is the text of generated token ids as the server streams it.
func (s *Script) OutputText(ids []uint32) string {
	var b strings.Builder
	for _, id := range ids {
		b.WriteString(s.text[id])
	}
	return b.String()
}

// PromptIDs are a completions turn's prompt token ids.
func (s *Script) PromptIDs(t *Turn) []uint32 { return TraceTokens(t.Trace, s.vocab) }

// Body is the JSON body of turn k of session sess, given the assistant texts of its
// earlier turns (chat), streaming with usage.
func (s *Script) Body(sess *Session, k int, answers []string, model string, ignoreEOS bool) []byte {
	t := &sess.Turns[k]
	body := map[string]any{
		"model":          model,
		"max_tokens":     t.Output,
		"temperature":    0,
		"stream":         true,
		"stream_options": map[string]any{"include_usage": true},
	}
	if ignoreEOS {
		body["ignore_eos"] = true
	}
	if s.API == APIChat {
		msgs := make([]map[string]string, 0, 2*k+2)
		if sess.System != "" {
			msgs = append(msgs, map[string]string{"role": "system", "content": sess.System})
		}
		for i := 0; i < k; i++ {
			msgs = append(msgs, map[string]string{"role": "user", "content": sess.Turns[i].User},
				map[string]string{"role": "assistant", "content": answers[i]})
		}
		body["messages"] = append(msgs, map[string]string{"role": "user", "content": t.User})
	} else {
		body["prompt"] = s.PromptIDs(t)
	}
	b, _ := json.Marshal(body) // strings, ints, bools and id lists always marshal
	return b
}

// newScript returns an empty script over the words (checked with tok when there is one).
func newScript(name string, api API, tok Tokenizer) (*Script, error) {
	words, err := wordList(tok)
	if err != nil {
		return nil, err
	}
	s := &Script{Name: name, API: api, text: make(map[uint32]string, len(words))}
	for _, w := range words {
		s.vocab = append(s.vocab, w.id)
		s.text[w.id] = " " + w.text
	}
	return s, nil
}

// words draws a text of n one-token words.
func (s *Script) words(rng *rand.Rand, n int) string {
	var b strings.Builder
	for range n {
		b.WriteString(s.text[s.vocab[rng.IntN(len(s.vocab))]])
	}
	return b.String()
}

// NewTraceScript replays trace records: one completions request each, sent at its
// timestamp divided by speedup.
func NewTraceScript(recs []TraceRecord, speedup float64, tok Tokenizer) (*Script, error) {
	if speedup <= 0 {
		return nil, fmt.Errorf("kvbench: speedup must be positive, got %v", speedup)
	}
	s, err := newScript("trace", APICompletions, tok)
	if err != nil {
		return nil, err
	}
	for i := range recs {
		at := time.Duration(recs[i].Timestamp / speedup * float64(time.Millisecond))
		s.Sessions = append(s.Sessions, Session{Start: at, Turns: []Turn{{Trace: &recs[i], Output: recs[i].OutputLength}}})
	}
	return s, nil
}

// ChatConfig shapes a multi-turn chat workload: conversations arriving over a window,
// each turn re-sending the history plus a new user message after a think time.
type ChatConfig struct {
	Conversations int
	// Turns is the range of turns per conversation.
	Turns [2]int
	// SystemPrompts shared system prompts of SystemTokens tokens; each conversation
	// takes one uniformly (0 = none).
	SystemPrompts, SystemTokens int
	// UserTokens is the range of a user message's tokens; Output each answer's tokens.
	UserTokens [2]int
	Output     int
	// Think is the mean of the exponential think time (plus 1 s of reading and typing).
	Think time.Duration
	// Window spreads conversation starts uniformly over it.
	Window time.Duration
	Seed   uint64
}

// DefaultChatConfig is 48 conversations of 4-8 turns started over 30 s, 4 system prompts of
// 512 tokens, 50-400-token user messages, 150-token answers, 8 s mean think time: contexts
// grow to 2-5k tokens, and 48 live conversations outgrow a 1 GiB server's cache.
func DefaultChatConfig() ChatConfig {
	return ChatConfig{Conversations: 48, Turns: [2]int{4, 8}, SystemPrompts: 4, SystemTokens: 512,
		UserTokens: [2]int{50, 400}, Output: 150, Think: 8 * time.Second, Window: 30 * time.Second, Seed: 1}
}

func (c ChatConfig) validate() error {
	if c.Conversations < 0 || c.Turns[0] < 1 || c.Turns[1] < c.Turns[0] || c.SystemPrompts < 0 || c.SystemTokens < 0 ||
		c.UserTokens[0] < 1 || c.UserTokens[1] < c.UserTokens[0] || c.Output < 1 || c.Think < 0 || c.Window < 0 {
		return fmt.Errorf("kvbench: invalid chat config %+v", c)
	}
	return nil
}

// AgentConfig shapes an agentic long-context workload: a few very long shared contexts
// (a repository, a document set), several agents on each, every agent step appending a
// short tool result and getting a short answer.
type AgentConfig struct {
	// Contexts are the shared contexts' lengths in tokens.
	Contexts []int
	// Agents per context, Steps per agent.
	Agents, Steps int
	// StepTokens is the range of a step's appended tokens; Output each answer's tokens.
	StepTokens [2]int
	Output     int
	// Think is the mean pause between steps (tool execution).
	Think time.Duration
	// Window spreads agent starts uniformly over it.
	Window time.Duration
	Seed   uint64
}

// DefaultAgentConfig is 4 contexts of 32k, 48k, 64k and 100k tokens, 6 agents on each
// taking 8 steps of 100-400 tokens with 60-token answers, 2 s of tool time between steps,
// agents starting over 60 s: 192 requests whose prompts are 32k-104k tokens.
func DefaultAgentConfig() AgentConfig {
	return AgentConfig{Contexts: []int{32768, 49152, 65536, 102400}, Agents: 6, Steps: 8,
		StepTokens: [2]int{100, 400}, Output: 60, Think: 2 * time.Second, Window: 60 * time.Second, Seed: 1}
}

func (c AgentConfig) validate() error {
	if c.Agents < 0 || c.Steps < 1 || c.StepTokens[0] < 1 || c.StepTokens[1] < c.StepTokens[0] || c.Output < 1 ||
		c.Think < 0 || c.Window < 0 {
		return fmt.Errorf("kvbench: invalid agent config %+v", c)
	}
	for _, n := range c.Contexts {
		if n < 1 {
			return fmt.Errorf("kvbench: agent context of %d tokens", n)
		}
	}
	return nil
}

// OneShotConfig is single requests over shared prefixes (the reference experiment's shape,
// sent open loop): Requests of one of Prefixes prefixes of PrefixTokens plus a unique
// TailTokens tail, arriving uniformly over Window.
type OneShotConfig struct {
	Requests, Prefixes, PrefixTokens, TailTokens, Output int
	Window                                               time.Duration
	Seed                                                 uint64
}

// MixedConfig is some of each: chats, agents and one-shot requests in one fleet.
type MixedConfig struct {
	Chat    ChatConfig
	Agent   AgentConfig
	OneShot OneShotConfig
}

// DefaultMixedConfig halves the chat and agent defaults (24 conversations; 2 contexts of
// 32k and 64k with 4 agents of 6 steps) and adds 120 one-shot requests over 12 prefixes of
// 2,032 tokens with 339-token tails, all within the first 60 s.
func DefaultMixedConfig() MixedConfig {
	chat := DefaultChatConfig()
	chat.Conversations = 24
	agent := DefaultAgentConfig()
	agent.Contexts, agent.Agents, agent.Steps = []int{32768, 65536}, 4, 6
	return MixedConfig{Chat: chat, Agent: agent, OneShot: OneShotConfig{Requests: 120, Prefixes: 12,
		PrefixTokens: 2032, TailTokens: 339, Output: 100, Window: 60 * time.Second, Seed: 1}}
}

// NewChatScript builds a multi-turn chat workload.
func NewChatScript(cfg ChatConfig, tok Tokenizer) (*Script, error) {
	s, err := newScript("chat", APIChat, tok)
	if err != nil {
		return nil, err
	}
	return s, s.addChat(cfg)
}

// NewAgentScript builds an agentic long-context workload.
func NewAgentScript(cfg AgentConfig, tok Tokenizer) (*Script, error) {
	s, err := newScript("agent", APIChat, tok)
	if err != nil {
		return nil, err
	}
	return s, s.addAgents(cfg)
}

// NewMixedScript builds chats, agents and one-shot requests in one workload.
func NewMixedScript(cfg MixedConfig, tok Tokenizer) (*Script, error) {
	s, err := newScript("mixed", APIChat, tok)
	if err != nil {
		return nil, err
	}
	if err := errors.Join(s.addChat(cfg.Chat), s.addAgents(cfg.Agent), s.addOneShots(cfg.OneShot)); err != nil {
		return nil, err
	}
	sortSessions(s.Sessions)
	return s, nil
}

func (s *Script) addChat(c ChatConfig) error {
	if err := c.validate(); err != nil {
		return err
	}
	rng := rand.New(rand.NewPCG(c.Seed, 0x63686174)) // "chat"
	systems := make([]string, c.SystemPrompts)
	for i := range systems {
		systems[i] = s.words(rng, c.SystemTokens)
	}
	between := func(r [2]int) int { return r[0] + rng.IntN(r[1]-r[0]+1) }
	for range c.Conversations {
		sess := Session{Start: time.Duration(rng.Int64N(int64(c.Window) + 1))}
		if len(systems) > 0 {
			sess.System = systems[rng.IntN(len(systems))]
		}
		for k := range between(c.Turns) {
			t := Turn{User: s.words(rng, between(c.UserTokens)), Output: c.Output}
			if k > 0 {
				t.Think = time.Second + time.Duration(rng.ExpFloat64()*float64(c.Think))
			}
			sess.Turns = append(sess.Turns, t)
		}
		s.Sessions = append(s.Sessions, sess)
	}
	sortSessions(s.Sessions)
	return nil
}

func (s *Script) addAgents(c AgentConfig) error {
	if err := c.validate(); err != nil {
		return err
	}
	rng := rand.New(rand.NewPCG(c.Seed, 0x6167656e74)) // "agent"
	between := func(r [2]int) int { return r[0] + rng.IntN(r[1]-r[0]+1) }
	for _, n := range c.Contexts {
		ctx := s.words(rng, n)
		for range c.Agents {
			sess := Session{Start: time.Duration(rng.Int64N(int64(c.Window) + 1)), System: ctx}
			for k := range c.Steps {
				t := Turn{User: s.words(rng, between(c.StepTokens)), Output: c.Output}
				if k > 0 {
					t.Think = time.Duration(rng.ExpFloat64() * float64(c.Think))
				}
				sess.Turns = append(sess.Turns, t)
			}
			s.Sessions = append(s.Sessions, sess)
		}
	}
	sortSessions(s.Sessions)
	return nil
}

func (s *Script) addOneShots(c OneShotConfig) error {
	if c.Requests < 0 || c.Prefixes < 1 || c.PrefixTokens < 1 || c.TailTokens < 1 || c.Output < 1 || c.Window < 0 {
		return fmt.Errorf("kvbench: invalid one-shot config %+v", c)
	}
	rng := rand.New(rand.NewPCG(c.Seed, 0x6f6e6573686f74)) // "oneshot"
	prefixes := make([]string, c.Prefixes)
	for i := range prefixes {
		prefixes[i] = s.words(rng, c.PrefixTokens)
	}
	for range c.Requests {
		s.Sessions = append(s.Sessions, Session{Start: time.Duration(rng.Int64N(int64(c.Window) + 1)),
			System: prefixes[rng.IntN(len(prefixes))],
			Turns:  []Turn{{User: s.words(rng, c.TailTokens), Output: c.Output}}})
	}
	sortSessions(s.Sessions)
	return nil
}

// sortSessions orders sessions by start; equal starts keep their generation order.
func sortSessions(ss []Session) {
	slices.SortStableFunc(ss, func(a, b Session) int { return cmp.Compare(a.Start, b.Start) })
}

// boundEntry is what the bound needs of one served request: the chained keys of the full
// blocks its server computed (the prompt, then every output but the last, which is
// sampled and never fed back) and its prompt length.
type boundEntry struct {
	keys      []uint64
	promptLen int
}

// chainKeys returns the chained keys of ids' full blocks of blockSize tokens.
func chainKeys(ids []uint32, blockSize int) []uint64 {
	out := make([]uint64, 0, len(ids)/blockSize)
	var prev uint64
	buf := make([]byte, 0, 8+4*blockSize)
	for b := 0; b+blockSize <= len(ids); b += blockSize {
		buf = binary.LittleEndian.AppendUint64(buf[:0], prev)
		for _, t := range ids[b : b+blockSize] {
			buf = binary.LittleEndian.AppendUint32(buf, t)
		}
		h := fnv.New64a()
		h.Write(buf)
		prev = h.Sum64()
		out = append(out, prev)
	}
	return out
}

// infiniteBound fills out.BoundCached: the prompt tokens an infinite prefix cache of
// blockSize-token blocks would have served each request, taking the served requests in
// the order they were sent (rejected and failed ones never reach a cache): the leading
// full blocks any earlier request computed, never the last prompt token (vLLM recomputes
// it).
func infiniteBound(out *ScriptOutput, entries []boundEntry, blockSize int) {
	order := make([]int, 0, len(entries))
	for i := range entries {
		if entries[i].keys != nil || entries[i].promptLen > 0 {
			order = append(order, i)
		}
	}
	slices.SortStableFunc(order, func(a, b int) int { return cmp.Compare(out.Results[a].Start, out.Results[b].Start) })
	seen := map[uint64]struct{}{}
	for _, i := range order {
		e := &entries[i]
		hitable := (e.promptLen - 1) / blockSize
		n := 0
		for n < len(e.keys) && n < hitable {
			if _, ok := seen[e.keys[n]]; !ok {
				break
			}
			n++
		}
		out.BoundCached[i] = n * blockSize
		for _, k := range e.keys {
			seen[k] = struct{}{}
		}
	}
}

package kvbench

import (
	"context"
	"testing"
	"time"

	"github.com/kvrouter/kvrouter/openai"
	"github.com/kvrouter/kvrouter/prompt"
	"github.com/kvrouter/kvrouter/scoring"
	"github.com/kvrouter/kvrouter/tokenizer"
	"github.com/kvrouter/kvrouter/tokenizer/testmodels"
)

// routerPrompts is the router's path for a body: parse, render the chat template,
// tokenize (what testbench/cmd/kvbench wires in sim mode).
type routerPrompts struct{ b *prompt.Builder }

func (r routerPrompts) PromptTokens(path string, body []byte) ([]uint32, error) {
	req, err := openai.Parse(path, body)
	if err != nil {
		return nil, err
	}
	return r.b.PromptTokens(req)
}

func qwen3Chat(t *testing.T) (Tokenizer, RequestTokenizer) {
	t.Helper()
	dir := testmodels.Dir(t, "qwen3")
	tk, err := tokenizer.LoadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	b, err := prompt.LoadDir(dir, prompt.LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return qwen3{tk}, routerPrompts{b}
}

// one is a policy with a single server.
type one struct{}

func (one) Name() string { return "one" }
func (one) Pick(_ *scoring.Request, c []scoring.Endpoint) (scoring.Decision, error) {
	return scoring.Decision{Endpoint: c[0].Address}, nil
}

// Each turn of a chat re-sends the history with the answers the server generated,
// rendered by Qwen3's real chat template: on one server with room for everything, turn
// k+1 finds every full block of turn k's prompt and outputs in the prefix cache, exactly
// as vLLM's cache sees a conversation whose answers re-tokenize to the generated ids.
func TestChatHistoryHitsTheServersCache(t *testing.T) {
	tok, prompts := qwen3Chat(t)
	c := DefaultChatConfig()
	c.Conversations, c.Turns, c.Window = 1, [2]int{4, 4}, 0
	s, err := NewChatScript(c, tok)
	if err != nil {
		t.Fatal(err)
	}
	cfg := DefaultSimConfig()
	cfg.Servers = cfg.Servers[:1]
	cfg.Prompts = prompts
	cfg.Policies = func(PolicyEnv) (Router, error) { return Router{Policy: one{}}, nil }
	out, err := RunScriptSim(context.Background(), cfg, s, "one", 0)
	if err != nil {
		t.Fatal(err)
	}
	for k := 1; k < len(out.Results); k++ {
		prev, r := out.Results[k-1], out.Results[k]
		if r.Err != "" || r.OutputTokens != c.Output {
			t.Fatalf("turn %d: %+v", k, r)
		}
		computed := prev.PromptTokens + prev.OutputTokens - 1 // the last output is sampled, never computed
		if want := computed / 16 * 16; r.CachedTokens != want {
			t.Errorf("turn %d: %d cached tokens, want the %d of turn %d's prompt and answer in full blocks", k, r.CachedTokens, want, k-1)
		}
		if r.Start < prev.End+time.Second {
			t.Errorf("turn %d sent at %v, less than the 1 s minimum think time after turn %d ended at %v", k, r.Start, k-1, prev.End)
		}
	}
	if sum := SummarizeScript(out); sum.BoundCachedRatio < sum.CachedRatio-1e-9 || sum.CachedRatio <= 0 {
		t.Errorf("cached %v, bound %v", sum.CachedRatio, sum.BoundCachedRatio)
	}
}

// The agentic and mixed workloads are deterministic and shaped as configured.
func TestAgentAndMixedScripts(t *testing.T) {
	a := DefaultAgentConfig()
	s, err := NewAgentScript(a, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := s.Requests(), len(a.Contexts)*a.Agents*a.Steps; got != want {
		t.Fatalf("%d agent requests, want %d", got, want)
	}
	contexts := map[string]bool{}
	for _, sess := range s.Sessions {
		contexts[sess.System] = true
	}
	if len(contexts) != len(a.Contexts) {
		t.Fatalf("%d distinct contexts, want %d", len(contexts), len(a.Contexts))
	}
	m := DefaultMixedConfig()
	s1, err := NewMixedScript(m, nil)
	if err != nil {
		t.Fatal(err)
	}
	s2, _ := NewMixedScript(m, nil)
	want := m.Chat.Conversations + len(m.Agent.Contexts)*m.Agent.Agents + m.OneShot.Requests
	if len(s1.Sessions) != want {
		t.Fatalf("%d mixed sessions, want %d", len(s1.Sessions), want)
	}
	for i := range s1.Sessions {
		if s1.Sessions[i].Start != s2.Sessions[i].Start || s1.Sessions[i].System != s2.Sessions[i].System ||
			(i > 0 && s1.Sessions[i].Start < s1.Sessions[i-1].Start) {
			t.Fatalf("session %d differs between builds or is out of order", i)
		}
	}
}

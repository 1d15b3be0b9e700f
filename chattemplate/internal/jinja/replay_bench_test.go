package jinja

import (
	"fmt"
	"testing"
)

// sliceIterations is an IterationCache over a slice by index (no lock, no map), so
// that the benchmark measures the replay itself.
type sliceIterations struct{ its []*Iteration }

func (c *sliceIterations) Iteration(item *Dict, key IterationKey) *Iteration {
	if key.Index < len(c.its) {
		return c.its[key.Index]
	}
	return nil
}

func (c *sliceIterations) StoreIteration(item *Dict, key IterationKey, it *Iteration) {
	for len(c.its) <= key.Index {
		c.its = append(c.its, nil)
	}
	c.its[key.Index] = it
}

// BenchmarkReplayLongConversation renders a 532-message conversation whose every
// iteration is replayed from the cache, as a long conversation's next turn replays its
// history: Qwen3's message loop, trimmed to what it does per message (each assistant
// message's `loop.index0 > ns.last_query_index` re-checked).
func BenchmarkReplayLongConversation(b *testing.B) {
	src := `{%- set ns = namespace(last_query_index=messages|length - 1) %}{%- for message in messages %}{%- if message.role == "user" %}{{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}{%- elif message.role == "assistant" %}{%- if loop.index0 > ns.last_query_index %}{{ 'x' + message.content }}{%- else %}{{- '<|im_start|>' + message.role + '\n' + message.content }}{%- endif %}{{- '<|im_end|>\n' }}{%- endif %}{%- endfor %}`
	tmpl, err := Compile(src, Options{})
	if err != nil {
		b.Fatal(err)
	}
	pool := messages{}
	var names []string
	for i := range 266 {
		names = append(names, fmt.Sprintf("u%d", i), fmt.Sprintf("a%d", i))
	}
	cache := &sliceIterations{}
	vars := MapVars{"messages": pool.list(names...)}
	for range 2 {
		if _, _, err := tmpl.RenderCached(nil, vars, cache); err != nil {
			b.Fatal(err)
		}
	}
	var buf []byte
	for b.Loop() {
		var stats RenderStats
		buf, stats, err = tmpl.RenderCached(buf[:0], vars, cache)
		if err != nil || stats.Reused != 532 {
			b.Fatal(err, stats)
		}
	}
}

package prompt

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/kvrouter/kvrouter/chattemplate"
	"github.com/kvrouter/kvrouter/openai"
	"github.com/kvrouter/kvrouter/tokenizer"
)

// ModelConfig names a served base model and the directory holding its tokenizer files
// (tokenizer.json, tokenizer_config.json and, when the model has one,
// chat_template.jinja): the files vLLM itself loads.
type ModelConfig struct {
	// Name is the served model name (vLLM's --served-model-name).
	Name string `yaml:"name"`
	// Dir is the directory with the tokenizer files.
	Dir string `yaml:"dir"`
	// DefaultChatTemplateKwargs mirrors vLLM's --default-chat-template-kwargs: a JSON
	// object merged under every request's chat_template_kwargs. Empty: none.
	DefaultChatTemplateKwargs string `yaml:"default_chat_template_kwargs"`
}

// Config is the registry's section of the kvrouter configuration.
type Config struct {
	// Models lists the base models whose prompts are tokenized for routing.
	Models []ModelConfig `yaml:"models"`
	// PrefixCacheBytes bounds each model's tokenization prefix cache (see
	// tokenizer.WithPrefixCache): 0 is the default, tokenizer.DefaultPrefixCacheBytes
	// (64 MiB, about 14M tokens of conversation history); negative turns it off.
	PrefixCacheBytes int64 `yaml:"prefix_cache_bytes"`
	// MessageCacheBytes bounds each model's cache of request messages converted for
	// its chat template and their rendered loop iterations (see
	// chattemplate.Options.MessageCacheBytes): 0 is the default,
	// chattemplate.DefaultMessageCacheBytes (64 MiB, about 4M tokens of history);
	// negative turns it off.
	MessageCacheBytes int64 `yaml:"message_cache_bytes"`
}

// maxPrefixCacheBytes is the largest budget Validate accepts for either cache: beyond it a typo
// (bytes meant as KiB) would be mistaken for a budget.
const maxPrefixCacheBytes = 64 << 30

// DefaultConfig returns an empty configuration: no model is tokenized, every request
// is routed by load; the prefix cache has its default budget.
func DefaultConfig() Config { return Config{} }

// prefixCacheOption is the tokenizer option PrefixCacheBytes stands for.
func (c Config) prefixCacheOption() tokenizer.Option {
	switch {
	case c.PrefixCacheBytes < 0:
		return tokenizer.WithPrefixCache(0)
	case c.PrefixCacheBytes == 0:
		return tokenizer.WithPrefixCache(tokenizer.DefaultPrefixCacheBytes)
	}
	return tokenizer.WithPrefixCache(c.PrefixCacheBytes)
}

// Validate reports the first invalid setting.
func (c Config) Validate() error {
	if c.PrefixCacheBytes > maxPrefixCacheBytes {
		return fmt.Errorf("prompt: prefix_cache_bytes %d is above %d (64 GiB)", c.PrefixCacheBytes, int64(maxPrefixCacheBytes))
	}
	if c.MessageCacheBytes > maxPrefixCacheBytes {
		return fmt.Errorf("prompt: message_cache_bytes %d is above %d (64 GiB)", c.MessageCacheBytes, int64(maxPrefixCacheBytes))
	}
	seen := map[string]bool{}
	for i, m := range c.Models {
		switch {
		case m.Name == "":
			return fmt.Errorf("prompt: models[%d]: name is empty", i)
		case seen[m.Name]:
			return fmt.Errorf("prompt: models[%d]: duplicate name %q", i, m.Name)
		case m.Dir == "":
			return fmt.Errorf("prompt: models[%d] (%s): dir is empty", i, m.Name)
		}
		if m.DefaultChatTemplateKwargs != "" {
			var obj map[string]json.RawMessage
			if err := json.Unmarshal([]byte(m.DefaultChatTemplateKwargs), &obj); err != nil {
				return fmt.Errorf("prompt: models[%d] (%s): default_chat_template_kwargs must be a JSON object: %w", i, m.Name, err)
			}
		}
		seen[m.Name] = true
	}
	return nil
}

// LoadError reports a model whose files could not be loaded.
type LoadError struct {
	Model string
	Err   error
}

// Error implements error.
func (e *LoadError) Error() string { return fmt.Sprintf("prompt: load model %q: %v", e.Model, e.Err) }

// Unwrap returns the underlying error.
func (e *LoadError) Unwrap() error { return e.Err }

// LoadOptions tune LoadDir.
type LoadOptions struct {
	// DefaultChatTemplateKwargs: see ModelConfig.
	DefaultChatTemplateKwargs json.RawMessage
	// Now is the clock of the templates' strftime_now (nil: time.Now).
	Now func() time.Time
	// Tokenizer options (prefix cache budget, metrics).
	Tokenizer []tokenizer.Option
	// MessageCacheBytes is chattemplate.Options.MessageCacheBytes (0: default, <0: off).
	MessageCacheBytes int64
	// Metrics may be nil.
	Metrics *Metrics
	// TemplateMetrics, when not nil, reports the template's message cache under the
	// label Model.
	TemplateMetrics *chattemplate.Metrics
	// Model labels TemplateMetrics.
	Model string
}

// LoadDir loads a model's tokenizer and chat template from dir and returns its
// Builder. A model without a chat template gets a Builder that serves completions
// only. A tokenizer kind that is not implemented yields *UnsupportedError with
// ReasonNoTokenizer.
func LoadDir(dir string, o LoadOptions) (*Builder, error) {
	tok, err := tokenizer.LoadDir(dir, o.Tokenizer...)
	if err != nil {
		var unsupported *tokenizer.UnsupportedError
		if errors.As(err, &unsupported) {
			return nil, &UnsupportedError{Reason: ReasonNoTokenizer, Err: err}
		}
		return nil, err
	}
	raw, err := os.ReadFile(filepath.Join(dir, "tokenizer_config.json"))
	if err != nil {
		return nil, fmt.Errorf("prompt: %w", err)
	}
	cfg, err := chattemplate.ParseTokenizerConfig(raw)
	if err != nil {
		return nil, err
	}
	if src, err := os.ReadFile(filepath.Join(dir, "chat_template.jinja")); err == nil {
		cfg.Template = string(src)
	} else if !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("prompt: %w", err)
	}
	tmpl, err := chattemplate.CompileConfig(cfg, chattemplate.Options{
		DefaultKwargs:     o.DefaultChatTemplateKwargs,
		Now:               o.Now,
		MessageCacheBytes: o.MessageCacheBytes,
		Metrics:           o.TemplateMetrics,
		Model:             o.Model,
	})
	if err != nil && !errors.Is(err, chattemplate.ErrNoTemplate) {
		return nil, err
	}
	return New(tok, tmpl, o.Metrics), nil
}

// Registry serves prompt ids for several base models, loading each model's files once
// on first use. It is safe for concurrent use.
type Registry struct {
	models map[string]*slot
	cache  tokenizer.Option
	msgs   int64 // Config.MessageCacheBytes
	opts   RegistryOptions
}

// RegistryOptions are the Registry's collaborators; all may be nil.
type RegistryOptions struct {
	// Metrics counts unsupported requests and failures.
	Metrics *Metrics
	// TokenizerMetrics reports each model's tokenizer prefix cache, labelled by model.
	TokenizerMetrics *tokenizer.Metrics
	// TemplateMetrics reports each model's chat-template message cache, labelled by
	// model.
	TemplateMetrics *chattemplate.Metrics
	// Now is the templates' strftime_now clock (nil: time.Now).
	Now func() time.Time
}

type slot struct {
	cfg     ModelConfig
	once    sync.Once
	builder *Builder
	err     error
}

// NewRegistry validates cfg and returns a Registry; it loads nothing yet (see Load
// and LoadAll).
func NewRegistry(cfg Config, o RegistryOptions) (*Registry, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	r := &Registry{models: make(map[string]*slot, len(cfg.Models)), cache: cfg.prefixCacheOption(), msgs: cfg.MessageCacheBytes, opts: o}
	for _, m := range cfg.Models {
		r.models[m.Name] = &slot{cfg: m}
	}
	return r, nil
}

// Load returns the Builder of a configured model, loading its files on the first call.
// A failed load is remembered: later calls return the same error without touching the
// file system again.
func (r *Registry) Load(model string) (*Builder, error) {
	s, ok := r.models[model]
	if !ok {
		return nil, &UnknownModelError{Model: model}
	}
	s.once.Do(func() {
		var defaults json.RawMessage
		if s.cfg.DefaultChatTemplateKwargs != "" {
			defaults = json.RawMessage(s.cfg.DefaultChatTemplateKwargs)
		}
		tokOpts := []tokenizer.Option{r.cache}
		if r.opts.TokenizerMetrics != nil {
			tokOpts = append(tokOpts, tokenizer.WithMetrics(r.opts.TokenizerMetrics, model))
		}
		b, err := LoadDir(s.cfg.Dir, LoadOptions{
			DefaultChatTemplateKwargs: defaults,
			Now:                       r.opts.Now,
			Tokenizer:                 tokOpts,
			MessageCacheBytes:         r.msgs,
			Metrics:                   r.opts.Metrics,
			TemplateMetrics:           r.opts.TemplateMetrics,
			Model:                     model,
		})
		var unsupported *UnsupportedError
		switch {
		case errors.As(err, &unsupported):
			s.err = err
		case err != nil:
			s.err = &LoadError{Model: model, Err: err}
		}
		s.builder = b
	})
	return s.builder, s.err
}

// LoadAll loads every configured model now (for startup) and returns the load errors
// joined.
func (r *Registry) LoadAll() error {
	var errs []error
	for name := range r.models {
		if _, err := r.Load(name); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// PromptTokens returns vLLM's prompt ids for req, served by baseModel (the base model
// of a LoRA adapter shares its tokenizer). Errors: *UnknownModelError, *LoadError,
// *UnsupportedError, or one wrapping ErrBadRequest; see Builder.PromptTokens.
func (r *Registry) PromptTokens(req *openai.Request, baseModel string) ([]uint32, error) {
	b, err := r.Load(baseModel)
	if err != nil {
		r.opts.Metrics.observe(err)
		return nil, err
	}
	return b.PromptTokens(req)
}

// AppendPromptTokens is PromptTokens appending to dst, a buffer the caller may reuse
// across requests, at most maxTokens ids (0: all; see Builder.AppendPromptTokens).
func (r *Registry) AppendPromptTokens(dst []uint32, req *openai.Request, baseModel string, maxTokens int) ([]uint32, error) {
	return r.AppendPromptTokensPrefix(dst, req, baseModel, maxTokens, nil)
}

// AppendPromptTokensPrefix is AppendPromptTokens filling p as
// Builder.AppendPromptTokensPrefix does (p is emptied on error).
func (r *Registry) AppendPromptTokensPrefix(dst []uint32, req *openai.Request, baseModel string, maxTokens int, p *tokenizer.Prefix) ([]uint32, error) {
	b, err := r.Load(baseModel)
	if err != nil {
		if p != nil {
			p.Reset()
		}
		r.opts.Metrics.observe(err)
		return nil, err
	}
	return b.AppendPromptTokensPrefix(dst, req, maxTokens, p)
}

package prompt

import "github.com/kvrouter/kvrouter/chattemplate"

// ChatTemplateRefusal reports why kvrouter's Jinja engine refuses the model's chat
// template (a construct it does not implement, named in the error), or nil when it
// renders it or the model has none. The refused template's chat requests are routed by
// load and counted as unsupported (chattemplate.ReasonTemplateRefused); completions
// requests are unaffected.
func (b *Builder) ChatTemplateRefusal() *chattemplate.RefusedError {
	if b == nil || b.tmpl == nil {
		return nil
	}
	return b.tmpl.Refusal()
}

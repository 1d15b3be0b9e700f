package prompt

// ChatTemplateEngine names the engine that renders the model's chat template
// (chattemplate.EngineNative or chattemplate.EngineGonja) and, for gonja, why kvrouter's
// own engine refused the template. Both are empty for a model without a chat template.
func (b *Builder) ChatTemplateEngine() (engine, fallbackReason string) {
	if b == nil || b.tmpl == nil {
		return "", ""
	}
	return b.tmpl.Engine(), b.tmpl.EngineFallbackReason()
}

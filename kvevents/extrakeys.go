package kvevents

// CacheSalt returns the cache_salt vLLM folded into the hash of this event's first block,
// read from ExtraKeys; ok is false when there is none to read.
//
// vLLM adds cache_salt to the extra keys of a request's first block only
// (start_token_idx == 0), after the LoRA name and the multimodal keys:
// extra_keys[0] = (lora_name?, mm keys..., cache_salt?, prompt_embeds_digest?). So only a
// BlockStored without a parent can carry it. The LoRA name is skipped when it equals
// LoRAName, multimodal keys (identifier, offset) pairs are skipped, and the salt is the
// one string left. vLLM versions that listed bare multimodal identifiers (strings) make a
// multimodal first block ambiguous: with several strings left ok is false, and a lone
// identifier without a salt is reported as the salt. Either way the error is a key that
// matches no request (a cache miss), never a false hit.
func (s *BlockStored) CacheSalt() (salt string, ok bool) {
	if s.HasParent || len(s.ExtraKeys) == 0 {
		return "", false
	}
	d := decoder{b: s.ExtraKeys}
	n, isArray, err := d.arrayLen()
	if err != nil || !isArray || n == 0 || d.nextNil() {
		return "", false
	}
	m, isArray, err := d.arrayLen()
	if err != nil || !isArray {
		return "", false
	}
	var found []byte
	strs := 0
	for i := range m {
		c, err := d.peek()
		if err != nil {
			return "", false
		}
		isStr := c&0xe0 == 0xa0 || c == 0xd9 || c == 0xda || c == 0xdb
		if !isStr {
			if c >= 0xc4 && c <= 0xc6 { // bin: the prompt-embeds digest comes last
				break
			}
			if err := d.skip(1); err != nil {
				return "", false
			}
			continue
		}
		v, err := d.str()
		if err != nil {
			return "", false
		}
		if i == 0 && s.LoRAName != "" && string(v) == s.LoRAName {
			continue
		}
		found = v
		strs++
	}
	if strs != 1 {
		return "", false
	}
	return string(found), true
}

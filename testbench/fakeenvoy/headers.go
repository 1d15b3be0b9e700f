package fakeenvoy

import (
	"strings"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
)

// Header is one HTTP header; keys are lower case, as Envoy sends them.
type Header struct{ Key, Value string }

// Headers is an ordered header list that may repeat keys.
type Headers []Header

// Get returns the first value of key and whether it is present.
func (h Headers) Get(key string) (string, bool) {
	key = strings.ToLower(key)
	for _, kv := range h {
		if kv.Key == key {
			return kv.Value, true
		}
	}
	return "", false
}

// Values returns every value of key.
func (h Headers) Values(key string) []string {
	key = strings.ToLower(key)
	var out []string
	for _, kv := range h {
		if kv.Key == key {
			out = append(out, kv.Value)
		}
	}
	return out
}

// Clone returns a copy of h.
func (h Headers) Clone() Headers { return append(Headers(nil), h...) }

func (h Headers) without(key string) Headers {
	out := h[:0:0]
	for _, kv := range h {
		if kv.Key != key {
			out = append(out, kv)
		}
	}
	return out
}

func (h Headers) toProto() *corev3.HeaderMap {
	m := &corev3.HeaderMap{Headers: make([]*corev3.HeaderValue, len(h))}
	for i, kv := range h {
		// Envoy sends values as raw_value.
		m.Headers[i] = &corev3.HeaderValue{Key: strings.ToLower(kv.Key), RawValue: []byte(kv.Value)}
	}
	return m
}

// protectedHeader reports headers Envoy refuses to let an ext_proc server change by
// default (mutation_rules unset).
func protectedHeader(key string) bool {
	switch key {
	case "host", ":authority", ":scheme", ":method", ":path":
		return key != ":path" // :path may be changed
	}
	return strings.HasPrefix(key, "x-envoy-")
}

// apply applies a header mutation as Envoy does: removals first, then sets honouring
// each append action. Mutating a protected header is an error.
func (h Headers) apply(m *extprocv3.HeaderMutation) (Headers, error) {
	if m == nil {
		return h, nil
	}
	for _, k := range m.GetRemoveHeaders() {
		k = strings.ToLower(k)
		if protectedHeader(k) {
			return h, orderErrorf("removal of protected header %q", k)
		}
		h = h.without(k)
	}
	for _, o := range m.GetSetHeaders() {
		k := strings.ToLower(o.GetHeader().GetKey())
		if protectedHeader(k) {
			return h, orderErrorf("mutation of protected header %q", k)
		}
		v := o.GetHeader().GetValue()
		if raw := o.GetHeader().GetRawValue(); len(raw) > 0 {
			v = string(raw)
		}
		_, exists := h.Get(k)
		switch o.GetAppendAction() {
		case corev3.HeaderValueOption_APPEND_IF_EXISTS_OR_ADD:
			//lint:ignore SA1019 Envoy still honours the deprecated append=false, so the fake does too
			if o.GetAppend() != nil && !o.GetAppend().GetValue() {
				h = append(h.without(k), Header{k, v})
			} else {
				h = append(h, Header{k, v})
			}
		case corev3.HeaderValueOption_ADD_IF_ABSENT:
			if !exists {
				h = append(h, Header{k, v})
			}
		case corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD:
			h = append(h.without(k), Header{k, v})
		case corev3.HeaderValueOption_OVERWRITE_IF_EXISTS:
			if exists {
				h = append(h.without(k), Header{k, v})
			}
		}
	}
	return h, nil
}

package extproc

import (
	"bytes"
	"encoding/json"
	"strconv"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"

	"github.com/kvrouter/kvrouter/rewrite"
)

// maxModelName bounds the model names the router keeps from a request's
// x-gateway-model-name-rewrite header; a longer value rewrites nothing.
const maxModelName = 256

// Sources of a rewrite not applied; they label kvrouter_model_rewrites_kept_total.
const (
	keptRule   = "rule"   // an InferenceModelRewrite rule
	keptHeader = "header" // the x-gateway-model-name-rewrite header
)

// modelRewrite is what a request's model is rewritten to, if anything.
type modelRewrite struct {
	target string // the model the request is routed and forwarded for: its own when nothing rewrites it
	from   string // the request's own model
	rule   string // the InferenceModelRewrite whose rule chose target; "" for the header or none
	exact  bool   // that rule names the model (false: a generic rule)
	kept   string // the source of a rewrite not applied (keptRule, keptHeader), or ""
}

// rewriteModel decides the model the request is routed and forwarded for, before any
// endpoint is scored, as the Inference Extension's picker does: the InferenceModelRewrite
// rule for model (rt.rewrites), a weighted choice among its targets, else the
// x-gateway-model-name-rewrite header; the rule wins over the header. The choice is among
// the targets the fleet serves, so that the endpoint then picked serves the model it is
// sent; when it serves none of them but serves model, the request keeps model (a rewrite
// never makes a request fail); when it serves neither (say, before the fleet knows its
// models), the rewrite is applied as written.
func (s *Server) rewriteModel(rt *routing, model, header string) modelRewrite {
	r := modelRewrite{target: model, from: model}
	if model == "" {
		return r
	}
	if rt.rewrites != nil {
		if d, ok := rt.rewrites.Lookup(model); ok {
			t, ok := rewrite.Choose(d.Targets, s.serves, s.intn)
			if !ok {
				if s.serves(model) {
					r.kept = keptRule
					return r
				}
				t, _ = rewrite.Choose(d.Targets, nil, s.intn)
			}
			r.target, r.rule, r.exact = t, d.Name, d.Exact
			return r
		}
	}
	if h := header; h != "" && h != model {
		if !s.serves(h) && s.serves(model) {
			r.kept = keptHeader
			return r
		}
		r.target = h
	}
	return r
}

// modelServer is implemented by fleets that tell whether they serve a model without
// building its candidates (fleet.Fleet does).
type modelServer interface {
	Serves(model string) bool
}

// Rewrite returns the model a request for model, with header as its
// x-gateway-model-name-rewrite header ("" for none), would be routed and forwarded for
// now, and the name of the InferenceModelRewrite whose rule chose it ("" when the header
// did or nothing rewrites it: target is then model or header). A weighted rule draws
// anew at each call. It changes nothing and counts nothing, for POST /debug/route.
func (s *Server) Rewrite(model, header string) (target, rule string) {
	r := s.rewriteModel(s.routing.Load(), model, header)
	return r.target, r.rule
}

// serves reports whether the fleet knows an endpoint serving model (a base model or a
// LoRA adapter), eligible now or not: Candidates' ok.
func (s *Server) serves(model string) bool {
	if s.servesApp != nil {
		return s.servesApp.Serves(model)
	}
	_, _, _, ok, buf := s.candidates(model)
	s.putCandidates(buf)
	return ok
}

// rewriteReply is the decision reply of a request whose model was rewritten to body's: it
// sets content-length to the new body's length when the request has one (BUFFERED
// requires it to match; in the streamed modes Envoy drops the header unless
// allow_content_length_header is set, and then needs it right; a request without one,
// chunked, stays without) and, in a body reply, carries the new body. In FULL_DUPLEX_STREAMED the
// headers reply is this one and the new body follows as streamed chunks. The parts that
// depend only on dest and why (the destination header, the metadata) are those of the
// decision reply the stream would send otherwise, shared and never modified.
func (st *stream) rewriteReply(dest, why string, kind replyKind, body []byte) *extprocv3.ProcessingResponse {
	base := st.decisionReply(dest, why, kind)
	var bm *extprocv3.HeaderMutation
	if kind == replyHeaders {
		bm = base.GetRequestHeaders().GetResponse().GetHeaderMutation()
	} else {
		bm = base.GetRequestBody().GetResponse().GetHeaderMutation()
	}
	set := make([]*corev3.HeaderValueOption, 0, len(bm.GetSetHeaders())+1)
	set = append(set, bm.GetSetHeaders()...)
	if st.hasLength {
		set = append(set, setHeader("content-length", strconv.Itoa(len(body))))
	}
	common := &extprocv3.CommonResponse{ClearRouteCache: true,
		HeaderMutation: &extprocv3.HeaderMutation{SetHeaders: set, RemoveHeaders: bm.GetRemoveHeaders()}}
	r := &extprocv3.ProcessingResponse{DynamicMetadata: base.GetDynamicMetadata()}
	if kind == replyHeaders {
		r.Response = &extprocv3.ProcessingResponse_RequestHeaders{RequestHeaders: &extprocv3.HeadersResponse{Response: common}}
	} else {
		common.BodyMutation = &extprocv3.BodyMutation{Mutation: &extprocv3.BodyMutation_Body{Body: body}}
		r.Response = &extprocv3.ProcessingResponse_RequestBody{RequestBody: &extprocv3.BodyResponse{Response: common}}
	}
	return r
}

// responseModel names the request's own model again in the response of a request whose
// model was rewritten, as the Inference Extension's picker does, so that a client reads
// back the model it asked for: `"model":"<target>"` (also with a space after the colon,
// as Python's json writes it) becomes `"model":"<from>"`. It edits the response body as
// it streams through (FULL_DUPLEX_STREAMED); a name split between two chunks is held
// back until the next one shows whether it completes, so at most a pattern's length
// (bounded by the model names' length) is ever held, and all of it at the body's end.
type responseModel struct {
	pats, repls [2][]byte
	held        []byte
}

func newResponseModel(target, from string) *responseModel {
	t, f := jsonString(target), jsonString(from)
	r := &responseModel{}
	for i, sep := range []string{":", ": "} {
		r.pats[i] = append([]byte(`"model"`+sep), t...)
		r.repls[i] = append([]byte(`"model"`+sep), f...)
	}
	return r
}

// jsonString is s as a JSON string, as a model server writes it (no HTML escapes).
func jsonString(s string) []byte {
	var b bytes.Buffer
	e := json.NewEncoder(&b)
	e.SetEscapeHTML(false)
	_ = e.Encode(s) // a string always encodes
	return bytes.TrimSuffix(b.Bytes(), []byte("\n"))
}

// flush returns what edit held back, for a body that trailers end.
func (r *responseModel) flush() []byte {
	b := r.held
	r.held = nil
	return b
}

// edit returns chunk with the names replaced, less the end it holds back when the body
// goes on (eos false) and that end may begin a name the next chunk completes. Only bytes
// past the last name replaced are ever held, so the chunks read as one edit of the whole
// body would (FuzzResponseModel).
func (r *responseModel) edit(chunk []byte, eos bool) []byte {
	b := chunk
	if len(r.held) > 0 {
		b = append(r.held, chunk...)
	}
	r.held = nil
	var out []byte // nil until a name is replaced
	scanned := 0
	for {
		j, k := r.next(b[scanned:])
		if j < 0 {
			break
		}
		out = append(append(out, b[scanned:scanned+j]...), r.repls[k]...)
		scanned += j + len(r.pats[k])
	}
	end := len(b)
	if !eos {
		// The earliest start, within a pattern's length of the end, of an end of b that
		// begins a pattern: a name cut there is held whole.
		longest := max(len(r.pats[0]), len(r.pats[1]))
		for i := max(scanned, len(b)-longest+1); i < len(b); i++ {
			if b[i] == '"' && (bytes.HasPrefix(r.pats[0], b[i:]) || bytes.HasPrefix(r.pats[1], b[i:])) {
				end = i
				r.held = append([]byte(nil), b[i:]...)
				break
			}
		}
	}
	if out == nil {
		return b[:end]
	}
	return append(out, b[scanned:end]...)
}

// next returns the index in b of the earliest name to replace and its pattern, or -1.
func (r *responseModel) next(b []byte) (int, int) {
	j, k := bytes.Index(b, r.pats[0]), 0
	if j1 := bytes.Index(b, r.pats[1]); j1 >= 0 && (j < 0 || j1 < j) {
		j, k = j1, 1
	}
	return j, k
}

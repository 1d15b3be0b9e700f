package gateway

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"go.uber.org/zap"

	"github.com/kvrouter/kvrouter/epp"
	"github.com/kvrouter/kvrouter/extproc/envoytest"
)

const (
	// DefaultMaxRequestBytes bounds the request body the gateway buffers.
	DefaultMaxRequestBytes = 64 << 20
	chunkBytes             = 32 << 10
)

// Config configures a Gateway.
type Config struct {
	// Upstreams is the allowlist of "ip:port" the gateway may proxy to.
	Upstreams []string
	// MaxRequestBytes bounds request bodies (413 beyond, as Envoy's buffer limit); 0 means
	// DefaultMaxRequestBytes.
	MaxRequestBytes int64
	// ExposeServed keeps kvrouter's x-gateway-destination-endpoint-served response header
	// (a pod's ip:port) for the client, as benchmarks that count servers per prefix need.
	// By default every x-gateway-destination-* header is removed on the way out, as the
	// shipped Envoy configurations do.
	ExposeServed bool
}

// Gateway is the HTTP handler. Create it with New.
type Gateway struct {
	client    extprocv3.ExternalProcessorClient
	allow     map[string]bool
	maxBody   int64
	expose    bool
	transport http.RoundTripper
	log       *zap.Logger
}

// New returns a Gateway calling kvrouter through client and proxying with transport (nil
// means http.DefaultTransport). log may be nil.
func New(client extprocv3.ExternalProcessorClient, cfg Config, transport http.RoundTripper, log *zap.Logger) *Gateway {
	g := &Gateway{client: client, allow: map[string]bool{}, maxBody: cfg.MaxRequestBytes, expose: cfg.ExposeServed, transport: transport, log: log}
	for _, u := range cfg.Upstreams {
		g.allow[u] = true
	}
	if g.maxBody <= 0 {
		g.maxBody = DefaultMaxRequestBytes
	}
	if g.transport == nil {
		g.transport = http.DefaultTransport
	}
	if g.log == nil {
		g.log = zap.NewNop()
	}
	return g
}

// hopByHop headers are not forwarded (RFC 9110 section 7.6.1).
var hopByHop = map[string]bool{"connection": true, "keep-alive": true, "proxy-connection": true,
	"transfer-encoding": true, "te": true, "trailer": true, "upgrade": true}

func errorJSON(w http.ResponseWriter, code int, msg string) {
	w.Header().Set("content-type", "application/json")
	w.WriteHeader(code)
	fmt.Fprintf(w, `{"error":{"message":%q,"type":"gateway_error","param":null,"code":%d}}`, "devgateway: "+msg, code)
}

// ServeHTTP proxies one request.
func (g *Gateway) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	// 1. Strip client-sent router headers before anything else (the filter ahead of ext_proc).
	hdrs := envoytest.Headers{{Key: ":method", Value: r.Method}, {Key: ":path", Value: r.URL.RequestURI()},
		{Key: ":authority", Value: r.Host}, {Key: ":scheme", Value: "http"}}
	for k, vs := range r.Header {
		k = strings.ToLower(k)
		if strings.HasPrefix(k, epp.HeaderPrefix) || hopByHop[k] {
			continue
		}
		for _, v := range vs {
			hdrs = append(hdrs, envoytest.Header{Key: k, Value: v})
		}
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, g.maxBody+1))
	if err != nil {
		errorJSON(w, http.StatusBadRequest, "reading request body: "+err.Error())
		return
	}
	if int64(len(body)) > g.maxBody {
		errorJSON(w, http.StatusRequestEntityTooLarge, "request body too large")
		return
	}
	var chunks [][]byte
	for len(body) > 0 {
		n := min(len(body), chunkBytes)
		chunks = append(chunks, body[:n])
		body = body[n:]
	}
	var trailers envoytest.Headers
	// 2. The request through kvrouter, as Envoy's filter sends it.
	x, err := envoytest.Start(r.Context(), g.client, envoytest.FullDuplex())
	if err != nil {
		g.fail(w, err)
		return
	}
	defer x.Cancel() // no-op once Close returned; ends the stream on every early return
	res, err := x.Request(envoytest.Request{Headers: hdrs, Body: chunks, Trailers: trailers})
	if err != nil {
		g.fail(w, err)
		return
	}
	if im := res.Immediate; im != nil {
		for _, o := range im.GetHeaders().GetSetHeaders() {
			v := o.GetHeader().GetValue()
			if raw := o.GetHeader().GetRawValue(); len(raw) > 0 {
				v = string(raw)
			}
			w.Header().Set(o.GetHeader().GetKey(), v)
		}
		code := int(im.GetStatus().GetCode())
		if code == 0 {
			code = http.StatusOK
		}
		w.WriteHeader(code)
		w.Write(im.GetBody())
		x.Close()
		return
	}
	// 3. ORIGINAL_DST by header: the first address, only if allowed.
	dest, _ := res.Headers.Get(epp.HeaderDestination)
	dest, _, _ = strings.Cut(dest, ",")
	dest = strings.TrimSpace(dest)
	if !g.allow[dest] {
		errorJSON(w, http.StatusServiceUnavailable, fmt.Sprintf("destination %q is not an allowed upstream", dest))
		return
	}
	up, err := g.upstreamRequest(r, res, dest)
	if err != nil {
		errorJSON(w, http.StatusBadRequest, err.Error())
		return
	}
	resp, err := g.transport.RoundTrip(up)
	if err != nil {
		errorJSON(w, http.StatusServiceUnavailable, "upstream connect error: "+err.Error())
		return
	}
	defer resp.Body.Close()
	g.respond(w, x, resp, dest)
}

func (g *Gateway) fail(w http.ResponseWriter, err error) {
	g.log.Warn("ext_proc failed", zap.Error(err))
	var oe *envoytest.OrderError
	if errors.As(err, &oe) {
		errorJSON(w, http.StatusInternalServerError, "ext_proc protocol error: "+err.Error())
		return
	}
	// Fail closed, as Envoy with failure_mode_allow false.
	errorJSON(w, http.StatusInternalServerError, "ext_proc unavailable: "+err.Error())
}

func (g *Gateway) upstreamRequest(r *http.Request, res *envoytest.RequestResult, dest string) (*http.Request, error) {
	method, _ := res.Headers.Get(":method")
	path, _ := res.Headers.Get(":path")
	up, err := http.NewRequestWithContext(r.Context(), method, "http://"+dest+path, bytes.NewReader(res.Body))
	if err != nil {
		return nil, fmt.Errorf("building upstream request: %w", err)
	}
	for _, kv := range res.Headers {
		if strings.HasPrefix(kv.Key, ":") || kv.Key == "content-length" || kv.Key == "host" {
			continue
		}
		up.Header.Add(kv.Key, kv.Value)
	}
	if a, ok := res.Headers.Get(":authority"); ok {
		up.Host = a
	}
	up.ContentLength = int64(len(res.Body))
	return up, nil
}

// respond sends the upstream response through the filter and streams it to the client.
func (g *Gateway) respond(w http.ResponseWriter, x *envoytest.Exchange, resp *http.Response, dest string) {
	h := envoytest.Headers{{Key: ":status", Value: strconv.Itoa(resp.StatusCode)}}
	for k, vs := range resp.Header {
		k = strings.ToLower(k)
		if hopByHop[k] {
			continue
		}
		for _, v := range vs {
			h = append(h, envoytest.Header{Key: k, Value: v})
		}
	}
	noBody := resp.ContentLength == 0 && len(resp.Trailer) == 0
	out, err := x.ResponseHeaders(h, noBody, envoytest.ServedMetadata(dest))
	if err != nil {
		g.fail(w, err)
		return
	}
	code := resp.StatusCode
	for _, kv := range out {
		if kv.Key == ":status" {
			code, _ = strconv.Atoi(kv.Value)
			continue
		}
		if kv.Key == "content-length" {
			continue // the body may be re-chunked; let net/http frame it
		}
		if strings.HasPrefix(kv.Key, epp.HeaderPrefix) && !(g.expose && kv.Key == epp.HeaderServed) {
			continue // protocol between kvrouter and the gateway
		}
		w.Header().Add(kv.Key, kv.Value)
	}
	for k := range resp.Trailer {
		w.Header().Add("Trailer", k)
	}
	w.WriteHeader(code)
	if noBody {
		x.Close()
		return
	}
	flusher, _ := w.(http.Flusher)
	pumpErr := make(chan error, 1)
	go func() { pumpErr <- pump(x, resp) }()
	for {
		chunk, eos, err := x.ReadResponseBody()
		if err != nil {
			g.log.Warn("ext_proc response failed", zap.Error(err))
			return // the deferred Cancel ends the stream; the client sees a truncated body
		}
		if len(chunk) > 0 {
			if _, err := w.Write(chunk); err != nil {
				return
			}
			if flusher != nil {
				flusher.Flush()
			}
		}
		if eos {
			break
		}
	}
	if err := <-pumpErr; err != nil {
		return
	}
	if len(resp.Trailer) > 0 {
		t, err := x.ReadResponseTrailers()
		if err != nil {
			return
		}
		for _, kv := range t {
			w.Header().Set(http.TrailerPrefix+kv.Key, kv.Value)
		}
	}
	x.Close()
}

// pump copies the upstream body into the filter as it arrives.
func pump(x *envoytest.Exchange, resp *http.Response) error {
	buf := make([]byte, chunkBytes)
	for {
		n, err := resp.Body.Read(buf)
		if n > 0 {
			if serr := x.ResponseBody(bytes.Clone(buf[:n]), false); serr != nil {
				return serr
			}
		}
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return err
		}
	}
	if len(resp.Trailer) > 0 {
		t := envoytest.Headers{}
		for k, vs := range resp.Trailer {
			for _, v := range vs {
				t = append(t, envoytest.Header{Key: strings.ToLower(k), Value: v})
			}
		}
		return x.ResponseTrailers(t)
	}
	return x.ResponseBody(nil, true)
}

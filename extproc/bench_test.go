package extproc_test

import (
	"context"
	"flag"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/kvrouter/kvrouter/extproc"
	"github.com/kvrouter/kvrouter/internal/cputime"
	"github.com/kvrouter/kvrouter/scoring"
	"github.com/kvrouter/kvrouter/testbench/fakeenvoy"
)

var (
	loadBench  = flag.Bool("load", false, "run BenchmarkLoad and BenchmarkSideBySide")
	serverOpts = flag.String("serveropts", "", "BenchmarkRoundTrip and BenchmarkLoad: comma-separated gRPC server options to try: "+
		"workers (NumStreamWorkers=GOMAXPROCS), window (1 MiB initial stream and connection windows), shared (SharedWriteBuffer), "+
		"bufs (64 KiB read and write buffers), recommended (extproc.ServerOptions)")
)

// benchServerOptions parses -serveropts.
func benchServerOptions(b *testing.B) []grpc.ServerOption {
	var out []grpc.ServerOption
	for _, o := range strings.Split(*serverOpts, ",") {
		switch o {
		case "":
		case "workers":
			out = append(out, grpc.NumStreamWorkers(uint32(runtime.GOMAXPROCS(0))))
		case "window":
			out = append(out, grpc.InitialWindowSize(1<<20), grpc.InitialConnWindowSize(1<<20))
		case "shared":
			//lint:ignore SA1019 this case measures the option grpc-go now enables by default
			out = append(out, grpc.SharedWriteBuffer(true))
		case "bufs":
			out = append(out, grpc.ReadBufferSize(64<<10), grpc.WriteBufferSize(64<<10))
		case "recommended":
			out = append(out, extproc.ServerOptions()...)
		default:
			b.Fatalf("unknown -serveropts %q", o)
		}
	}
	return out
}

// benchFleet serves one model on n endpoints; Candidates copies the endpoint list with
// current in-flight counts, as a registry does.
type benchFleet struct {
	mu       sync.Mutex
	eps      []scoring.Endpoint
	inflight map[string]int
}

func newBenchFleet(n int) *benchFleet {
	f := &benchFleet{inflight: map[string]int{}}
	for i := range n {
		f.eps = append(f.eps, scoring.Endpoint{Address: fmt.Sprintf("10.1.%d.%d:8000", i/250, i%250+1),
			Metrics: scoring.Metrics{Valid: true, Running: i % 3, Waiting: i % 2, KVCacheUsage: float64(i%10) / 10}})
	}
	return f
}

func (f *benchFleet) Candidates(string) ([]scoring.Endpoint, string, string, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make([]scoring.Endpoint, len(f.eps))
	copy(out, f.eps)
	for i := range out {
		out[i].InFlight = f.inflight[out[i].Address]
	}
	return out, "model", "", true
}

func (f *benchFleet) Begin(a string) { f.mu.Lock(); f.inflight[a]++; f.mu.Unlock() }
func (f *benchFleet) End(a string)   { f.mu.Lock(); f.inflight[a]--; f.mu.Unlock() }

// chat2400 is a chat body of about 2,400 tokens (~10 KB).
func chat2400() []byte {
	words := strings.Repeat("the quick brown fox jumps over the lazy dog. ", 210)
	return []byte(`{"model":"model","messages":[{"role":"system","content":"You are a helpful assistant."},` +
		`{"role":"user","content":"` + words + `"}],"stream":true,"stream_options":{"include_usage":true},"max_tokens":128}`)
}

func benchServer(b *testing.B, n int, tcp bool) *fakeenvoy.Conn {
	srv := extproc.New(extproc.Options{Policy: scoring.NewLeastLoad(), Fleet: newBenchFleet(n)})
	dial := fakeenvoy.Bufconn
	if tcp {
		dial = fakeenvoy.TCP
	}
	conn, err := dial(srv.Register, benchServerOptions(b)...)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(conn.Close)
	return conn
}

// BenchmarkRoundTrip is one full ext_proc exchange as Envoy makes it in
// FULL_DUPLEX_STREAMED mode: request headers, a ~10 KB chat body in one chunk, the
// decision and body back, an empty 200 response, close.
func BenchmarkRoundTrip(b *testing.B) {
	body := chat2400()
	req := fakeenvoy.Request{Headers: postHeaders(), Body: [][]byte{body}}
	for _, transport := range []string{"bufconn", "tcp"} {
		for _, n := range []int{6, 64, 512} {
			b.Run(fmt.Sprintf("%s/endpoints=%d", transport, n), func(b *testing.B) {
				conn := benchServer(b, n, transport == "tcp")
				ctx := context.Background()
				b.SetBytes(int64(len(body)))
				b.ReportAllocs()
				cpu := cputime.Process()
				for b.Loop() {
					x, err := fakeenvoy.Start(ctx, conn.Client, fakeenvoy.FullDuplex())
					if err != nil {
						b.Fatal(err)
					}
					res, err := x.Request(req)
					if err != nil || res.Immediate != nil {
						b.Fatal(err, res)
					}
					if _, err := x.Response(200, nil, nil, nil, nil); err != nil {
						b.Fatal(err)
					}
					if err := x.Close(); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(float64(cputime.Process()-cpu)/float64(b.N)/1e3, "cpu-us/op")
			})
		}
	}
}

// BenchmarkLoad runs fakeenvoy.Load open-loop over loopback TCP for 3 s at 250 and 1,000
// exchanges/s and reports p50/p99 of the request phase as Envoy would see it. Run it with
// -benchtime=1x and -args -load (it takes ~20 s, so `make bench` skips it); on a
// CPU-starved machine the 1,000/s run saturates and queues.
func BenchmarkLoad(b *testing.B) {
	if !*loadBench {
		b.Skip("load run: pass -args -load")
	}
	req := fakeenvoy.Request{Headers: postHeaders(), Body: [][]byte{chat2400()}}
	for _, rate := range []int{250, 1000} {
		for _, n := range []int{6, 64, 512} {
			b.Run(fmt.Sprintf("rate=%d/endpoints=%d", rate, n), func(b *testing.B) {
				conn := benchServer(b, n, true)
				var res fakeenvoy.LoadResult
				for b.Loop() {
					res = fakeenvoy.Load(context.Background(), conn.Client, fakeenvoy.LoadConfig{
						Rate: float64(rate), Requests: 3 * rate, Config: fakeenvoy.FullDuplex(), Request: req})
					if res.Errors > 0 {
						b.Fatal(res.FirstError)
					}
				}
				b.ReportMetric(float64(res.P50)/float64(time.Microsecond), "p50-us")
				b.ReportMetric(float64(res.P99)/float64(time.Microsecond), "p99-us")
				b.ReportMetric(float64(res.DecisionP50)/float64(time.Microsecond), "decision-p50-us")
				b.ReportMetric(float64(res.DecisionP99)/float64(time.Microsecond), "decision-p99-us")
				b.ReportMetric(res.AchievedRatePerS, "req/s")
				b.ReportMetric(float64(res.CPUPerExchange)/1e3, "cpu-us/exchange")
			})
		}
	}
}

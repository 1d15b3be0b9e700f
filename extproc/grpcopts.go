package extproc

import (
	"runtime"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/keepalive"
)

// Keepalive settings of the ext_proc server (see ServerOptions).
const (
	// KeepaliveTime: the server pings a connection silent this long, and closes it when
	// the ping is not answered within KeepaliveTimeout, so that a gateway gone without a
	// FIN (a node lost, a NAT entry dropped) frees its descriptor and its streams.
	KeepaliveTime    = 30 * time.Second
	KeepaliveTimeout = 10 * time.Second
	// KeepaliveMinClientInterval: a client pinging more often than this is sent GOAWAY
	// (too_many_pings), which bounds a ping flood. gRPC's default, 5 minutes, would drop
	// Envoy connections configured with a shorter http2 connection_keepalive interval;
	// 10 s admits any interval Envoy's documentation suggests.
	KeepaliveMinClientInterval = 10 * time.Second
)

// HTTP/2 flow-control windows of the ext_proc server. Setting them turns off gRPC's
// bandwidth-delay estimation, which grows each window to 16 MiB: with it, 24 parallel
// 15 MB bodies buffered ~240 MB in the transport before the router read them, past any
// body budget. A 1 MiB stream window still carries any body at loopback or LAN speed
// (a round trip per MiB); 4 MiB per connection bounds what one gateway connection can
// have in flight.
const (
	StreamWindowBytes     = 1 << 20
	ConnectionWindowBytes = 4 << 20
)

// ServerOptions returns the grpc.Server options the ext_proc server was measured with
// (see README.md, Performance): a pool of gRPC stream workers, one per core, whose
// goroutines run a stream's handler when one is free (Server.Process itself serves each
// stream on a worker goroutine of its own that outlives the stream, since gRPC's are
// taken by streams lasting a whole response); fixed flow-control windows
// (see StreamWindowBytes); and keepalive pings and their enforcement (see KeepaliveTime). Add your own options (for instance
// grpc.MaxRecvMsgSize, grpc.MaxConcurrentStreams) after these.
func ServerOptions() []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.NumStreamWorkers(uint32(runtime.GOMAXPROCS(0))),
		grpc.InitialWindowSize(StreamWindowBytes),
		grpc.InitialConnWindowSize(ConnectionWindowBytes),
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: KeepaliveTime, Timeout: KeepaliveTimeout}),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: KeepaliveMinClientInterval, PermitWithoutStream: true}),
	}
}

package extproc

import (
	"runtime"

	"google.golang.org/grpc"
)

// ServerOptions returns the grpc.Server options the ext_proc server was measured with
// (see README.md, Performance): a pool of stream workers, one per core, so that each
// ext_proc stream runs on a goroutine whose stack has already grown, instead of a new
// goroutine growing its stack (copying it) on every request. Add your own options (for
// instance grpc.MaxRecvMsgSize) after these.
func ServerOptions() []grpc.ServerOption {
	return []grpc.ServerOption{grpc.NumStreamWorkers(uint32(runtime.GOMAXPROCS(0)))}
}

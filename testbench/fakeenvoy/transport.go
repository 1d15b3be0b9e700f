package fakeenvoy

import (
	"context"
	"fmt"
	"net"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/test/bufconn"
)

// Conn is an ExternalProcessor client connected to an in-process gRPC server.
type Conn struct {
	Client extprocv3.ExternalProcessorClient
	Server *grpc.Server
	cc     *grpc.ClientConn
}

// Close closes the client connection and stops the server immediately.
func (c *Conn) Close() {
	c.cc.Close()
	c.Server.Stop()
}

// Bufconn serves register's services on an in-memory listener (a grpc.Server built with
// sopts) and connects to it.
func Bufconn(register func(*grpc.Server), sopts ...grpc.ServerOption) (*Conn, error) {
	lis := bufconn.Listen(1 << 20)
	return serve(lis, "passthrough:///bufconn", register, sopts, grpc.WithContextDialer(
		func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }))
}

// TCP serves register's services on a loopback TCP port and connects to it, so that
// latency includes the kernel's loopback path as with a real Envoy. The grpc.Server is
// built with sopts.
func TCP(register func(*grpc.Server), sopts ...grpc.ServerOption) (*Conn, error) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("fakeenvoy: listen: %w", err)
	}
	return serve(lis, lis.Addr().String(), register, sopts)
}

func serve(lis net.Listener, target string, register func(*grpc.Server), sopts []grpc.ServerOption, opts ...grpc.DialOption) (*Conn, error) {
	g := grpc.NewServer(sopts...)
	register(g)
	go g.Serve(lis)
	cc, err := grpc.NewClient(target, append(opts, grpc.WithTransportCredentials(insecure.NewCredentials()))...)
	if err != nil {
		g.Stop()
		return nil, fmt.Errorf("fakeenvoy: dial: %w", err)
	}
	return &Conn{Client: extprocv3.NewExternalProcessorClient(cc), Server: g, cc: cc}, nil
}

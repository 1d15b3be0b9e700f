package app_test

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/kvrouter/kvrouter/config"
	"github.com/kvrouter/kvrouter/internal/app"
	"github.com/kvrouter/kvrouter/tlscert"
)

// healthOver checks the ext_proc port's health service through creds; it returns the
// call's error.
func healthOver(t *testing.T, addr string, creds credentials.TransportCredentials) error {
	t.Helper()
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = healthpb.NewHealthClient(cc).Check(ctx, &healthpb.HealthCheckRequest{Service: app.ExtProcService})
	return err
}

func clientCreds(t *testing.T, c tlscert.ClientConfig) credentials.TransportCredentials {
	t.Helper()
	tc, err := c.TLS()
	if err != nil {
		t.Fatal(err)
	}
	return credentials.NewTLS(tc)
}

// TestExtProcTLS: the ext_proc port (ext_proc and the health service Envoy checks)
// speaks TLS unless the configuration disables it: self-signed by default, the
// configured files, and client certificates required with a client CA.
func TestExtProcTLS(t *testing.T) {
	vllm := newFakeVLLM(t)
	tlsDir, _ := filepath.Abs("../../config/testdata/tls")
	file := func(n string) string { return filepath.Join(tlsDir, n) }
	tests := []struct {
		name    string
		tls     tlscert.Config
		clients map[string]credentials.TransportCredentials // name -> creds; ok when the name starts with "ok"
	}{
		{"default: self-signed", config.DefaultListenConfig().TLS, map[string]credentials.TransportCredentials{
			"plaintext":                insecure.NewCredentials(),
			"verifying against a CA":   clientCreds(t, tlscert.ClientConfig{CAFile: file("ca.crt"), ServerName: "kvrouter"}),
			"ok: verification skipped": clientCreds(t, tlscert.ClientConfig{}),
		}},
		{"files and client CA", tlscert.Config{Mode: tlscert.ModeEnabled, CertFile: file("server.crt"), KeyFile: file("server.key"), ClientCAFile: file("ca.crt")},
			map[string]credentials.TransportCredentials{
				"plaintext":                    insecure.NewCredentials(),
				"no client certificate":        clientCreds(t, tlscert.ClientConfig{CAFile: file("ca.crt"), ServerName: "kvrouter"}),
				"ok: verified, client cert":    clientCreds(t, tlscert.ClientConfig{CAFile: file("ca.crt"), ServerName: "kvrouter", CertFile: file("server.crt"), KeyFile: file("server.key")}),
				"ok: skip verify, client cert": clientCreds(t, tlscert.ClientConfig{CertFile: file("server.crt"), KeyFile: file("server.key")}),
			}},
		{"disabled", tlscert.Config{Mode: tlscert.ModeDisabled}, map[string]credentials.TransportCredentials{
			"ok: plaintext": insecure.NewCredentials(),
			"tls":           clientCreds(t, tlscert.ClientConfig{}),
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig(t, vllm)
			cfg.Listen.TLS = tc.tls
			a := startApp(t, cfg, app.Options{Registry: prometheus.NewRegistry()})
			for name, creds := range tc.clients {
				t.Run(name, func(t *testing.T) {
					err := healthOver(t, a.addrs.ExtProc, creds)
					if ok := len(name) > 2 && name[:3] == "ok:"; (err == nil) != ok {
						t.Errorf("health check error %v, want ok=%v", err, ok)
					}
				})
			}
		})
	}
}

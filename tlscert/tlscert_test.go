package tlscert_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/kvrouter/kvrouter/tlscert"
)

// issuer is a test CA.
type issuer struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pem  []byte
}

func newCA(t *testing.T, name string) *issuer {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IsCA: true,
		BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	c, _ := x509.ParseCertificate(der)
	return &issuer{cert: c, key: key, pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

// issue returns a leaf's certificate and key PEM for cn (a server for 127.0.0.1, or a
// client).
func (ca *issuer) issue(t *testing.T, cn string, serial int64, client bool) (certPEM, keyPEM []byte) {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: cn},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}}
	if client {
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	kder, _ := x509.MarshalECPrivateKey(key)
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder})
}

func write(t *testing.T, path string, data []byte) {
	t.Helper()
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
}

// handshake serves one TLS connection with server and dials it with client; it returns
// the certificate the client saw, or the first error of either side.
func handshake(t *testing.T, server, client *tls.Config) (*x509.Certificate, error) {
	t.Helper()
	ln, err := tls.Listen("tcp", "127.0.0.1:0", server)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var wg sync.WaitGroup
	var serr error
	wg.Go(func() {
		c, err := ln.Accept()
		if err != nil {
			serr = err
			return
		}
		defer c.Close()
		if serr = c.(*tls.Conn).Handshake(); serr == nil {
			_, serr = c.Write([]byte{1})
		}
	})
	defer wg.Wait()
	c, err := tls.Dial("tcp", ln.Addr().String(), client)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	// With TLS 1.3 a rejected client certificate shows on the first read.
	if _, err := c.Read(make([]byte, 1)); err != nil {
		return nil, err
	}
	wg.Wait()
	if serr != nil {
		return nil, serr
	}
	return c.ConnectionState().PeerCertificates[0], nil
}

func clientTLS(t *testing.T, c tlscert.ClientConfig) *tls.Config {
	t.Helper()
	tc, err := c.TLS()
	if err != nil {
		t.Fatal(err)
	}
	return tc
}

func TestSelfSignedByDefault(t *testing.T) {
	reg := prometheus.NewRegistry()
	core, logs := observer.New(zap.InfoLevel)
	src, err := tlscert.New(tlscert.DefaultConfig(), tlscert.Options{Registerer: reg, Logger: zap.New(core), Hosts: []string{"kvrouter.ns.svc", "10.1.2.3"}})
	if err != nil {
		t.Fatal(err)
	}
	// The fingerprint is logged, for pinning (Envoy's verify_certificate_hash).
	if e := logs.FilterField(zap.String("sha256_fingerprint", tlscert.Fingerprint(src.Certificate()))).All(); len(e) != 1 {
		t.Errorf("logs %v: want one entry with the certificate's fingerprint", logs.All())
	}
	got, err := handshake(t, src.ServerConfig(), clientTLS(t, tlscert.ClientConfig{}))
	if err != nil {
		t.Fatalf("handshake with verification skipped: %v", err)
	}
	if tlscert.Fingerprint(got) != tlscert.Fingerprint(src.Certificate()) {
		t.Error("the client saw another certificate than the one in use")
	}
	if !strings.Contains(strings.Join(got.DNSNames, ","), "kvrouter.ns.svc") || len(got.IPAddresses) != 3 {
		t.Errorf("names %v %v, want localhost and the given hosts", got.DNSNames, got.IPAddresses)
	}
	// A client that verifies against the system roots refuses it.
	if _, err := handshake(t, src.ServerConfig(), &tls.Config{ServerName: "localhost"}); err == nil {
		t.Error("a verifying client accepted the self-signed certificate")
	}
	if v := metric(t, reg, "kvrouter_tls_certificate_expiry_timestamp_seconds", ""); v != float64(got.NotAfter.Unix()) {
		t.Errorf("expiry gauge %v, want %v", v, got.NotAfter.Unix())
	}
}

func TestFilesReloadOnChange(t *testing.T) {
	ca := newCA(t, "ca")
	for _, layout := range []string{"in place", "kubelet symlink swap"} {
		t.Run(layout, func(t *testing.T) {
			dir := t.TempDir()
			certPath, keyPath := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
			// rotate installs version v of the pair the way the layout does.
			rotate := func(v int, certPEM, keyPEM []byte) {
				if layout == "in place" {
					write(t, certPath, certPEM)
					write(t, keyPath, keyPEM)
					mt := time.Unix(1_700_000_000+int64(v), 0)
					_ = os.Chtimes(certPath, mt, mt)
					_ = os.Chtimes(keyPath, mt, mt)
					return
				}
				// The kubelet writes a new timestamped directory and swaps ..data to it.
				data := filepath.Join(dir, "..v"+string(rune('0'+v)))
				if err := os.Mkdir(data, 0o700); err != nil {
					t.Fatal(err)
				}
				write(t, filepath.Join(data, "tls.crt"), certPEM)
				write(t, filepath.Join(data, "tls.key"), keyPEM)
				tmp := filepath.Join(dir, "..data_tmp")
				if err := os.Symlink(filepath.Base(data), tmp); err != nil {
					t.Fatal(err)
				}
				if err := os.Rename(tmp, filepath.Join(dir, "..data")); err != nil {
					t.Fatal(err)
				}
				for _, f := range []string{"tls.crt", "tls.key"} {
					if _, err := os.Lstat(filepath.Join(dir, f)); err != nil {
						if err := os.Symlink(filepath.Join("..data", f), filepath.Join(dir, f)); err != nil {
							t.Fatal(err)
						}
					}
				}
			}
			c1, k1 := ca.issue(t, "one", 1, false)
			rotate(1, c1, k1)
			now := time.Unix(1_800_000_000, 0)
			reg := prometheus.NewRegistry()
			src, err := tlscert.New(tlscert.Config{Mode: tlscert.ModeEnabled, CertFile: certPath, KeyFile: keyPath},
				tlscert.Options{Now: func() time.Time { return now }, Registerer: reg})
			if err != nil {
				t.Fatal(err)
			}
			pool := x509.NewCertPool()
			pool.AddCert(ca.cert)
			client := &tls.Config{RootCAs: pool, ServerName: "127.0.0.1"}
			cn := func() string {
				t.Helper()
				got, err := handshake(t, src.ServerConfig(), client)
				if err != nil {
					t.Fatal(err)
				}
				return got.Subject.CommonName
			}
			if got := cn(); got != "one" {
				t.Fatalf("served %q, want one", got)
			}
			c2, k2 := ca.issue(t, "two", 2, false)
			rotate(2, c2, k2)
			if got := cn(); got != "one" {
				t.Errorf("before the check interval served %q, want one", got)
			}
			now = now.Add(tlscert.ReloadCheckInterval)
			if got := cn(); got != "two" {
				t.Errorf("after the check interval served %q, want two", got)
			}
			// A half-written rotation (garbage certificate) keeps the pair in use.
			if layout == "in place" {
				write(t, certPath, []byte("not a certificate"))
				mt := time.Unix(1_700_000_010, 0)
				_ = os.Chtimes(certPath, mt, mt)
				now = now.Add(tlscert.ReloadCheckInterval)
				if got := cn(); got != "two" {
					t.Errorf("after a bad rotation served %q, want two", got)
				}
				if v := metric(t, reg, "kvrouter_tls_reloads_total", "error"); v != 1 {
					t.Errorf("reload errors = %v, want 1", v)
				}
			}
			if v := metric(t, reg, "kvrouter_tls_reloads_total", "ok"); v != 1 {
				t.Errorf("reloads ok = %v, want 1", v)
			}
		})
	}
}

func TestClientCARequiresClientCertificates(t *testing.T) {
	ca, other := newCA(t, "clients"), newCA(t, "other")
	dir := t.TempDir()
	caPath := filepath.Join(dir, "ca.crt")
	write(t, caPath, ca.pem)
	goodCert, goodKey := ca.issue(t, "envoy", 3, true)
	badCert, badKey := other.issue(t, "intruder", 4, true)
	for name, pemPair := range map[string][2][]byte{"good": {goodCert, goodKey}, "bad": {badCert, badKey}} {
		write(t, filepath.Join(dir, name+".crt"), pemPair[0])
		write(t, filepath.Join(dir, name+".key"), pemPair[1])
	}
	src, err := tlscert.New(tlscert.Config{Mode: tlscert.ModeEnabled, ClientCAFile: caPath}, tlscert.Options{})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name   string
		client tlscert.ClientConfig
		ok     bool
	}{
		{"no client certificate", tlscert.ClientConfig{}, false},
		{"certificate of another CA", tlscert.ClientConfig{CertFile: filepath.Join(dir, "bad.crt"), KeyFile: filepath.Join(dir, "bad.key")}, false},
		{"certificate of the client CA", tlscert.ClientConfig{CertFile: filepath.Join(dir, "good.crt"), KeyFile: filepath.Join(dir, "good.key")}, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := handshake(t, src.ServerConfig(), clientTLS(t, tc.client))
			if (err == nil) != tc.ok {
				t.Errorf("handshake error %v, want ok=%v", err, tc.ok)
			}
		})
	}
}

func TestValidateAndCheck(t *testing.T) {
	ca := newCA(t, "ca")
	dir := t.TempDir()
	c1, k1 := ca.issue(t, "one", 1, false)
	_, k2 := ca.issue(t, "two", 2, false)
	write(t, filepath.Join(dir, "c1"), c1)
	write(t, filepath.Join(dir, "k1"), k1)
	write(t, filepath.Join(dir, "k2"), k2)
	write(t, filepath.Join(dir, "empty"), []byte("# no PEM here\n"))
	p := func(n string) string { return filepath.Join(dir, n) }
	tests := []struct {
		name string
		cfg  tlscert.Config
		want string // substring of the error; "" for none
	}{
		{"default", tlscert.DefaultConfig(), ""},
		{"files", tlscert.Config{Mode: "enabled", CertFile: p("c1"), KeyFile: p("k1")}, ""},
		{"disabled", tlscert.Config{Mode: "disabled"}, ""},
		{"unknown mode", tlscert.Config{Mode: "on"}, `mode: unknown mode "on"`},
		{"zero mode is enabled", tlscert.Config{}, ""},
		{"cert without key", tlscert.Config{Mode: "enabled", CertFile: p("c1")}, "key_file: is required with cert_file"},
		{"key without cert", tlscert.Config{Mode: "enabled", KeyFile: p("k1")}, "cert_file: is required with key_file"},
		{"files while disabled", tlscert.Config{Mode: "disabled", CertFile: p("c1"), KeyFile: p("k1")}, "cert_file: is set but mode is disabled"},
		{"key of another certificate", tlscert.Config{Mode: "enabled", CertFile: p("c1"), KeyFile: p("k2")}, "cert_file: cannot load"},
		{"missing cert", tlscert.Config{Mode: "enabled", CertFile: p("nope"), KeyFile: p("k1")}, "cert_file: cannot load"},
		{"CA bundle without certificate", tlscert.Config{Mode: "enabled", ClientCAFile: p("empty")}, "client_ca_file: " + p("empty") + " holds no PEM certificate"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.cfg.Validate()
			if err == nil {
				err = tc.cfg.Check()
			}
			switch {
			case tc.want == "" && err != nil:
				t.Errorf("unexpected error: %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Errorf("error %v, want it to contain %q", err, tc.want)
			}
			if tc.want == "" && tc.cfg.Enabled() {
				if _, err := tlscert.New(tc.cfg, tlscert.Options{}); err != nil {
					t.Errorf("New: %v", err)
				}
			}
		})
	}
}

// metric reads a gauge, or the counter with result label result, from reg.
func metric(t *testing.T, reg *prometheus.Registry, name, result string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if result == "" {
				return m.GetGauge().GetValue()
			}
			for _, l := range m.GetLabel() {
				if l.GetName() == "result" && l.GetValue() == result {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	t.Fatalf("no metric %s{result=%q}", name, result)
	return 0
}

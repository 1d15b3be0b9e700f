package tlscert

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"fmt"
	"math/big"
	"net"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
)

// ReloadCheckInterval is how often a handshake may look at the files' modification times:
// a rotated certificate is served within this long of the next connection, and a busy
// port stats the files at most this often. Polling the modification time (os.Stat follows
// the kubelet's ..data symlink swap) needs no watcher goroutine and no inotify watch on a
// directory the kubelet replaces, and is driven by the injected clock in tests.
const ReloadCheckInterval = 10 * time.Second

// SelfSignedValidity is how long a generated certificate is valid; a restart generates a
// new one, and clients of a self-signed certificate do not verify it anyway.
const SelfSignedValidity = 365 * 24 * time.Hour

// Options are a Source's collaborators; every field may be left zero.
type Options struct {
	// Logger receives the fingerprint of a generated certificate and reload results.
	// Nil: no logs.
	Logger *zap.Logger
	// Registerer receives the metrics. Nil: not registered.
	Registerer prometheus.Registerer
	// Now is the clock. Nil: time.Now.
	Now func() time.Time
	// Hosts are extra DNS names or IPs of a self-signed certificate (localhost, 127.0.0.1
	// and ::1 are always there).
	Hosts []string
}

// stamp identifies one version of a file: the file (device and inode: the kubelet's
// symlink swap installs new files) and its modification time and size (a rewrite in
// place).
type stamp struct {
	fi os.FileInfo
}

func (a stamp) same(b stamp) bool {
	if a.fi == nil || b.fi == nil {
		return a.fi == nil && b.fi == nil
	}
	return os.SameFile(a.fi, b.fi) && a.fi.ModTime().Equal(b.fi.ModTime()) && a.fi.Size() == b.fi.Size()
}

// Source serves the certificate and client CAs of one listener. Create it with New.
type Source struct {
	cfg  Config
	log  *zap.Logger
	now  func() time.Time
	base *tls.Config

	reloads *prometheus.CounterVec
	expiry  prometheus.Gauge

	mu        sync.Mutex
	cert      *tls.Certificate
	clientCAs *x509.CertPool
	stamps    [3]stamp // cert, key, client CA
	checked   time.Time
}

// New loads the configured files or generates a self-signed certificate. cfg must be
// valid and enabled. It starts nothing.
func New(cfg Config, o Options) (*Source, error) {
	if !cfg.Enabled() {
		return nil, fmt.Errorf("tlscert: mode is %s", cfg.Mode)
	}
	s := &Source{cfg: cfg, log: o.Logger, now: o.Now}
	if s.log == nil {
		s.log = zap.NewNop()
	}
	if s.now == nil {
		s.now = time.Now
	}
	s.reloads = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kvrouter_tls_reloads_total",
		Help: "Re-reads of the ext_proc port's certificate, key or client CA files after they changed, by result (ok, error: the previous ones stay in use).",
	}, []string{"result"})
	s.expiry = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "kvrouter_tls_certificate_expiry_timestamp_seconds",
		Help: "When the ext_proc port's certificate in use expires (Unix seconds).",
	})
	for _, r := range []string{"ok", "error"} {
		s.reloads.WithLabelValues(r)
	}
	if o.Registerer != nil {
		if err := o.Registerer.Register(s.reloads); err != nil {
			return nil, fmt.Errorf("tlscert: %w", err)
		}
		if err := o.Registerer.Register(s.expiry); err != nil {
			return nil, fmt.Errorf("tlscert: %w", err)
		}
	}
	if cfg.SelfSigned() {
		cert, err := SelfSigned(s.now(), o.Hosts)
		if err != nil {
			return nil, err
		}
		s.setCert(cert)
		s.log.Info("tls: serving a self-signed certificate (clients must skip verification or pin it)",
			zap.String("sha256_fingerprint", Fingerprint(cert.Leaf)), zap.Time("not_after", cert.Leaf.NotAfter))
	}
	if err := s.load(s.statAll()); err != nil {
		return nil, err
	}
	s.checked = s.now()
	s.base = &tls.Config{MinVersion: tls.VersionTLS12, NextProtos: []string{"h2"}}
	return s, nil
}

// files lists the paths whose changes are watched, in stamp order ("" when not
// configured).
func (s *Source) files() [3]string {
	if s.cfg.SelfSigned() {
		return [3]string{"", "", s.cfg.ClientCAFile}
	}
	return [3]string{s.cfg.CertFile, s.cfg.KeyFile, s.cfg.ClientCAFile}
}

func (s *Source) statAll() [3]stamp {
	var st [3]stamp
	for i, p := range s.files() {
		if p == "" {
			continue
		}
		if fi, err := os.Stat(p); err == nil {
			st[i] = stamp{fi: fi}
		}
	}
	return st
}

// load reads the configured files; on success they replace those in use and st is
// remembered as their version.
func (s *Source) load(st [3]stamp) error {
	var cert *tls.Certificate
	if !s.cfg.SelfSigned() {
		c, err := tls.LoadX509KeyPair(s.cfg.CertFile, s.cfg.KeyFile)
		if err != nil {
			return fmt.Errorf("tlscert: certificate %s, key %s: %w", s.cfg.CertFile, s.cfg.KeyFile, err)
		}
		cert = &c
	}
	var pool *x509.CertPool
	if s.cfg.ClientCAFile != "" {
		p, err := loadCAs(s.cfg.ClientCAFile)
		if err != nil {
			return fmt.Errorf("tlscert: client CA: %w", err)
		}
		pool = p
	}
	if cert != nil {
		s.setCert(cert)
	}
	s.clientCAs = pool
	s.stamps = st
	return nil
}

func (s *Source) setCert(c *tls.Certificate) {
	s.cert = c
	if c.Leaf != nil {
		s.expiry.Set(float64(c.Leaf.NotAfter.Unix()))
	}
}

// maybeReload re-reads the files when one changed since they were last loaded, at most
// once per ReloadCheckInterval. A failed read keeps what is in use and is retried at
// the next check.
func (s *Source) maybeReload() {
	now := s.now()
	if now.Sub(s.checked) < ReloadCheckInterval {
		return
	}
	s.checked = now
	st := s.statAll()
	if st[0].same(s.stamps[0]) && st[1].same(s.stamps[1]) && st[2].same(s.stamps[2]) {
		return
	}
	if err := s.load(st); err != nil {
		s.reloads.WithLabelValues("error").Inc()
		s.log.Warn("tls: reloading the certificate files failed; the previous ones stay in use", zap.Error(err))
		return
	}
	s.reloads.WithLabelValues("ok").Inc()
	fields := []zap.Field{zap.String("cert_file", s.cfg.CertFile), zap.String("client_ca_file", s.cfg.ClientCAFile)}
	if s.cert.Leaf != nil {
		fields = append(fields, zap.String("sha256_fingerprint", Fingerprint(s.cert.Leaf)), zap.Time("not_after", s.cert.Leaf.NotAfter))
	}
	s.log.Info("tls: reloaded the certificate files", fields...)
}

// ServerConfig returns the tls.Config to serve with: each handshake gets the current
// certificate and, with a client CA, requires and verifies a client certificate.
func (s *Source) ServerConfig() *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		NextProtos: []string{"h2"},
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
			return s.handshakeConfig(), nil
		},
	}
}

func (s *Source) handshakeConfig() *tls.Config {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.maybeReload()
	c := s.base.Clone()
	c.Certificates = []tls.Certificate{*s.cert}
	if s.clientCAs != nil {
		c.ClientCAs = s.clientCAs
		c.ClientAuth = tls.RequireAndVerifyClientCert
	}
	return c
}

// Certificate returns the leaf certificate in use (after a reload check).
func (s *Source) Certificate() *x509.Certificate {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.maybeReload()
	return s.cert.Leaf
}

// Fingerprint is the certificate's SHA-256 in hex, the form Envoy's
// verify_certificate_hash takes.
func Fingerprint(c *x509.Certificate) string {
	sum := sha256.Sum256(c.Raw)
	return strings.ToUpper(hex.EncodeToString(sum[:]))
}

// SelfSigned generates an ECDSA P-256 certificate for localhost, 127.0.0.1, ::1 and
// hosts, valid from an hour before now for SelfSignedValidity.
func SelfSigned(now time.Time, hosts []string) (*tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("tlscert: %w", err)
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, fmt.Errorf("tlscert: %w", err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: "kvrouter", Organization: []string{"kvrouter self-signed"}},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(SelfSignedValidity),
		KeyUsage:              x509.KeyUsageDigitalSignature,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		DNSNames:              []string{"localhost"},
		IPAddresses:           []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback},
	}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else if h != "" {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, fmt.Errorf("tlscert: %w", err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("tlscert: %w", err)
	}
	return &tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}, nil
}

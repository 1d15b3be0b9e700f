package tlscert

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"

	"github.com/kvrouter/kvrouter/config/field"
)

// Mode says whether the ext_proc port speaks TLS.
type Mode string

const (
	// ModeEnabled serves TLS: the configured certificate, or a self-signed one. The zero
	// Mode means the same, so a Config written in Go is secure unless it says otherwise.
	ModeEnabled Mode = "enabled"
	// ModeDisabled serves plaintext gRPC; only when the configuration says so.
	ModeDisabled Mode = "disabled"
)

// Config is the listen.tls section.
type Config struct {
	// Mode is enabled (the default: gateways implementing the Inference Extension
	// connect to the picker over TLS) or disabled (plaintext, written out explicitly).
	Mode Mode `yaml:"mode"`
	// CertFile and KeyFile are PEM files (the certificate chain and its private key),
	// both or neither. Neither: a self-signed certificate is generated at start. They are
	// re-read when they change.
	CertFile string `yaml:"cert_file"`
	KeyFile  string `yaml:"key_file"`
	// ClientCAFile is a PEM bundle of CA certificates; when set, every client must
	// present a certificate signed by one of them (mTLS). Re-read when it changes.
	ClientCAFile string `yaml:"client_ca_file"`
}

// DefaultConfig returns TLS enabled with a self-signed certificate and no client
// verification: what a gateway with verification skipped (NGINX Gateway Fabric's default)
// connects to.
func DefaultConfig() Config { return Config{Mode: ModeEnabled} }

// Enabled reports whether the port serves TLS.
func (c *Config) Enabled() bool { return c.Mode != ModeDisabled }

// SelfSigned reports whether the certificate is generated at start.
func (c *Config) SelfSigned() bool { return c.Enabled() && c.CertFile == "" }

// Validate checks the mode and which files go together; it reads no file (Check does).
func (c *Config) Validate() error {
	var errs field.Errors
	switch c.Mode {
	case ModeEnabled, "":
		if (c.CertFile == "") != (c.KeyFile == "") {
			if c.CertFile == "" {
				errs.Addf("cert_file", "is required with key_file")
			} else {
				errs.Addf("key_file", "is required with cert_file")
			}
		}
	case ModeDisabled:
		for _, f := range []struct{ name, val string }{{"cert_file", c.CertFile}, {"key_file", c.KeyFile}, {"client_ca_file", c.ClientCAFile}} {
			if f.val != "" {
				errs.Addf(f.name, "is set but mode is %s (plaintext): remove it or set mode: %s", ModeDisabled, ModeEnabled)
			}
		}
	default:
		errs.Addf("mode", "unknown mode %q (known: %s, %s)", c.Mode, ModeEnabled, ModeDisabled)
	}
	return errs.Err()
}

// Check loads the files the way the server does at start, so check-config catches a
// certificate that does not match its key or a CA bundle without a certificate.
func (c *Config) Check() error {
	var errs field.Errors
	if c.Enabled() && c.CertFile != "" {
		if _, err := tls.LoadX509KeyPair(c.CertFile, c.KeyFile); err != nil {
			errs.Addf("cert_file", "cannot load the certificate and key_file: %v", err)
		}
	}
	if c.Enabled() && c.ClientCAFile != "" {
		if _, err := loadCAs(c.ClientCAFile); err != nil {
			errs.Addf("client_ca_file", "%v", err)
		}
	}
	return errs.Err()
}

// loadCAs reads a PEM bundle of CA certificates.
func loadCAs(path string) (*x509.CertPool, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(data) {
		return nil, fmt.Errorf("%s holds no PEM certificate", path)
	}
	return pool, nil
}

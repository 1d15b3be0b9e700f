package tlscert

import (
	"crypto/tls"
	"fmt"
)

// ClientConfig is how one of the repository's tools (the dev gateway, kvdemo) connects
// to a TLS ext_proc port.
type ClientConfig struct {
	// CAFile verifies the server's certificate against these CAs; empty skips
	// verification (a self-signed server, as NGINX Gateway Fabric's default).
	CAFile string
	// ServerName is the name verified (and sent as SNI); empty: the dialed host.
	ServerName string
	// CertFile and KeyFile are the client certificate for mTLS (both or neither).
	CertFile, KeyFile string
}

// TLS returns the client's tls.Config.
func (c ClientConfig) TLS() (*tls.Config, error) {
	tc := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: c.ServerName}
	if c.CAFile == "" {
		tc.InsecureSkipVerify = true // a self-signed server: encryption without authentication
	} else {
		pool, err := loadCAs(c.CAFile)
		if err != nil {
			return nil, fmt.Errorf("tlscert: %w", err)
		}
		tc.RootCAs = pool
	}
	if (c.CertFile == "") != (c.KeyFile == "") {
		return nil, fmt.Errorf("tlscert: a client certificate needs both the certificate and the key file")
	}
	if c.CertFile != "" {
		cert, err := tls.LoadX509KeyPair(c.CertFile, c.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("tlscert: client certificate: %w", err)
		}
		tc.Certificates = []tls.Certificate{cert}
	}
	return tc, nil
}

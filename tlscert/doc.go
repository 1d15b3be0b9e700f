// Package tlscert gives kvrouter's ext_proc port its TLS configuration, as the Gateway API
// Inference Extension's endpoint picker serves it: a self-signed certificate generated at
// start when none is configured (gateways then connect with verification skipped), or a
// certificate and key read from files and re-read when the files change (cert-manager and
// the kubelet rewrite a mounted Secret in place), and optionally a client CA whose
// certificates clients must present (mTLS). It also builds the client side the repository's
// own tools use (the dev gateway, kvdemo).
//
// Concurrency: a Source is safe for use by many handshakes at once; New starts nothing
// (files are checked for changes during handshakes, at most once per ReloadCheckInterval).
package tlscert

package demo

import "testing"

func TestEnvoyConfigRewritesPorts(t *testing.T) {
	src := "admin:\n  address:\n    socket_address: {address: 127.0.0.1, port_value: 9901}\n" +
		"listeners:\n  - socket_address: {address: 0.0.0.0, port_value: 8081}\n" +
		"cluster:\n  - socket_address: {address: kvrouter, port_value: 9002}\n" +
		"lua: handle:headers():remove(\"x-gateway-destination-endpoint-served\")\n"
	got, err := envoyConfig(src, "127.0.0.1:18081", "127.0.0.1:19002", 19901)
	if err != nil {
		t.Fatal(err)
	}
	want := "admin:\n  address:\n    socket_address: {address: 127.0.0.1, port_value: 19901}\n" +
		"listeners:\n  - socket_address: {address: 127.0.0.1, port_value: 18081}\n" +
		"cluster:\n  - socket_address: {address: 127.0.0.1, port_value: 19002}\n" +
		"lua: -- kvdemo keeps the served endpoint: kvbench counts servers per prefix\n"
	if got != want {
		t.Errorf("got\n%s\nwant\n%s", got, want)
	}
	if _, err := envoyConfig("admin: {}", "127.0.0.1:1", "127.0.0.1:2", 3); err == nil {
		t.Error("a bootstrap of another shape was accepted")
	}
}

func TestEnvoyConfigMatchesRepository(t *testing.T) {
	// The repository's bootstrap must keep the shape the demo rewrites.
	if _, err := envoyConfigFile("../../envoy/envoy.yaml"); err != nil {
		t.Fatal(err)
	}
}

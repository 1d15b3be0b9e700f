package envoy_test

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	luav3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/lua/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"

	"google.golang.org/protobuf/types/known/anypb"

	"github.com/kvrouter/kvrouter/envoy"
)

// fakeEnvoyLua (run after the filter's code and "ENTRY = envoy_on_request" or
// envoy_on_response) mimics the parts of Envoy's Lua API the filters use: handle:headers()
// returns a header map whose keys are lower case (as Envoy stores them), iterable with
// pairs() and with remove(); removing while iterating is an error, as Envoy forbids it.
const fakeEnvoyLua = `
local names = {}
local values = {}
for _, kv in ipairs(INPUT) do
  local k = string.lower(kv[1])
  if values[k] == nil then table.insert(names, k) end
  values[k] = kv[2]
end
local iterating = false
local map = {}
function map:remove(name)
  if iterating then error("header map modified during iteration") end
  name = string.lower(name)
  values[name] = nil
  for i, n in ipairs(names) do if n == name then table.remove(names, i) break end end
end
function map:get(name) return values[string.lower(name)] end
setmetatable(map, {__pairs = function()
  local i = 0
  iterating = true
  return function()
    i = i + 1
    if names[i] == nil then iterating = false return nil end
    return names[i], values[names[i]]
  end
end})
local handle = {}
function handle:headers() return map end
ENTRY(handle)
for _, n in ipairs(names) do print(n .. "=" .. values[n]) end
`

// TestLuaStripsDestinationHeaders runs each shipped Lua filter against a fake of Envoy's
// header API: every x-gateway-destination-* header goes, whatever its case, and nothing
// else does.
func TestLuaStripsDestinationHeaders(t *testing.T) {
	input := `INPUT = {
  {":method", "POST"}, {":path", "/v1/chat/completions"},
  {"x-gateway-destination-endpoint", "6.6.6.6:666"},
  {"X-Gateway-Destination-Endpoint-Subset", "7.7.7.7:777"},
  {"x-gateway-destination-anything", "x"},
  {"x-gateway-destinations", "kept: not the prefix"},
  {"content-type", "application/json"},
}
`
	want := ":method=POST\n:path=/v1/chat/completions\nx-gateway-destinations=kept: not the prefix\ncontent-type=application/json\n"
	runLuaFilters(t, "envoy_on_request", input, want)
}

// runLuaFilters runs the Lua filter of every envoy*.yaml under lua5.4: entry (its
// envoy_on_request or envoy_on_response) over the headers INPUT declares, through the
// fake of Envoy's header API, and compares the headers left with want.
func runLuaFilters(t *testing.T, entry, input, want string) {
	t.Helper()
	lua, err := exec.LookPath("lua5.4")
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("lua5.4 is not installed (.ci/run installs it)")
		}
		t.Skip("lua5.4 not installed; .ci/run installs it")
	}
	files, _ := filepath.Glob("envoy*.yaml")
	if len(files) == 0 {
		t.Fatal("no envoy*.yaml")
	}
	for _, file := range files {
		t.Run(file, func(t *testing.T) {
			b, err := envoy.Load(file)
			if err != nil {
				t.Fatal(err)
			}
			code := luaCode(t, b.GetStaticResources().GetListeners()[0].GetFilterChains()[0].GetFilters()[0].GetTypedConfig())
			cmd := exec.Command(lua, "-")
			cmd.Stdin = strings.NewReader(input + code + "\nENTRY = " + entry + "\n" + fakeEnvoyLua)
			var out, stderr bytes.Buffer
			cmd.Stdout, cmd.Stderr = &out, &stderr
			if err := cmd.Run(); err != nil {
				t.Fatalf("lua: %v: %s", err, stderr.String())
			}
			if out.String() != want {
				t.Errorf("headers after %s:\n%s\nwant:\n%s", entry, out.String(), want)
			}
		})
	}
}

// luaCode returns the inline code of the connection manager's Lua filter.
func luaCode(t *testing.T, hcmAny *anypb.Any) string {
	t.Helper()
	hcm := &hcmv3.HttpConnectionManager{}
	if err := hcmAny.UnmarshalTo(hcm); err != nil {
		t.Fatal(err)
	}
	for _, f := range hcm.GetHttpFilters() {
		l := &luav3.Lua{}
		if f.GetTypedConfig().MessageIs(l) {
			if err := f.GetTypedConfig().UnmarshalTo(l); err != nil {
				t.Fatal(err)
			}
			return l.GetDefaultSourceCode().GetInlineString()
		}
	}
	t.Fatal("no Lua filter")
	return ""
}

// TestLuaStripsServedHeader runs each shipped Lua filter's envoy_on_response against the
// fake: the served endpoint (a pod's ip:port, added by kvrouter on the response path) is
// removed before the response reaches the client; other headers stay.
func TestLuaStripsServedHeader(t *testing.T) {
	input := `INPUT = {
  {":status", "200"}, {"content-type", "text/event-stream"},
  {"x-gateway-destination-endpoint-served", "10.0.0.7:8000"},
  {"x-request-id", "abc"},
}
`
	runLuaFilters(t, "envoy_on_response", input, ":status=200\ncontent-type=text/event-stream\nx-request-id=abc\n")
}

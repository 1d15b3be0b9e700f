// Command kvrouter is the KV-cache-aware ext_proc router for vLLM fleets; see the
// repository README. All of its logic lives in internal/app.
package main

import (
	"os"

	"github.com/kvrouter/kvrouter/internal/app"
)

func main() { os.Exit(app.Main(os.Args[1:], os.Stdout, os.Stderr)) }

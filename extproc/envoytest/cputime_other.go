//go:build !unix

package envoytest

import "time"

func cpuTime() time.Duration { return 0 }

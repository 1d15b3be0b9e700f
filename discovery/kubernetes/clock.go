package kubernetes

import (
	"time"

	"k8s.io/utils/clock"
)

type clockLike interface {
	Now() time.Time
	NewTimer(time.Duration) clock.Timer
}

type realClock = clock.RealClock

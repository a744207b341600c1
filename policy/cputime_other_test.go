//go:build !linux

package policy

import "time"

// threadCPU is not available here; the CPU percentiles report 0.
func threadCPU() time.Duration { return 0 }

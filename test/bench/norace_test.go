//go:build linux && !race

package bench

const raceEnabled = false

//go:build linux && race

package bench

// raceEnabled: under the race detector the numbers mean nothing, so the
// suite runs as a smoke run and never writes test/report.
const raceEnabled = true

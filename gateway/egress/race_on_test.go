//go:build race

package egress

// raceEnabled: the race detector multiplies memory, so memory goals are
// not judged under it.
const raceEnabled = true

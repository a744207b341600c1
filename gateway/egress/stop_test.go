package egress

import "testing"

// TestStopHooks: a hook registered before the shutdown runs once when it
// begins, one registered after runs at once, and one unregistered first
// never runs; closers run at every CloseAll.
func TestStopHooks(t *testing.T) {
	var h StopHooks
	var before, gone, after, closed int
	h.OnStop(func() { before++ })
	h.OnStop(func() { gone++ })()
	h.AtClose(func() { closed++ })
	h.Begin()
	h.Begin()
	h.OnStop(func() { after++ })()
	h.CloseAll()
	h.CloseAll()
	for _, c := range []struct {
		name      string
		got, want int
	}{
		{"registered before the shutdown", before, 1},
		{"unregistered before the shutdown", gone, 0},
		{"registered after the shutdown began", after, 1},
		{"closer, run by each CloseAll", closed, 2},
	} {
		if c.got != c.want {
			t.Errorf("%s: ran %d times, want %d", c.name, c.got, c.want)
		}
	}
}

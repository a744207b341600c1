// Package logcap rate-limits identical log lines: the first line of a
// kind is logged whole, the same line again within an interval is only
// counted, and the count is logged as one "log_repeated" line.
package logcap

import (
	"context"
	"log/slog"
	"sync"
	"time"
)

// Every is how often a line that keeps repeating is summarised.
const Every = 5 * time.Second

// maxRepeatKeys bounds the lines a Limiter tracks; past it a line is
// logged (more lines, never a lost one).
const maxRepeatKeys = 256

// Limiter rate-limits identical log lines: a full audit disk refuses
// every call, and one line per call was ~12,000 lines a second on stderr
// (itself often the same full disk). The first line of a kind is logged
// whole; the same line again within repeatEvery is only counted, and the
// count is logged as one "log_repeated" line at the end of each interval
// in which it repeated. A key is the line's message and reason, never
// anything that carries a secret.
type Limiter struct {
	log   *slog.Logger
	every time.Duration
	mu    sync.Mutex
	keys  map[repeatKey]*repeated
}

// New is a Limiter that summarises on log every interval.
func New(log *slog.Logger, every time.Duration) *Limiter {
	return &Limiter{log: log, every: every}
}

type repeatKey struct{ msg, reason string }

type repeated struct {
	count int         // lines suppressed in this interval
	timer *time.Timer // the end of the interval, while a line is counted
}

// Allow reports whether the line (msg, reason) is logged now; if not, it
// is counted.
func (l *Limiter) Allow(msg, reason string) bool {
	k := repeatKey{msg, reason}
	l.mu.Lock()
	defer l.mu.Unlock()
	r, ok := l.keys[k]
	if !ok {
		if l.keys == nil {
			l.keys = make(map[repeatKey]*repeated)
		}
		if len(l.keys) >= maxRepeatKeys {
			return true
		}
		// The first line of an interval: logged; the interval runs even
		// if nothing follows, so that a later line waits for it.
		l.keys[k] = &repeated{timer: time.AfterFunc(l.every, func() { l.flush(k) })}
		return true
	}
	r.count++
	return false
}

// flush ends k's interval: the lines counted in it are logged as one line,
// and a new interval starts; an interval with none ends the key, so that
// the next such line is logged whole.
func (l *Limiter) flush(k repeatKey) {
	l.mu.Lock()
	r := l.keys[k]
	if r == nil {
		l.mu.Unlock()
		return
	}
	n := r.count
	if n == 0 {
		delete(l.keys, k)
		l.mu.Unlock()
		return
	}
	r.count = 0
	r.timer = time.AfterFunc(l.every, func() { l.flush(k) })
	l.mu.Unlock()
	l.log.LogAttrs(context.Background(), slog.LevelWarn, "log_repeated",
		slog.String("line", k.msg), slog.String("reason", k.reason),
		slog.Int("count", n), slog.Float64("interval_s", l.every.Seconds()))
}

// Stop ends every interval, logging the counts not yet logged (the
// server is closing).
func (l *Limiter) Stop() {
	l.mu.Lock()
	keys := make([]repeatKey, 0, len(l.keys))
	for k, r := range l.keys {
		r.timer.Stop()
		keys = append(keys, k)
	}
	l.mu.Unlock()
	for _, k := range keys {
		l.flush(k)
		l.mu.Lock()
		if r := l.keys[k]; r != nil {
			r.timer.Stop()
			delete(l.keys, k)
		}
		l.mu.Unlock()
	}
}

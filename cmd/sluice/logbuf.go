package main

import (
	"context"
	"io"
	"log/slog"
	"sync"
	"time"
)

// logBufferLimit is how many bytes of log lines logBuffer holds before the
// Write that passes it writes them out itself.
const logBufferLimit = 64 << 10

// logBuffer gathers the gateway's log lines and writes them in one write
// at most delay after the first of them, instead of one write per line.
// The gateway logs a canonical line per proxied request; on a busy gateway
// the write per line to a pipe (journald, a container runtime, a
// supervisor) cost more than the request's policy decision, and the
// reader on the other side paid as much again.
//
// Lines leave in the order they were written. A Write never waits for the
// underlying writer unless the buffer holds logBufferLimit bytes: then that
// Write writes everything out itself, so a writer that cannot keep up slows
// the logging goroutines instead of growing the buffer. Flush writes what
// is held; serve calls it before returning, and flushOnWarn after every
// warning or error, so that lines that need a person are never delayed.
// A crash loses at most the last delay of info lines: the audit log, not
// this one, is the record of what the gateway did.
type logBuffer struct {
	w     io.Writer
	delay time.Duration
	timer *time.Timer

	mu    sync.Mutex // guards buf and armed
	buf   []byte
	armed bool // the timer will flush buf

	wmu   sync.Mutex // held while writing to w, so lines leave in order
	spare []byte     // guarded by wmu: the buffer the last write emptied
}

func newLogBuffer(w io.Writer, delay time.Duration) *logBuffer {
	b := &logBuffer{w: w, delay: delay}
	b.timer = time.AfterFunc(time.Hour, b.Flush)
	b.timer.Stop()
	return b
}

// Write appends p, one log line from a slog handler, to the buffer.
func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	b.buf = append(b.buf, p...)
	full := len(b.buf) >= logBufferLimit
	if !full && !b.armed {
		b.armed = true
		b.timer.Reset(b.delay)
	}
	b.mu.Unlock()
	if full {
		b.Flush()
	}
	return len(p), nil
}

// Flush writes out every line written before it was called. A failed write
// is dropped, as slog drops its handler's errors: nothing can be logged
// about a log that cannot be written.
func (b *logBuffer) Flush() {
	b.wmu.Lock()
	defer b.wmu.Unlock()
	b.mu.Lock()
	out := b.buf
	b.buf, b.armed = b.spare[:0], false
	b.mu.Unlock()
	if len(out) > 0 {
		_, _ = b.w.Write(out)
	}
	if cap(out) > 4*logBufferLimit {
		out = nil // a burst of long lines: do not keep its buffer
	}
	b.spare = out
}

// flushOnWarn is a slog handler that flushes its logBuffer after each
// record at level warn or above.
type flushOnWarn struct {
	slog.Handler
	b *logBuffer
}

func (h flushOnWarn) Handle(ctx context.Context, r slog.Record) error {
	err := h.Handler.Handle(ctx, r)
	if r.Level >= slog.LevelWarn {
		h.b.Flush()
	}
	return err
}

func (h flushOnWarn) WithAttrs(as []slog.Attr) slog.Handler {
	return flushOnWarn{h.Handler.WithAttrs(as), h.b}
}

func (h flushOnWarn) WithGroup(name string) slog.Handler {
	return flushOnWarn{h.Handler.WithGroup(name), h.b}
}

// Package decisionlog exports a copy of every policy decision in OPA's
// decision-log shape (decision_id, path, input, result, bundles, timestamp,
// labels), masked by JSON pointers with OPA's erase semantics, to a file
// or POSTed in gzipped batches to a collector.
//
// The export is a copy: the gateway's audit log stays the record of
// truth. Log never blocks and never fails a call. Events wait in a
// bounded buffer; when it is full the oldest is dropped and counted, so a
// collector that is down or slow costs a bounded amount of memory and
// nothing on the call path.
//
// The package imports only the standard library.
package decisionlog

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Defaults for the zero values of Config.
const (
	DefaultBuffer  = 10000
	DefaultBatch   = 500
	DefaultFlush   = time.Second
	DefaultTimeout = 5 * time.Second
	// maxBackoff bounds the wait between retries of a failed batch.
	maxBackoff = 30 * time.Second
)

// Event is one decision in OPA's decision-log shape. Input is the input
// document as JSON, exactly as it was decided on.
type Event struct {
	DecisionID string            `json:"decision_id"`
	Path       string            `json:"path"`
	Input      json.RawMessage   `json:"input,omitempty"`
	Result     any               `json:"result"`
	Bundles    map[string]Bundle `json:"bundles,omitempty"`
	Revision   string            `json:"revision,omitempty"`
	Timestamp  time.Time         `json:"timestamp"`
	Labels     map[string]string `json:"labels"`
	Erased     []string          `json:"erased,omitempty"`
	// RequestID ties the event to the gateway's audit record and log
	// line (OPA's req_id is a number; sluice's request IDs are strings).
	RequestID string         `json:"request_id,omitempty"`
	Metrics   map[string]any `json:"metrics,omitempty"`
}

// Bundle is the revision of one bundle in force, as OPA reports it.
type Bundle struct {
	Revision string `json:"revision"`
}

// NewDecisionID returns a random RFC 4122 version 4 UUID, as OPA's
// decision IDs are.
func NewDecisionID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	h := hex.EncodeToString(b[:])
	return h[:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
}

// Config says where decisions go and how they are masked.
type Config struct {
	File string // append JSON lines here, or
	URL  string // POST gzipped JSON arrays here
	// Format is "opa" (default) or "ocsf".
	Format string
	// Mask are JSON pointers (/input/args/body/card_number) erased from
	// every event before it leaves; each erased pointer is listed in the
	// event's erased field, as OPA does.
	Mask    []string
	Labels  map[string]string
	Buffer  int
	Batch   int
	Flush   time.Duration
	Timeout time.Duration
	Client  *http.Client // for URL; nil = a client with Timeout and no proxy from the environment
	Logger  *slog.Logger
}

// Stats counts what the exporter did.
type Stats struct {
	Queued  int   // events waiting now
	Sent    int64 // events delivered
	Dropped int64 // events dropped because the buffer was full
	Failed  int64 // delivery attempts that failed (each retried)
}

// Exporter buffers events and delivers them in batches. Log is safe for
// concurrent use; Run delivers until its context ends.
type Exporter struct {
	cfg   Config
	log   *slog.Logger
	masks [][]string // parsed Mask

	mu     sync.Mutex
	ring   []Event // circular buffer of cfg.Buffer events
	head   int     // index of the oldest event
	n      int     // events in ring
	notify chan struct{}

	sent, dropped, failed atomic.Int64
}

// New checks cfg and builds an exporter.
func New(cfg Config) (*Exporter, error) {
	if (cfg.File == "") == (cfg.URL == "") {
		return nil, errors.New("decisionlog: want exactly one of file and url")
	}
	switch cfg.Format {
	case "":
		cfg.Format = "opa"
	case "opa", "ocsf":
	default:
		return nil, fmt.Errorf("decisionlog: format %q: want opa or ocsf", cfg.Format)
	}
	if cfg.Buffer <= 0 {
		cfg.Buffer = DefaultBuffer
	}
	if cfg.Batch <= 0 {
		cfg.Batch = DefaultBatch
	}
	if cfg.Flush <= 0 {
		cfg.Flush = DefaultFlush
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = DefaultTimeout
	}
	if cfg.Client == nil {
		cfg.Client = &http.Client{Timeout: cfg.Timeout, Transport: &http.Transport{Proxy: nil}}
	}
	x := &Exporter{cfg: cfg, log: cfg.Logger, ring: make([]Event, cfg.Buffer), notify: make(chan struct{}, 1)}
	if x.log == nil {
		x.log = slog.New(slog.DiscardHandler)
	}
	for i, m := range cfg.Mask {
		p, err := parsePointer(m)
		if err != nil {
			return nil, fmt.Errorf("decisionlog: mask[%d]: %w", i, err)
		}
		x.masks = append(x.masks, p)
	}
	return x, nil
}

// Log queues ev without blocking. When the buffer is full the oldest
// queued event is dropped (and counted) to make room.
func (x *Exporter) Log(ev Event) {
	if x == nil {
		return
	}
	if ev.Labels == nil {
		ev.Labels = x.cfg.Labels
	}
	x.mu.Lock()
	if x.n == len(x.ring) {
		x.ring[x.head] = Event{}
		x.head = (x.head + 1) % len(x.ring)
		x.n--
		x.dropped.Add(1)
	}
	x.ring[(x.head+x.n)%len(x.ring)] = ev
	x.n++
	full := x.n >= x.cfg.Batch
	x.mu.Unlock()
	if full {
		select {
		case x.notify <- struct{}{}:
		default:
		}
	}
}

// Stats returns the counters.
func (x *Exporter) Stats() Stats {
	x.mu.Lock()
	q := x.n
	x.mu.Unlock()
	return Stats{Queued: q, Sent: x.sent.Load(), Dropped: x.dropped.Load(), Failed: x.failed.Load()}
}

// take removes up to Batch of the oldest events.
func (x *Exporter) take() []Event {
	x.mu.Lock()
	defer x.mu.Unlock()
	k := min(x.n, x.cfg.Batch)
	out := make([]Event, k)
	for i := range k {
		out[i] = x.ring[x.head]
		x.ring[x.head] = Event{}
		x.head = (x.head + 1) % len(x.ring)
	}
	x.n -= k
	return out
}

// Run delivers batches until ctx ends, then makes one last attempt at
// what is queued (bounded by Timeout) and returns nil. A batch that fails
// is retried with backoff; meanwhile new events queue (and the oldest
// drop) as Log says.
func (x *Exporter) Run(ctx context.Context) error {
	t := time.NewTicker(x.cfg.Flush)
	defer t.Stop()
	var pending []Event
	backoff := 100 * time.Millisecond
	var retryAt time.Time
	for {
		select {
		case <-ctx.Done():
			x.final(pending)
			return nil
		case <-t.C:
		case <-x.notify:
		}
		for {
			if pending == nil {
				pending = x.take()
			}
			if len(pending) == 0 {
				pending = nil
				break
			}
			if time.Now().Before(retryAt) {
				break
			}
			if err := x.deliver(ctx, pending); err != nil {
				x.failed.Add(1)
				x.log.Warn("decisionlog: delivery failed; retrying", "events", len(pending), "retry_in", backoff.String(), "error", err)
				retryAt = time.Now().Add(backoff)
				backoff = min(backoff*2, maxBackoff)
				break
			}
			x.sent.Add(int64(len(pending)))
			pending, backoff, retryAt = nil, 100*time.Millisecond, time.Time{}
		}
	}
}

// final is the last delivery at shutdown, bounded by Timeout.
func (x *Exporter) final(pending []Event) {
	ctx, cancel := context.WithTimeout(context.Background(), x.cfg.Timeout)
	defer cancel()
	for {
		if pending == nil {
			pending = x.take()
		}
		if len(pending) == 0 {
			return
		}
		if err := x.deliver(ctx, pending); err != nil {
			x.failed.Add(1)
			x.dropped.Add(int64(len(pending)) + int64(x.Stats().Queued))
			x.log.Warn("decisionlog: events lost at shutdown", "events", len(pending), "error", err)
			return
		}
		x.sent.Add(int64(len(pending)))
		pending = nil
	}
}

// Encode returns ev as it leaves: masked, in the configured format.
func (x *Exporter) Encode(ev Event) ([]byte, error) {
	ev, err := x.mask(ev)
	if err != nil {
		return nil, err
	}
	if x.cfg.Format == "ocsf" {
		return json.Marshal(ocsf(ev))
	}
	return json.Marshal(ev)
}

func (x *Exporter) deliver(ctx context.Context, evs []Event) error {
	var body bytes.Buffer
	if x.cfg.File != "" {
		for _, ev := range evs {
			b, err := x.Encode(ev)
			if err != nil {
				x.log.Error("decisionlog: event skipped", "decision_id", ev.DecisionID, "error", err)
				continue
			}
			body.Write(b)
			body.WriteByte('\n')
		}
		f, err := os.OpenFile(x.cfg.File, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
		if err != nil {
			return err
		}
		_, err = f.Write(body.Bytes())
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		return err
	}
	zw := gzip.NewWriter(&body)
	// Writes to a gzip.Writer over a bytes.Buffer fail only at Close.
	_, _ = zw.Write([]byte{'['})
	first := true
	for _, ev := range evs {
		b, err := x.Encode(ev)
		if err != nil {
			x.log.Error("decisionlog: event skipped", "decision_id", ev.DecisionID, "error", err)
			continue
		}
		if !first {
			_, _ = zw.Write([]byte{','})
		}
		first = false
		_, _ = zw.Write(b)
	}
	_, _ = zw.Write([]byte{']'})
	if err := zw.Close(); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, x.cfg.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, x.cfg.URL, bytes.NewReader(body.Bytes()))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Content-Encoding", "gzip")
	resp, err := x.cfg.Client.Do(req)
	if err != nil {
		return err
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("collector answered %d", resp.StatusCode)
	}
	return nil
}

// parsePointer parses an RFC 6901 JSON pointer into its reference tokens.
// Its first token must be input or result: those are what OPA masks.
func parsePointer(p string) ([]string, error) {
	if !strings.HasPrefix(p, "/") {
		return nil, fmt.Errorf("%q: a JSON pointer starts with /", p)
	}
	toks := strings.Split(p[1:], "/")
	for i, t := range toks {
		toks[i] = strings.ReplaceAll(strings.ReplaceAll(t, "~1", "/"), "~0", "~")
	}
	if toks[0] != "input" && toks[0] != "result" {
		return nil, fmt.Errorf("%q: want a pointer under /input or /result", p)
	}
	if len(toks) < 2 {
		return nil, fmt.Errorf("%q: erasing the whole %s is not masking: name a field", p, toks[0])
	}
	return toks, nil
}

// mask erases each configured pointer that is present (OPA's erase: the
// field is removed, and its pointer listed in erased). A pointer that is
// absent is skipped; an index into an array is followed.
func (x *Exporter) mask(ev Event) (Event, error) {
	if len(x.masks) == 0 {
		return ev, nil
	}
	var input, result any
	if len(ev.Input) > 0 {
		dec := json.NewDecoder(bytes.NewReader(ev.Input))
		dec.UseNumber()
		if err := dec.Decode(&input); err != nil {
			return ev, fmt.Errorf("mask: input: %w", err)
		}
	}
	result = ev.Result
	if result != nil {
		b, err := json.Marshal(result)
		if err != nil {
			return ev, fmt.Errorf("mask: result: %w", err)
		}
		result = nil
		dec := json.NewDecoder(bytes.NewReader(b))
		dec.UseNumber()
		if err := dec.Decode(&result); err != nil {
			return ev, fmt.Errorf("mask: result: %w", err)
		}
	}
	var erased []string
	changedInput := false
	for i, toks := range x.masks {
		root := &input
		if toks[0] == "result" {
			root = &result
		}
		if erase(*root, toks[1:]) {
			erased = append(erased, x.cfg.Mask[i])
			if toks[0] == "input" {
				changedInput = true
			}
		}
	}
	if changedInput {
		b, err := json.Marshal(input)
		if err != nil {
			return ev, fmt.Errorf("mask: input: %w", err)
		}
		ev.Input = b
	}
	ev.Result = result
	ev.Erased = append(ev.Erased, erased...)
	return ev, nil
}

// erase removes the field toks names under v; it reports whether it was there.
func erase(v any, toks []string) bool {
	for len(toks) > 1 {
		switch c := v.(type) {
		case map[string]any:
			v = c[toks[0]]
		case []any:
			i, err := strconv.Atoi(toks[0])
			if err != nil || i < 0 || i >= len(c) {
				return false
			}
			v = c[i]
		default:
			return false
		}
		toks = toks[1:]
	}
	m, ok := v.(map[string]any)
	if !ok {
		return false
	}
	if _, ok := m[toks[0]]; !ok {
		return false
	}
	delete(m, toks[0])
	return true
}

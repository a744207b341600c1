package gateway

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-gw/sluice/gateway/audit"
	"github.com/sluice-gw/sluice/gateway/call"
	"github.com/sluice-gw/sluice/gateway/config"
)

// TestToolCallUpstreamPoolSizedToLoad holds issue 22's item 5: with more
// concurrent calls than the old fixed 64 idle connections per host, the
// upstream connections of one round of calls are all reused by the next,
// instead of 36 of them being closed and dialled again every round.
func TestToolCallUpstreamPoolSizedToLoad(t *testing.T) {
	const callers, rounds = 100, 4
	var (
		dials   atomic.Int64
		mu      sync.Mutex
		arrived int
		release = make(chan struct{})
	)
	// Each round's calls wait at the upstream until all of them are in
	// flight at once: the pool must then hold callers connections.
	up := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		arrived++
		ch := release
		if arrived == callers {
			arrived = 0
			release = make(chan struct{})
			close(ch)
		}
		mu.Unlock()
		select {
		case <-ch:
		case <-time.After(10 * time.Second):
			http.Error(w, "round never filled", http.StatusGatewayTimeout)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"tickets":[]}`)
	}))
	up.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			dials.Add(1)
		}
	}
	up.Start()
	t.Cleanup(up.Close)
	g := startGateway(t, up.URL, "", func(c *config.Config) { c.Gateway.MaxConnections, c.Gateway.MaxConnectionsPerSandbox = 512, 256 })
	clients := make([]*http.Client, callers)
	for i := range clients {
		clients[i] = g.client(agentA)
	}
	perRound := make([]int64, rounds)
	for r := range rounds {
		before := dials.Load()
		var wg sync.WaitGroup
		errs := make(chan error, callers)
		for _, c := range clients {
			wg.Add(1)
			go func() {
				defer wg.Done()
				resp, err := c.Post("http://sluice/v1/tools/tickets.list_tickets", "application/json", strings.NewReader(`{"query":{"limit":5}}`))
				if err != nil {
					errs <- err
					return
				}
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					errs <- fmt.Errorf("status %d: %s", resp.StatusCode, b)
				}
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatalf("round %d: %v", r, err)
		}
		perRound[r] = dials.Load() - before
	}
	if perRound[0] != callers {
		t.Errorf("first round dialled %d upstream connections, want %d (one per call in flight)", perRound[0], callers)
	}
	for r := 1; r < rounds; r++ {
		if perRound[r] != 0 {
			t.Errorf("round %d dialled %d new upstream connections, want 0: the idle pool dropped connections the load needs (dials per round %v)", r, perRound[r], perRound)
		}
	}
}

// TestAppendResultIsMarshal holds the tool API's hand-written 200 answer
// byte for byte equal to json.Marshal of the same result, whatever the
// upstream's reply held.
func TestAppendResultIsMarshal(t *testing.T) {
	replies := map[string]*call.Reply{
		"compact JSON":         {Status: 200, Headers: map[string][]string{"Content-Type": {"application/json"}, "X-B": {"1", "2"}}, Body: json.RawMessage(`{"id":"T-1","n":[1,2.5e3,null,true]}`)},
		"JSON with whitespace": {Status: 201, Headers: map[string][]string{}, Body: json.RawMessage("{ \"a\" :\t[1, 2]\n}")},
		"JSON with HTML":       {Status: 200, Body: json.RawMessage(`{"h":"<b>&amp;</b>"}`)},
		"JSON with U+2028":     {Status: 200, Body: json.RawMessage("[\"a\u2028b\u2029\",\"€\"]")},
		"JSON scalar":          {Status: 200, Body: json.RawMessage(`"plain"`)},
		"text":                 {Status: 200, Headers: map[string][]string{"Content-Type": {"text/plain; charset=utf-8"}}, Body: "line 1\nline <2> & \"3\"\x01\u2028"},
		"invalid UTF-8 text":   {Status: 200, Body: "a\xffb"},
		"base64":               {Status: 200, Body: "AAEC/w==", BodyEncoding: "base64"},
		"no body":              {Status: 204, Headers: map[string][]string{"X-Nil": nil}},
		"empty raw":            {Status: 200, Body: json.RawMessage(nil)},
		"odd header names":     {Status: 200, Headers: map[string][]string{"X-\"q\"": {"<v>", ""}, "a": {}}},
	}
	for name, r := range replies {
		t.Run(name, func(t *testing.T) {
			checkResultEncoding(t, r, "0123456789abcdef01234567")
		})
	}
	// Another body type is left to encoding/json.
	if _, ok := appendResult(nil, &call.Reply{Status: 200, Body: map[string]any{"a": 1}}, "r"); ok {
		t.Error("appendResult encoded a map body; it must leave it to encoding/json")
	}
}

func checkResultEncoding(t *testing.T, r *call.Reply, rid string) {
	t.Helper()
	want, err := json.Marshal(replyBody(call.Outcome{Reply: r, RequestID: rid}))
	if err != nil {
		if _, ok := appendResult(nil, r, rid); ok {
			t.Fatalf("json.Marshal fails (%v) but appendResult encoded it", err)
		}
		return
	}
	got, ok := appendResult(nil, r, rid)
	if !ok {
		t.Fatalf("appendResult declined %#v", r)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("appendResult:\n got %s\nwant %s", got, want)
	}
}

func FuzzAppendResult(f *testing.F) {
	f.Add(200, "Content-Type", "application/json", []byte(`{"a":[1,2]}`), true)          // compact JSON
	f.Add(200, "X-A", "<v>", []byte("{ \"a\" : \"<&>\u2028\" }"), true)                  // JSON to compact and escape
	f.Add(502, "", "", []byte("text \x00 with a control and \xff invalid UTF-8"), false) // text
	f.Fuzz(func(t *testing.T, status int, hk, hv string, body []byte, asJSON bool) {
		r := &call.Reply{Status: status, Headers: map[string][]string{hk: {hv}}}
		switch {
		case asJSON && json.Valid(body):
			r.Body = json.RawMessage(body) // roundTrip embeds only what json.Valid accepts
		default:
			r.Body = string(body)
		}
		checkResultEncoding(t, r, hv)
	})
}

// TestToolCallAuditGroupCommit holds issue 22's concurrency goal for the
// audit log: concurrent tool calls share fsyncs. Every call writes two
// records and waits for one fsync (its decision is written before the
// upstream is dialled, its result is made durable with the decision
// before the answer), so calls one at a time make two records per fsync;
// concurrent calls on a disk must make more, each caller still answered
// only after the fsync that covers its records (audit.Log's own tests).
func TestToolCallAuditGroupCommit(t *testing.T) {
	if testing.Short() {
		t.Skip("fsyncs on the test's disk")
	}
	up := newUpstream(t)
	g := startGateway(t, up.URL, "", nil) // audit log in the test's directory, on the disk
	const callers, each = 8, 25
	s0 := g.audit.Stats()
	var wg sync.WaitGroup
	errs := make(chan error, callers)
	for range callers {
		c := g.client(agentA)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range each {
				resp, err := c.Post("http://sluice/v1/tools/tickets.list_tickets", "application/json", strings.NewReader(`{"query":{"limit":5}}`))
				if err != nil {
					errs <- err
					return
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					errs <- fmt.Errorf("status %d", resp.StatusCode)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	s1 := g.audit.Stats()
	records, syncs := s1.Records-s0.Records, s1.Syncs-s0.Syncs
	if records < 2*callers*each {
		t.Fatalf("%d records for %d calls, want 2 a call", records, callers*each)
	}
	factor := float64(records) / float64(max(syncs, 1))
	t.Logf("%d records, %d fsyncs: %.1f records per fsync", records, syncs, factor)
	if factor <= 2 {
		t.Errorf("%.2f records per fsync from %d concurrent callers: no better than calls one at a time (2), the fsync is not shared", factor, callers)
	}
}

// TestToolCallUpstreamStrayResponseNeverReachesAnotherCall (THREATS F22):
// a hostile upstream answers a call and sends a second, unasked-for
// response after it (201, its own body) on the same connection, for the
// next call there, another sandbox's, to read. The connection is not
// kept: the second call is dialled anew, its sandbox gets its own answer,
// and its result record names its own upstream status (200), not the
// stray 201.
func TestToolCallUpstreamStrayResponseNeverReachesAnotherCall(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	const stray = "HTTP/1.1 201 Created\r\nContent-Type: application/json\r\nContent-Length: 16\r\n\r\n{\"stray\":\"yes\"}\n"
	var accepted atomic.Int32
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			n := accepted.Add(1)
			go func() {
				defer c.Close()
				req, err := http.ReadRequest(bufio.NewReader(c))
				if err != nil {
					return
				}
				_, _ = io.Copy(io.Discard, req.Body)
				body := fmt.Sprintf(`{"conn":%d}`, n)
				_, _ = fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s%s", len(body), body, stray)
				time.Sleep(5 * time.Second) // open: only the gateway can refuse the connection
			}()
		}
	}()
	g := startGateway(t, "http://"+l.Addr().String(), "", nil)
	other := agentA
	other.Sandbox = "sb-2"
	r1 := doCall(t, g.client(agentA), "tickets.list_tickets", `{"query":{"limit":5}}`)
	r2 := doCall(t, g.client(other), "tickets.list_tickets", `{"query":{"limit":5}}`)
	if r1.status != 200 || !strings.Contains(r1.raw, `"body":{"conn":1}`) {
		t.Fatalf("first call: %d %s", r1.status, r1.raw)
	}
	if r2.status != 200 || !strings.Contains(r2.raw, `"body":{"conn":2}`) || strings.Contains(r2.raw, "stray") {
		t.Fatalf("the second call read %d %s, want its own answer from a new connection", r2.status, r2.raw)
	}
	if accepted.Load() != 2 {
		t.Fatalf("%d upstream connections, want 2: the one with a stray response was reused", accepted.Load())
	}
	rid, _ := r2.body["request_id"].(string)
	var result *audit.Record
	for _, rec := range auditEvents(t, g) {
		if rec.RequestID == rid && rec.Event == call.EventResult {
			result = &rec
		}
	}
	if result == nil {
		t.Fatalf("no result record for the second call %q", rid)
	}
	if st, _ := result.Fields["upstream_status"].(float64); st != 200 {
		t.Fatalf("the second call's result record has upstream_status %v, want its own 200: %v", result.Fields["upstream_status"], result.Fields)
	}
}

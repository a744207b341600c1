//go:build linux

package fault

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/sluice-gw/sluice/gateway/store/pgtest"
	"github.com/sluice-gw/sluice/test/internal/casebook"
	"github.com/sluice-gw/sluice/test/internal/gwenv"
)

// TestReplicasOnPostgres runs three real `sluice serve` replicas on one
// real PostgreSQL server (reached over its Unix socket from the test's
// network namespace), each with its own audit log:
//   - G16: started together on an empty database, they migrate it once and
//     each checks its own audit file against its own head;
//   - G15: a hold asked on replica A, approved 50 times at once through the
//     three admin APIs, is executed once (one upstream request, one 200,
//     49 refusals) and its result is answered to the agent on A;
//   - B12: the agent's pending-hold cap holds across the replicas in total;
//   - G14: with PostgreSQL stopped every replica refuses calls 503
//     store_unavailable, sends nothing, audits the refusal and turns
//     /readyz 503; with it back they serve again, no restart;
//   - G17: `sluice audit verify --heads` passes on the 3 replicas' files
//     and fails, naming the file, when one is cut behind the head its
//     replica recorded; `audit hold` traces the raced hold across them.
func TestReplicasOnPostgres(t *testing.T) {
	srv := pgtest.StartT(t, pgtest.Options{})
	db := srv.NewDatabaseT(t)
	dsn := srv.SocketURL(db) + "&statement_timeout=1s"
	e := newEnv(t)
	docs := make([]gwenv.Doc, 3)
	paths := make([]string, 3)
	for i := range docs {
		docs[i] = e.BaseConfig(fmt.Sprintf("r%d", i))
		docs[i]["store"] = dsn
		// One host: the default (the host name) would be the same for all.
		docs[i].Gateway()["replica_id"] = fmt.Sprintf("r%d", i)
		docs[i].Gateway()["max_pending_holds"] = 3
		docs[i].Gateway()["max_pending_holds_per_sandbox"] = 3
		docs[i].Gateway()["hold_wait"] = "50ms"
		// agent-b: a sandbox of its own, limited, granted the tickets tools.
		docs[i]["agents"] = []map[string]any{
			{"name": "agent-a", "connectors": []string{"tickets"}},
			{"name": "agent-b", "connectors": []string{"tickets"}, "rate_limit": map[string]any{"per_second": 10, "burst": 10}},
		}
		paths[i] = e.Write(docs[i])
	}
	g16 := casebook.Expect(t, "G16", "3 replicas started together on an empty PostgreSQL database",
		"all 3 ready; each migration applied once (advisory lock); each replica's audit head recorded apart")
	gs := make([]*gwenv.Gateway, 3)
	for i := range gs {
		gs[i] = e.Launch(docs[i], paths[i])
	}
	for _, g := range gs {
		g.AwaitSocket()
		g.AwaitReady()
	}
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, srv.SuperURL(db))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var rows, versions, heads int
	if err := conn.QueryRow(ctx, `SELECT COUNT(*), COUNT(DISTINCT version) FROM schema_migrations`).Scan(&rows, &versions); err != nil {
		t.Fatal(err)
	}
	if err := conn.QueryRow(ctx, `SELECT COUNT(*) FROM audit_heads`).Scan(&heads); err != nil {
		t.Fatal(err)
	}
	g16.Observef("3 ready; schema_migrations %d rows, %d versions; %d audit heads", rows, versions, heads)
	if rows != versions || rows < 8 || heads != 3 {
		t.Fatalf("schema_migrations %d rows / %d versions, audit heads %d; want one row per version and 3 heads", rows, versions, heads)
	}

	a := gs[0]
	var raced string // the hold of the approval race
	t.Run("approval race", func(t *testing.T) {
		c := casebook.Expect(t, "G15", "one hold asked on replica A, 50 concurrent approvals spread over the 3 replicas' admin APIs",
			"one 200, 49 409 conflict; one upstream request; one hold_approved across the 3 audit logs; the agent's poll on A answers 200 with the result")
		ask := a.Call(agentA, "tickets.create_refund", `{"body":{"amount":50}}`)
		if ask.Status != http.StatusAccepted || ask.HoldID == "" {
			t.Fatalf("ask: %d %s", ask.Status, ask.Body)
		}
		raced = ask.HoldID
		before := len(e.Up.Requests())
		var mu sync.Mutex
		statuses := map[int]int{}
		var wg sync.WaitGroup
		start := make(chan struct{})
		for i := range 50 {
			wg.Go(func() {
				<-start
				st, _, _ := gs[i%3].For(t).AdminDo(http.MethodPost, "/api/v1/holds/"+ask.HoldID+"/approve", gwenv.CarolToken, `{"reason":"ok"}`)
				mu.Lock()
				statuses[st]++
				mu.Unlock()
			})
		}
		close(start)
		wg.Wait()
		sent := len(e.Up.Requests()) - before
		approved := 0
		for _, g := range gs {
			approved += len(g.AuditEvent("hold_approved", ask.HoldID))
		}
		p := poll(a, ask.HoldID)
		c.Observef("approvals %v; upstream requests %d; hold_approved records %d; poll on A %d", statuses, sent, approved, p.Status)
		if statuses[http.StatusOK] != 1 || statuses[http.StatusConflict] != 49 || sent != 1 || approved != 1 {
			t.Fatalf("approvals %v, %d upstream requests, %d hold_approved; want one 200, 49 409, 1, 1", statuses, sent, approved)
		}
		if p.Status != http.StatusOK || p.Result.Status == 0 {
			t.Fatalf("poll on A: %d %s, want 200 with the upstream result", p.Status, p.Body)
		}
	})

	t.Run("wake across replicas", func(t *testing.T) {
		c := casebook.Expect(t, "G15", "the agent long-polls its hold on replica A (?wait=20s); an approver approves it through replica B's admin API",
			"the poll on A answers 200 with the upstream result soon after B's approval (LISTEN/NOTIFY), not at the end of the wait")
		ask := a.Call(agentA, "tickets.create_refund", `{"body":{"amount":51}}`)
		if ask.Status != http.StatusAccepted || ask.HoldID == "" {
			t.Fatalf("ask: %d %s", ask.Status, ask.Body)
		}
		got := make(chan gwenv.Reply, 1)
		go func() { got <- a.For(t).Do(agentA, http.MethodGet, "/v1/holds/"+ask.HoldID+"?wait=20s", "", nil) }()
		time.Sleep(200 * time.Millisecond) // the poll is waiting
		st, _, _ := gs[1].For(t).AdminDo(http.MethodPost, "/api/v1/holds/"+ask.HoldID+"/approve", gwenv.CarolToken, `{"reason":"ok"}`)
		approved := time.Now()
		var p gwenv.Reply
		select {
		case p = <-got:
		case <-time.After(25 * time.Second):
			t.Fatal("the poll on A never returned")
		}
		after := time.Since(approved)
		c.Observef("approve on B %d; poll on A %d (result status %d) %s after B answered", st, p.Status, p.Result.Status, after.Round(time.Millisecond))
		if st != http.StatusOK || p.Status != http.StatusOK || p.Result.Status == 0 || after > 5*time.Second {
			t.Fatalf("approve on B %d; poll on A %d %s, %s after; want 200 with the result well before the 20s wait ends", st, p.Status, p.Body, after)
		}
	})

	t.Run("pending cap", func(t *testing.T) {
		c := casebook.Expect(t, "B12", "agent-a asks 5 different calls spread over 3 replicas with max_pending_holds 3",
			"3 held (202) in total, then 429 rate_limited on whichever replica; nothing sent")
		before := len(e.Up.Requests())
		var got []string
		held := 0
		for i := range 5 {
			r := gs[i%3].Call(agentA, "tickets.create_refund", fmt.Sprintf(`{"body":{"amount":%d}}`, 200+i))
			got = append(got, fmt.Sprintf("r%d:%d %s", i%3, r.Status, r.Code))
			if r.Status == http.StatusAccepted {
				held++
			} else if r.Status != http.StatusTooManyRequests || r.Code != "rate_limited" {
				t.Errorf("ask %d on replica %d: %d %s", i, i%3, r.Status, r.Body)
			}
		}
		sent := len(e.Up.Requests()) - before
		c.Observef("%s; upstream requests %d", strings.Join(got, ", "), sent)
		if held != 3 || sent != 0 {
			t.Fatalf("%d held, %d sent; want 3 held in total, 0 sent (%v)", held, sent, got)
		}
	})

	t.Run("rate limit", func(t *testing.T) {
		c := casebook.Expect(t, "B12", "agent-b's sandbox floods list_tickets through 3 replicas for 2s with rate_limit 10/s burst 10",
			"about burst + 10/s allowed in total (±10%), not 3×; the rest 429 rate_limited; the upstream sees only the allowed")
		before := len(e.Up.Requests())
		var mu sync.Mutex
		counts := map[int]int{}
		start := time.Now()
		var wg sync.WaitGroup
		for i := range 6 {
			wg.Go(func() {
				for time.Since(start) < 2*time.Second {
					r := gs[i%3].For(t).Call(gwenv.AgentB, "tickets.list_tickets", `{}`)
					mu.Lock()
					counts[r.Status]++
					mu.Unlock()
				}
			})
		}
		wg.Wait()
		el := time.Since(start).Seconds()
		want := 10 + 10*el
		sent := len(e.Up.Requests()) - before
		c.Observef("%.1fs: statuses %v; limit %.0f; upstream requests %d", el, counts, want, sent)
		if got := float64(counts[http.StatusOK]); got > want*1.1 || got < want*0.9 || counts[http.StatusTooManyRequests] == 0 || sent != counts[http.StatusOK] {
			t.Fatalf("statuses %v in %.1fs, %d upstream requests; want %.0f (±10%%) allowed in total, the rest 429", counts, el, sent, want)
		}
	})

	t.Run("postgres down", func(t *testing.T) {
		c := casebook.Expect(t, "G14", "PostgreSQL stopped (pg_ctl -m immediate) under 3 replicas, then started again",
			"each replica: tool call 503 store_unavailable, nothing sent, refusal audited; /readyz 503; after restart 200 and ready, no gateway restart")
		before := len(e.Up.Requests())
		if err := srv.Stop(); err != nil {
			t.Fatal(err)
		}
		time.Sleep(700 * time.Millisecond) // past the replicas' cached session answers
		var obs []string
		for i, g := range gs {
			r := g.Call(agentA, "tickets.list_tickets", `{}`)
			ready, _, _ := g.AdminGet("/readyz")
			audited := auditedWith(g, r.RequestID, "store_unavailable")
			obs = append(obs, fmt.Sprintf("r%d: %d %s, readyz %d, audited %v", i, r.Status, r.Code, ready, audited))
			if r.Status != http.StatusServiceUnavailable || r.Code != "store_unavailable" || ready != http.StatusServiceUnavailable || !audited {
				t.Errorf("replica %d while down: call %d %s, readyz %d, audited %v", i, r.Status, r.Body, ready, audited)
			}
		}
		sent := len(e.Up.Requests()) - before
		if err := srv.StartAgain(); err != nil {
			t.Fatal(err)
		}
		for i, g := range gs {
			deadline := time.Now().Add(20 * time.Second)
			for {
				r := g.Call(agentA, "tickets.list_tickets", `{}`)
				if r.Status == http.StatusOK {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("replica %d after PostgreSQL came back: %d %s", i, r.Status, r.Body)
				}
				time.Sleep(200 * time.Millisecond)
			}
			g.AwaitReady()
		}
		c.Observef("%s; upstream requests while down %d; all 3 serve and are ready after restart", strings.Join(obs, "; "), sent)
		for i, g := range gs {
			if strings.Contains(string(g.Stderr()), srv.Password) {
				t.Errorf("replica %d's log shows the database password", i)
			}
		}
		if sent != 0 {
			t.Fatalf("%d upstream requests while PostgreSQL was down", sent)
		}
	})

	t.Run("audit verify heads", func(t *testing.T) {
		c := casebook.Expect(t, "G17", "replica r1's audit file cut behind the head r1 recorded in PostgreSQL, then `sluice audit verify --heads` over the 3 replicas' files",
			"the intact files pass; the cut file fails naming it, the recorded seq and the last seq found; exit non-zero; no password shown")
		heads := srv.SuperURL(db)
		args := []string{"audit", "verify", "--heads", heads}
		for _, g := range gs {
			args = append(args, "--file", g.Audit)
		}
		out, err := e.CLI("", args...)
		if err != nil || strings.Count(out, "ok: replica r") != 3 || strings.Contains(out, "FAIL") {
			t.Fatalf("intact files: %v\n%s", err, out)
		}
		// A connection of its own: PostgreSQL was restarted above.
		conn, err := pgx.Connect(ctx, heads)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close(ctx)
		var seq int64
		if err := conn.QueryRow(ctx, `SELECT seq FROM audit_heads WHERE log = 'r1'`).Scan(&seq); err != nil || seq < 2 {
			t.Fatalf("r1's head: %d %v", seq, err)
		}
		data, err := os.ReadFile(gs[1].Audit)
		if err != nil {
			t.Fatal(err)
		}
		// Cut the file just before the record at the head's seq: a line is
		// not a seq (a replica restarted mid-test writes its marker and
		// carries on), so the records' own seq fields say where to cut and
		// where the cut file ends.
		lines := strings.SplitAfter(string(data), "\n")
		at, last := -1, int64(0)
		for i := len(lines) - 1; i > 0; i-- {
			if lineSeq(lines[i]) == seq {
				at, last = i, lineSeq(lines[i-1])
				break
			}
		}
		if at < 0 || last <= 0 {
			t.Fatalf("r1's file has no record at its head's seq %d before which to cut", seq)
		}
		cut := filepath.Join(t.TempDir(), "r1-cut.log")
		if err := os.WriteFile(cut, []byte(strings.Join(lines[:at], "")), 0o600); err != nil {
			t.Fatal(err)
		}
		out, err = e.CLI("", "audit", "verify", "--heads", heads, "--file", gs[0].Audit, "--file", cut, "--file", gs[2].Audit)
		// The replicas still write (their heads move on after each batch),
		// so the head verify reads may be newer than the one read above:
		// it must be at least that one, and the cut file must end before it.
		want := regexp.MustCompile(`FAIL: ` + regexp.QuoteMeta(cut) + fmt.Sprintf(` \(replica r1\): ends at seq %d, before the recorded head's seq (\d+)`, last))
		c.Observef("exit %v; %s", err, strings.TrimSpace(out))
		m := want.FindStringSubmatch(out)
		if err == nil || m == nil || strings.Count(out, "FAIL: ") != 1 || strings.Count(out, "ok: replica r") != 2 {
			t.Fatalf("cut file: %v; want exactly one %q:\n%s", err, want, out)
		}
		if got, _ := strconv.ParseInt(m[1], 10, 64); got < seq {
			t.Fatalf("verify read r1's head at seq %d, older than the %d recorded before the cut", got, seq)
		}
		if strings.Contains(out, srv.Password) {
			t.Fatalf("verify shows the database password:\n%s", out)
		}
		if raced == "" {
			t.Skip("no hold from the approval race")
		}
		out, err = e.CLI("", "audit", "hold", raced, "--file", gs[2].Audit, "--file", gs[1].Audit, "--file", gs[0].Audit)
		if err != nil || !strings.Contains(strings.SplitN(out, "\n", 2)[0], " r0 "+gs[0].Audit) || !strings.Contains(out, " hold_created ") || strings.Count(out, " hold_approved ") != 1 {
			t.Fatalf("audit hold %s: %v; want r0's hold_created first and one hold_approved:\n%s", raced, err, out)
		}
	})
}

// auditedWith says whether g's audit log has a record of request rid
// that mentions want.
func auditedWith(g *gwenv.Gateway, rid, want string) bool {
	for _, r := range g.AuditRecords() {
		if r["request_id"] == rid && strings.Contains(fmt.Sprint(r), want) {
			return true
		}
	}
	return false
}

// lineSeq is the seq of an audit line ({"seq":N,…}), or -1.
func lineSeq(line string) int64 {
	rest, ok := strings.CutPrefix(line, `{"seq":`)
	if !ok {
		return -1
	}
	end := strings.IndexByte(rest, ',')
	if end < 0 {
		return -1
	}
	n, err := strconv.ParseInt(rest[:end], 10, 64)
	if err != nil {
		return -1
	}
	return n
}

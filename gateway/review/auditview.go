package review

import (
	"maps"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/sluice-gw/sluice/gateway/audit"
)

// Page sizes of the audit table and of a session's timeline.
const (
	auditPage    = 50
	auditPageMax = 500
	timelinePage = 1000
)

// auditFilter is the audit table's filters: a record is listed when every
// filter that is set equals its field exactly.
type auditFilter struct {
	Event, Tool, User, Decision, Hold, Session, Agent string
}

func (f auditFilter) empty() bool { return f == auditFilter{} }

func (f auditFilter) match(r audit.Record, b audit.Brief) bool {
	for _, c := range [][2]string{{f.Event, r.Event}, {f.Tool, b.Tool}, {f.User, b.User}, {f.Decision, b.Decision},
		{f.Hold, b.Hold}, {f.Session, b.Session}, {f.Agent, b.Agent}} {
		if c[0] != "" && c[0] != c[1] {
			return false
		}
	}
	return true
}

// query is the filters as URL parameters, for links that keep them.
func (f auditFilter) query() url.Values {
	q := url.Values{}
	for k, v := range map[string]string{"event": f.Event, "tool": f.Tool, "user": f.User, "decision": f.Decision,
		"hold": f.Hold, "session": f.Session, "agent": f.Agent} {
		if v != "" {
			q.Set(k, v)
		}
	}
	return q
}

// auditRow is one line of the log as the table and the timeline show it.
type auditRow struct {
	Line     int
	Seq      uint64
	Time     time.Time
	Event    string
	Brief    audit.Brief
	ReqID    string
	Verified bool
	Err      string // the line is not a record: why
	Doc      []Seg  // the whole line, pretty-printed, behind a <details>
}

func newRow(e audit.Entry) auditRow {
	r := auditRow{Line: e.Line, Verified: e.Verified, Err: e.Err}
	if e.Err == "" {
		r.Seq, r.Time, r.Event, r.ReqID = e.Record.Seq, e.Record.Time, e.Record.Event, e.Record.RequestID
		r.Brief = audit.Briefly(e.Record)
	}
	r.Doc = prettyJSON(e.Raw)
	return r
}

// badge says whether the chain verifies from the file's first line through
// the newest line shown.
type badge struct {
	OK      bool
	Through int // the newest line shown (0: nothing shown; the whole file)
	Text    string
	Chain   string // audit.Chain's own statement
}

func newBadge(ch audit.Chain, newest int) badge {
	b := badge{Through: newest, Chain: ch.String()}
	last := newest
	if last == 0 {
		last = ch.Lines
	}
	switch {
	case ch.Break == nil || last < ch.Break.Line:
		b.OK = true
		if newest == 0 {
			b.Text = "Chain verifies: all " + strconv.Itoa(ch.Verified) + " records"
		} else {
			b.Text = "Chain verifies up to the last record shown (line " + strconv.Itoa(newest) + ")"
		}
	case ch.Break.Unfinished:
		b.Text = "Unfinished write at line " + strconv.Itoa(ch.Break.Line) + " (not tampering): the records before it verify"
		b.OK = last < ch.Break.Line
	default:
		b.Text = "Chain broken at line " + strconv.Itoa(ch.Break.Line) + ": " + ch.Break.Reason +
			" — the records from there on are not proven"
	}
	return b
}

// auditPageData is what audit.html gets.
type auditPageData struct {
	Filter       auditFilter
	Events       []string // event names in the file, for the filter's list
	Decisions    []string
	Rows         []auditRow
	Badge        badge
	Newer, Older string // links to the neighbouring pages ("" at an end)
	Skipped      []auditRow
	SkippedMore  int
	N            int
	Configured   bool
}

// handleAudit is the audit log as a table, newest first, filtered and
// paged by line number (before=L: older than line L; after=L: newer), so
// records appended while someone pages do not shift the pages.
func (u *UI) handleAudit(w http.ResponseWriter, r *http.Request, s *session) {
	q := r.URL.Query()
	f := auditFilter{Event: q.Get("event"), Tool: q.Get("tool"), User: q.Get("user"), Decision: q.Get("decision"),
		Hold: q.Get("hold"), Session: q.Get("session"), Agent: q.Get("agent")}
	n := auditPage
	if v, err := strconv.Atoi(q.Get("n")); err == nil && v > 0 {
		n = min(v, auditPageMax)
	}
	before, _ := strconv.Atoi(q.Get("before"))
	after, _ := strconv.Atoi(q.Get("after"))
	d := auditPageData{Filter: f, N: n, Configured: u.opt.AuditFile != ""}
	if !d.Configured {
		u.render(w, http.StatusOK, "audit", u.page(s, "Audit", "audit", d))
		return
	}
	events, decisions := map[string]bool{}, map[string]bool{}
	var (
		ring          []audit.Entry // the newest n+1 matches older than before
		olderExists   bool          // after mode: a match at or before after
		newerExists   bool          // before mode: a match at or after before
		firstAfter    []audit.Entry // after mode: the oldest n+1 matches newer than after
		skippedLines  []auditRow
		skippedBeyond int
	)
	ch, err := audit.Scan(u.opt.AuditFile, func(e audit.Entry) {
		if e.Err != "" {
			if len(skippedLines) < 20 {
				skippedLines = append(skippedLines, auditRow{Line: e.Line, Err: e.Err})
			} else {
				skippedBeyond++
			}
			if !f.empty() {
				return // an unreadable line matches no filter
			}
		} else {
			events[e.Record.Event] = true
			b := audit.Briefly(e.Record)
			if b.Decision != "" {
				decisions[b.Decision] = true
			}
			if !f.match(e.Record, b) {
				return
			}
		}
		switch {
		case after > 0 && e.Line <= after:
			olderExists = true
		case after > 0:
			if len(firstAfter) <= n {
				e.Raw = slices.Clone(e.Raw)
				firstAfter = append(firstAfter, e)
			}
		case before > 0 && e.Line >= before:
			newerExists = true
		default:
			if len(ring) > n { // reuse the oldest's memory
				old := ring[0]
				ring = append(ring[1:], e)
				ring[len(ring)-1].Raw = append(old.Raw[:0], e.Raw...)
			} else {
				e.Raw = slices.Clone(e.Raw)
				ring = append(ring, e)
			}
		}
	})
	if err != nil {
		u.log.Error("review: audit read", "err", err.Error())
		u.fail(w, r, s, http.StatusServiceUnavailable, "The audit log cannot be read right now.")
		return
	}
	var shown []audit.Entry
	if after > 0 {
		newerExists = len(firstAfter) > n
		shown = firstAfter[:min(n, len(firstAfter))]
	} else {
		olderExists = len(ring) > n
		shown = ring[max(0, len(ring)-n):]
	}
	rows := make([]auditRow, len(shown))
	for i, e := range shown {
		rows[len(shown)-1-i] = newRow(e) // newest first
	}
	link := func(k string, line int) string {
		v := f.query()
		v.Set(k, strconv.Itoa(line))
		if n != auditPage {
			v.Set("n", strconv.Itoa(n))
		}
		return "/audit?" + v.Encode()
	}
	if len(rows) > 0 {
		if newerExists {
			d.Newer = link("after", rows[0].Line)
		}
		if olderExists {
			d.Older = link("before", rows[len(rows)-1].Line)
		}
	}
	d.Rows, d.Skipped, d.SkippedMore = rows, skippedLines, skippedBeyond
	newest := 0
	if len(rows) > 0 {
		newest = rows[0].Line
	}
	d.Badge = newBadge(ch, newest)
	d.Events, d.Decisions = slices.Sorted(maps.Keys(events)), slices.Sorted(maps.Keys(decisions))
	u.render(w, http.StatusOK, "audit", u.page(s, "Audit", "audit", d))
}

// timelineData is what timeline.html gets.
type timelineData struct {
	Session    string
	Rows       []auditRow
	Badge      badge
	Later      string // the next page's link ("" at the end)
	Configured bool
	Kinds      map[string]int
}

// handleTimeline is one session's records in the order they were written:
// every tool call, proxied request, tunnel, DNS question, decision, hold
// and result the gateway recorded for it — what a reviewer reads to replay
// what an agent did. Paged by line (after=L) at timelinePage records.
func (u *UI) handleTimeline(w http.ResponseWriter, r *http.Request, s *session) {
	sess := r.PathValue("session")
	after, _ := strconv.Atoi(r.URL.Query().Get("after"))
	d := timelineData{Session: sess, Configured: u.opt.AuditFile != "", Kinds: map[string]int{}}
	if !d.Configured {
		u.render(w, http.StatusOK, "timeline", u.page(s, "Session "+sess, "audit", d))
		return
	}
	more := false
	ch, err := audit.Scan(u.opt.AuditFile, func(e audit.Entry) {
		if e.Err != "" || e.Line <= after || e.Record.Field("session") != sess {
			return
		}
		if len(d.Rows) >= timelinePage {
			more = true
			return
		}
		row := newRow(e)
		d.Kinds[row.Brief.Kind]++
		d.Rows = append(d.Rows, row)
	})
	if err != nil {
		u.log.Error("review: audit read", "err", err.Error())
		u.fail(w, r, s, http.StatusServiceUnavailable, "The audit log cannot be read right now.")
		return
	}
	newest := 0
	if len(d.Rows) > 0 {
		newest = d.Rows[len(d.Rows)-1].Line
		if more {
			d.Later = "/sessions/" + url.PathEscape(sess) + "?after=" + strconv.Itoa(newest)
		}
	}
	d.Badge = newBadge(ch, newest)
	u.render(w, http.StatusOK, "timeline", u.page(s, "Session "+strings.TrimSpace(sess), "audit", d))
}

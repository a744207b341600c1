//go:build linux

package e2e

import (
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sluice-gw/sluice/test/internal/casebook"
)

// notesSpec is a one-operation API whose query parameter q has a pattern
// outside the RE2 subset (\s), so the gateway matches it with regexp2 and
// its backtracking is what bounds the match.
const notesSpec = `openapi: 3.0.3
info: {title: notes, version: "1"}
servers: [{url: http://notes.invalid}]
paths:
  /tickets:
    get:
      operationId: searchNotes
      parameters:
        - name: q
          in: query
          required: true
          schema: {type: string, maxLength: 200, pattern: '^(\w+\s?)+$'}
      responses:
        "200": {description: ok}
`

// TestPatternBacktracking is THREATS F18: an argument crafted to make a
// schema pattern backtrack catastrophically (ReDoS; the pattern is outside
// the RE2 subset, so regexp2 matches it) is stopped at the match's time
// budget and refused 400 schema_violation naming the argument, before
// policy and with nothing sent upstream, in about the budget (100 ms) and
// not the seconds the match would take; a valid argument to the same
// pattern is sent.
func TestPatternBacktracking(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	spec := filepath.Join(t.TempDir(), "notes.yaml")
	if err := os.WriteFile(spec, []byte(notesSpec), 0o644); err != nil {
		t.Fatal(err)
	}
	d := mainConfig(e, "sluice")
	conns := d["connectors"].([]map[string]any)
	notes := map[string]any{}
	for k, v := range conns[0] {
		notes[k] = v
	}
	notes["slug"], notes["spec"] = "notes", spec
	delete(notes, "credential") // the notes API declares no security
	d["connectors"] = append(conns, notes)
	d["agents"].([]map[string]any)[0]["connectors"] = []string{"tickets", "notes"}
	d["policies"] = append([]map[string]any{{"match": "notes.search_notes", "action": "allow"}}, d["policies"].([]map[string]any)...)
	g := e.Start(d, e.Write(d))

	c := casebook.Expect(t, "F18", `ReDoS: notes.search_notes with q = 40 × "a" + "!" against the pattern ^(\w+\s?)+$ (regexp2: outside the RE2 subset)`,
		"400 schema_violation naming query.q within about the 100 ms match budget, no policy decision, nothing upstream; control: q = \"hello brave world\" is sent (200)")
	before := len(e.Up.Requests())
	start := time.Now()
	r := g.For(t).Call(agentA, "notes.search_notes", `{"query":{"q":"`+strings.Repeat("a", 40)+`!"}}`)
	took := time.Since(start)
	sent := len(e.Up.Requests()) - before
	line := awaitDecision(t, g, r.RequestID)
	ok := g.For(t).Call(agentA, "notes.search_notes", `{"query":{"q":"hello brave world"}}`)
	obs := fmt.Sprintf("%d %s %q in %v, upstream requests +%d, decision %q reason %q; control %d", r.Status, r.Code, r.Message, took.Round(time.Millisecond), sent, line["decision"], line["reason"], ok.Status)
	c.Observe(obs)
	t.Log(obs)
	expect(t, r, http.StatusBadRequest, "schema_violation")
	if !strings.Contains(r.Message, "q") {
		t.Errorf("message %q does not name the argument", r.Message)
	}
	if sent != 0 {
		t.Errorf("the refused call reached the upstream (%d requests)", sent)
	}
	wantFields(t, line, map[string]string{"decision": ""}) // refused before any policy ran
	if reason, _ := line["reason"].(string); !strings.HasPrefix(reason, "schema_violation") {
		t.Errorf("decision line reason %q, want schema_violation", reason)
	}
	if took > 5*time.Second {
		t.Errorf("the refusal took %v: the match ran past its budget", took)
	}
	if ok.Status != http.StatusOK {
		t.Errorf("control: a valid q answered %d %s %q", ok.Status, ok.Code, ok.Message)
	}
}

//go:build linux

package attack

import (
	"bufio"
	"bytes"
	"encoding/json"
	"os"
	osexec "os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sluice-gw/sluice/test/internal/casebook"
)

// ceilingConfig sets every limit sandboxd.yaml can set below its default:
// they are the defaults and the ceilings of every create and exec.
const ceilingConfig = `limits:
  pids: 64
  memory_bytes: 67108864
  cpu_millis: 500
  workspace_bytes: 8388608
  tmp_bytes: 4194304
  output_bytes: 65536
  file_bytes: 1048576
  exec_timeout: 5s
  lifetime: 10m
`

// TestLimitCeilings is THREATS B8 through the real `sandboxd serve` API:
// a create or exec asking for more than sandboxd.yaml's limits (or, for an
// exec, more than its sandbox's own) is refused with 400 above_ceiling, a
// message naming the limit, the value asked for and the ceiling, and a
// limit_refused event; nothing is created. Controls: the same requests at
// the ceiling succeed.
func TestLimitCeilings(t *testing.T) {
	need(t)
	d := startDaemonWith(t, ceilingConfig)
	type apiErr struct {
		Error struct{ Code, Message string } `json:"error"`
	}
	refused := func(t *testing.T, method, path, body, want string) string {
		t.Helper()
		code, b := d.do(t, method, path, body)
		var e apiErr
		if code != 400 || json.Unmarshal(b, &e) != nil || e.Error.Code != "above_ceiling" || !strings.Contains(e.Error.Message, want) {
			t.Fatalf("%s %s %s: %d %s, want 400 above_ceiling naming %q", method, path, body, code, b, want)
		}
		return e.Error.Message
	}
	for _, tc := range []struct{ name, limits, want string }{
		{"pids", `{"pids":65}`, "pids: requested 65 is above the ceiling 64 (sandboxd.yaml limits.pids)"},
		{"pids far above", `{"pids":1048576}`, "pids: requested 1048576 is above the ceiling 64"},
		{"memory", `{"memory_bytes":67108865}`, "memory_bytes: requested 67108865 is above the ceiling 67108864"},
		{"cpu", `{"cpu_millis":501}`, "cpu_millis: requested 501 is above the ceiling 500"},
		{"workspace", `{"workspace_bytes":8388609}`, "workspace_bytes: requested 8388609 is above the ceiling 8388608"},
		{"tmp", `{"tmp_bytes":4194305}`, "tmp_bytes: requested 4194305 is above the ceiling 4194304"},
		{"output", `{"output_bytes":65537}`, "output_bytes: requested 65537 is above the ceiling 65536"},
		{"file", `{"file_bytes":1048577}`, "file_bytes: requested 1048577 is above the ceiling 1048576"},
		{"exec timeout (ns in limits)", `{"exec_timeout":5000000001}`, "exec_timeout: requested 5.000000001s is above the ceiling 5s"},
		{"lifetime (ns in limits)", `{"lifetime":600000000001}`, "lifetime: requested 10m0.000000001s is above the ceiling 10m0s"},
		{"one of many", `{"pids":8,"memory_bytes":16777216,"cpu_millis":100000}`, "cpu_millis: requested 100000 is above the ceiling 500"},
	} {
		t.Run("create/"+tc.name, func(t *testing.T) {
			c := casebook.Expect(t, "B8", "POST /v1/sandboxes with limits "+tc.limits+" over sandboxd.yaml's ceilings",
				"400 above_ceiling naming the limit, the request and the ceiling; limit_refused event; no sandbox")
			msg := refused(t, "POST", "/v1/sandboxes", `{"agent":"a","limits":`+tc.limits+`}`, tc.want)
			ev := lastEvent(t, d)
			if ev["event"] != "limit_refused" || !strings.Contains(ev["error"], tc.want) || ev["agent"] != "a" {
				t.Fatalf("last event %v, want limit_refused naming %q", ev, tc.want)
			}
			c.Observef("400 above_ceiling %q; event limit_refused", msg)
		})
	}
	t.Run("create/lifetime_ms", func(t *testing.T) {
		c := casebook.Expect(t, "B8", "POST /v1/sandboxes with lifetime_ms 600001 over lifetime 10m",
			"400 above_ceiling naming lifetime; limit_refused event")
		want := "lifetime: requested 10m0.001s is above the ceiling 10m0s"
		msg := refused(t, "POST", "/v1/sandboxes", `{"agent":"a","lifetime_ms":600001}`, want)
		if ev := lastEvent(t, d); ev["event"] != "limit_refused" || !strings.Contains(ev["error"], want) {
			t.Fatalf("last event %v, want limit_refused naming %q", ev, want)
		}
		c.Observef("400 above_ceiling %q; event limit_refused", msg)
	})
	for _, tc := range []struct{ name, body, want string }{
		{"negative pids", `{"agent":"a","limits":{"pids":-1}}`, "pids: requested -1 must not be negative"},
		{"lifetime_ms that overflows", `{"agent":"a","lifetime_ms":9223372036854775}`, "lifetime_ms: 9223372036854775 is out of range"},
	} {
		t.Run("create/"+tc.name, func(t *testing.T) {
			c := casebook.Expect(t, "B8", "POST /v1/sandboxes with "+tc.body, "400 bad_request naming the field")
			code, b := d.do(t, "POST", "/v1/sandboxes", tc.body)
			var e apiErr
			if code != 400 || json.Unmarshal(b, &e) != nil || e.Error.Code != "bad_request" || !strings.Contains(e.Error.Message, tc.want) {
				t.Fatalf("%d %s, want 400 bad_request naming %q", code, b, tc.want)
			}
			c.Observef("400 bad_request %q", e.Error.Message)
		})
	}
	if code, b := d.do(t, "GET", "/v1/sandboxes", ""); code != 200 || strings.TrimSpace(string(b)) != "[]" {
		t.Fatalf("after refused creates: %d %s, want no sandbox", code, b)
	}

	// Control: everything at the ceiling is made, and a lower exec_timeout
	// becomes this sandbox's own ceiling.
	code, b := d.do(t, "POST", "/v1/sandboxes", `{"agent":"a","limits":{"pids":64,"memory_bytes":67108864,"cpu_millis":500,`+
		`"workspace_bytes":8388608,"tmp_bytes":4194304,"output_bytes":65536,"file_bytes":1048576,"exec_timeout":2000000000},"lifetime_ms":600000}`)
	var info struct{ ID string }
	if code != 201 || json.Unmarshal(b, &info) != nil || info.ID == "" {
		t.Fatalf("create at the ceilings: %d %s", code, b)
	}
	exec := "/v1/sandboxes/" + info.ID + "/exec"
	for _, tc := range []struct{ name, body, want string }{
		{"timeout above the sandbox's own", `{"argv":["true"],"timeout_ms":2001}`, "exec_timeout: requested 2.001s is above the ceiling 2s (the sandbox's limits.exec_timeout)"},
		{"timeout above the config's", `{"argv":["true"],"timeout_ms":3600000}`, "exec_timeout: requested 1h0m0s is above the ceiling 2s"},
		{"output above", `{"argv":["true"],"output_bytes":65537}`, "output_bytes: requested 65537 is above the ceiling 65536 (64KiB) (the sandbox's limits.output_bytes)"},
	} {
		t.Run("exec/"+tc.name, func(t *testing.T) {
			c := casebook.Expect(t, "B8", "POST /v1/sandboxes/{id}/exec "+tc.body,
				"400 above_ceiling naming the limit, the request and the ceiling; limit_refused event; nothing run")
			msg := refused(t, "POST", exec, tc.body, tc.want)
			ev := lastEvent(t, d)
			if ev["event"] != "limit_refused" || ev["sandbox"] != info.ID || !strings.Contains(ev["error"], tc.want) {
				t.Fatalf("last event %v, want limit_refused for %s", ev, info.ID)
			}
			c.Observef("400 above_ceiling %q; event limit_refused", msg)
		})
	}
	for _, body := range []string{`{"argv":["true"],"timeout_ms":-1}`, `{"argv":["true"],"timeout_ms":9223372036854775807}`} {
		if code, b := d.do(t, "POST", exec, body); code != 400 {
			t.Errorf("exec %s: %d %s, want 400", body, code, b)
		}
	}
	code, b = d.do(t, "POST", exec, `{"argv":["sh","-c","echo ok"],"timeout_ms":2000,"output_bytes":65536}`)
	if code != 200 || !strings.Contains(string(b), `"stdout":"ok\n"`) {
		t.Fatalf("control exec at the ceilings: %d %s", code, b)
	}
	if code, _ := d.do(t, "DELETE", "/v1/sandboxes/"+info.ID, ""); code != 204 {
		t.Errorf("delete: %d", code)
	}

	// The one-shot CLI goes through the same check.
	t.Run("run/--memory above", func(t *testing.T) {
		c := casebook.Expect(t, "B8", "sandboxd run --memory 1GiB with memory_bytes 64MiB in sandboxd.yaml",
			"exit 1, stderr names memory_bytes, the request and the ceiling; nothing run")
		cmd := osexec.Command(bin, "run", "--config", d.cfg, "--state-dir", filepath.Join(d.state, "..", "run-state"), "--memory", "1073741824", "--", "echo", "ran")
		var so, se bytes.Buffer
		cmd.Stdout, cmd.Stderr = &so, &se
		err := cmd.Run()
		out, stderr := so.String(), se.String()
		want := "memory_bytes: requested 1073741824 (1GiB) is above the ceiling 67108864 (64MiB) (sandboxd.yaml limits.memory_bytes)"
		if err == nil || out != "" || !strings.Contains(stderr, want) {
			t.Fatalf("run: err=%v stdout=%q stderr=%q, want a failure naming %q", err, out, stderr, want)
		}
		c.Observef("exit %v; stderr %q", err, strings.TrimSpace(stderr))
	})
}

// lastEvent is the last line of the daemon's events.jsonl.
func lastEvent(t *testing.T, d *daemon) map[string]string {
	t.Helper()
	f, err := os.Open(filepath.Join(d.state, "events.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var last string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		last = sc.Text()
	}
	ev := map[string]any{}
	if err := json.Unmarshal([]byte(last), &ev); err != nil {
		t.Fatalf("events.jsonl last line %q: %v", last, err)
	}
	out := map[string]string{}
	for k, v := range ev {
		if s, ok := v.(string); ok {
			out[k] = s
		}
	}
	return out
}

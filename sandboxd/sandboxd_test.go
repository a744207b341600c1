//go:build linux

package sandboxd

import (
	"bytes"
	"errors"
	"strings"
	"testing"
	"time"
)

func TestParseConfig(t *testing.T) {
	cases := []struct {
		name, yaml string
		wantErr    string // substring; "" = valid
	}{
		{"empty uses defaults", "", ""},
		{"full", "api: /run/x.sock\ngateway: /run/g.sock\nstate_dir: /var/lib/x\nuids: {base: 200000, count: 4}\nlimits: {pids: 64, exec_timeout: 5s}\n", ""},
		{"unknown key", "apii: /x\n", "config: apii: unknown key (line 1)"},
		{"unknown nested key", "limits: {pid: 3}\n", "config: limits.pid: unknown key (line 1)"},
		{"unknown key, its line", "host: a\nlimits:\n  pids: 64\n  memroy_bytes: 1GiB\n", "config: limits.memroy_bytes: unknown key (line 4)"},
		{"sizes", "limits:\n  memory_bytes: 1GiB\n  workspace_bytes: 128MiB\n  tmp_bytes: 32MiB\n  file_bytes: 1048576\n  output_bytes: 64KiB\n", ""},
		{"not a size", "limits:\n  memory_bytes: 1 GB x\n", `config: limits.memory_bytes: "1 GB x" is not a size (bytes, or like 512MiB or 1GiB) (line 2)`},
		{"negative size", "limits:\n  memory_bytes: -1GiB\n", `limits.memory_bytes: "-1GiB" is not a size`},
		{"size that overflows", "limits:\n  memory_bytes: 9999999999TiB\n", `limits.memory_bytes: "9999999999TiB" is not a size`},
		{"size too small, shown as a size, with its line", "host: a\nlimits:\n  workspace_bytes: 512KiB\n", "config: limits.workspace_bytes: must be >= 1MiB, got 524288 (512KiB) (line 3)"},
		{"validation error names the line", "host: a\nstate_dir: var/lib\n", `config: state_dir: must be an absolute path, got "var/lib" (line 2)`},
		{"relative path", "state_dir: var/lib\n", "state_dir: must be an absolute path"},
		{"uid base onto system users", "uids: {base: 1000, count: 1}\n", "uids.base"},
		{"uid range overflow", "uids: {base: 100000, count: 100000}\n", "uids.count"},
		{"pids too small", "limits: {pids: 2}\n", "limits.pids"},
		{"cgroup parent escapes", "cgroup_parent: ../x\n", "cgroup_parent"},
		{"negative lifetime", "limits: {lifetime: -1s}\n", "limits.lifetime"},
		{"spares use every uid slot", "uids: {base: 100000, count: 2}\nspares: 2\n", "spares"},
		{"remote gateway", "host: node-a\ngateway_tls: {address: 'gw:7443', cert_file: /c.pem, key_file: /c.key, ca_file: /ca.pem}\n", ""},
		{"remote gateway without a port", "host: node-a\ngateway_tls: {address: gw, cert_file: /c.pem, key_file: /c.key, ca_file: /ca.pem}\n", "gateway_tls.address: want host:port"},
		{"remote gateway, relative key", "host: node-a\ngateway_tls: {address: 'gw:7443', cert_file: /c.pem, key_file: c.key, ca_file: /ca.pem}\n", "gateway_tls.key_file: must be an absolute path"},
		{"remote gateway without a CA", "host: node-a\ngateway_tls: {address: 'gw:7443', cert_file: /c.pem, key_file: /c.key}\n", "gateway_tls.ca_file"},
		{"remote gateway without host", "gateway_tls: {address: 'gw:7443', cert_file: /c.pem, key_file: /c.key, ca_file: /ca.pem}\n", "host: must be set with gateway_tls"},
		{"gateway_tls keys without an address", "gateway_tls: {cert_file: /c.pem}\n", "gateway_tls.address: must be set"},
		{"negative dns_cache", "dns_cache: -1s\n", "dns_cache: must be in 0s..1h"},
		{"warm pool", "pool: {size: 8, refill_per_second: 50}\n", ""},
		{"pool and spares", "pool: {size: 2}\nspares: 1\n", "config: pool.size: set pool.size or spares, not both"},
		{"pool above uids", "uids: {base: 100000, count: 4}\npool: {size: 4}\n", "config: pool.size: must be in 0..64 and below uids.count, got 4"},
		{"negative refill", "pool: {size: 1, refill_per_second: -1}\n", "config: pool.refill_per_second: must be in 0..1000"},
		{"templates and their pools", "templates:\n  py:\n    rootfs: /srv/py\n    limits: {memory_bytes: 128MiB, workspace_bytes: 32MiB}\n    egress: [pypi.org]\n    env: {LANG: C}\n  small: {limits: {pids: 32}}\npool: {size: 2, per_template: {py: 3, small: 1}}\n", ""},
		{"template unknown key, its line", "templates:\n  py:\n    rootfz: /x\n", "config: templates.py.rootfz: unknown key (line 3)"},
		{"template limits unknown key", "templates:\n  py:\n    limits: {memory: 1GiB}\n", "config: templates.py.limits.memory: unknown key"},
		{"template not a size", "templates:\n  py:\n    limits: {memory_bytes: lots}\n", `config: templates.py.limits.memory_bytes: "lots" is not a size`},
		{"template above the configured limits", "limits: {memory_bytes: 256MiB}\ntemplates:\n  py:\n    limits:\n      memory_bytes: 1GiB\n", "config: templates.py.limits.memory_bytes: 1073741824 (1GiB) is above 268435456 (256MiB) (limits.memory_bytes): a template narrows the configured limits (line 5)"},
		{"template limit too small", "templates:\n  py: {limits: {pids: 2}}\n", "config: templates.py.limits.pids: must be in 8..1048576, got 2"},
		{"template relative rootfs", "templates:\n  py: {rootfs: srv/py}\n", `config: templates.py.rootfs: must be an absolute path, got "srv/py" (line 2)`},
		{"template bad egress", "templates:\n  py: {egress: ['a b']}\n", "config: templates.py.egress:"},
		{"template reserved env", "templates:\n  py: {env: {HTTPS_PROXY: 'http://x'}}\n", `config: templates.py.env: "HTTPS_PROXY" is not a variable a template may set`},
		{"template bad name", "templates:\n  Py.3: {}\n", `config: templates: name "Py.3": want 1-63 of a-z, 0-9, - and _`},
		{"pool of an unknown template", "templates:\n  py: {}\npool: {per_template: {pyy: 2}}\n", `config: pool.per_template.pyy: no template "pyy" (templates names py)`},
		{"template pool too big", "templates:\n  py: {}\npool: {per_template: {py: 65}}\n", "config: pool.per_template.py: must be in 0..64, got 65"},
		{"template pools above uids", "uids: {base: 100000, count: 4}\ntemplates:\n  py: {}\npool: {size: 2, per_template: {py: 2}}\n", "config: pool.per_template: the pools hold 4 sandboxes in all, which must stay below uids.count (4)"},
		{"adopt and keep", "adopt_wait: 30m\non_stop: keep\n", ""},
		{"keep without adopt_wait", "adopt_wait: 0s\non_stop: keep\n", "config: on_stop: keep needs adopt_wait above 0s"},
		{"on_stop unknown", "on_stop: linger\n", `config: on_stop: must be destroy or keep, got "linger" (line 1)`},
		{"adopt_wait too long", "adopt_wait: 48h\n", "config: adopt_wait: must be in 0s..24h, got 48h0m0s"},
		{"pods rules", "pods:\n  - {namespace: team-a, agent: agent-a, user: alice}\n  - {namespace: team-b, agent: agent-b, egress: [pypi.org]}\n", ""},
		{"pods rule without a namespace", "pods:\n  - {agent: agent-a}\n", "config: pods[0].namespace: is required"},
		{"pods rule without an agent", "pods:\n  - {namespace: team-a}\n", "config: pods[0].agent: is required"},
		{"pods agent from a label", "pods:\n  - {namespace: a, agent_from: 'label:sluice.dev/agent', agents: [x, y], session_from: serviceaccount}\n", ""},
		{"pods agent from the service account", "pods:\n  - {namespace: a, agent_from: serviceaccount, agents: [x]}\nkube_api: {url: 'https://10.0.0.1:6443', token_file: /t, ca_file: /ca}\n", ""},
		{"pods agent and agent_from", "pods:\n  - {namespace: a, agent: x, agent_from: serviceaccount, agents: [x]}\n", "config: pods[0].agent_from: set agent or agent_from, not both"},
		{"pods agent_from without agents", "pods:\n  - {namespace: a, agent_from: serviceaccount}\n", "config: pods[0].agents: agent_from needs the agents it may yield"},
		{"pods agent_from unknown source", "pods:\n  - {namespace: a, agent_from: annotation, agents: [x]}\n", `config: pods[0].agent_from: must be serviceaccount or label:KEY, got "annotation"`},
		{"pods agent_from bad label key", "pods:\n  - {namespace: a, agent_from: 'label:a b', agents: [x]}\n", `config: pods[0].agent_from: label key "a b" is not a Kubernetes label key`},
		{"pods agents not identity values", "pods:\n  - {namespace: a, agent_from: serviceaccount, agents: ['x/y']}\n", `config: pods[0].agents[0]: "x/y" must match`},
		{"pods agents without agent_from", "pods:\n  - {namespace: a, agent: x, agents: [x]}\n", "config: pods[0].agents: only with agent_from"},
		{"pods session_from bad", "pods:\n  - {namespace: a, agent: x, session_from: 'label:'}\n", "config: pods[0].session_from: label key"},
		{"kube_api plain http", "kube_api: {url: 'http://10.0.0.1:6443'}\n", "config: kube_api.url: must be https://host[:port]"},
		{"kube_api relative token", "kube_api: {token_file: t}\n", "config: kube_api.token_file: must be an absolute path"},
		{"pods namespace mapped twice", "pods:\n  - {namespace: a, agent: x}\n  - {namespace: a, agent: y}\n", `config: pods[1].namespace: "a" is mapped twice`},
		{"pods rule unknown key", "pods:\n  - {namespace: a, agent: x, serviceaccount: y}\n", "pods[0].serviceaccount: unknown key"},
		{"dns_cache over an hour", "dns_cache: 2h\n", "dns_cache: must be in 0s..1h"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c, err := ParseConfig([]byte(tc.yaml))
			if tc.wantErr == "" {
				if err != nil {
					t.Fatalf("unexpected error: %v", err)
				}
				if c.Limits.Pids == 0 || c.Limits.ExecTimeout == 0 {
					t.Errorf("defaults not applied: %+v", c.Limits)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("got %v, want error containing %q", err, tc.wantErr)
			}
		})
	}
	// dns_cache: 1s by default; 0 turns the stub's cache off, which the
	// relay takes as a negative DNSCacheFor (its 0 means the default).
	for _, tc := range []struct {
		yaml      string
		cache     time.Duration
		relayWant time.Duration
	}{{"", time.Second, time.Second}, {"dns_cache: 0s\n", 0, -1}, {"dns_cache: 250ms\n", 250 * time.Millisecond, 250 * time.Millisecond}} {
		c, err := ParseConfig([]byte(tc.yaml))
		if err != nil || c.DNSCache != tc.cache || c.relayDNSCache() != tc.relayWant {
			t.Errorf("%q: dns_cache %s, relay %s, %v; want %s and %s", tc.yaml, c.DNSCache, c.relayDNSCache(), err, tc.cache, tc.relayWant)
		}
	}
	c, _ := ParseConfig([]byte("limits: {pids: 64, exec_timeout: 5s}\n"))
	if c.Limits.Pids != 64 || c.Limits.ExecTimeout != 5*time.Second || c.Limits.MemoryBytes != DefaultLimits.MemoryBytes {
		t.Errorf("merge: %+v", c.Limits)
	}
}

func TestWorkspacePath(t *testing.T) {
	cases := []struct {
		name, path string
		want       string // joined parts; "" = ErrInvalid
	}{
		{"plain", "workspace/a.txt", "a.txt"},
		{"absolute", "/workspace/d/a.txt", "d/a.txt"},
		{"the workspace itself", "workspace/", ""},
		{"outside", "etc/passwd", ""},
		{"prefix trick", "workspacex/a", ""},
		{"dotdot", "workspace/../etc/passwd", ""},
		{"inner dotdot", "workspace/a/../../etc", ""},
		{"dot", "workspace/./a", ""},
		{"double slash", "workspace//a", ""},
		{"trailing slash", "workspace/a/", ""},
		{"NUL", "workspace/a\x00b", ""},
		{"long component", "workspace/" + strings.Repeat("a", 256), ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			parts, err := WorkspacePath(tc.path)
			if tc.want == "" {
				if !errors.Is(err, ErrInvalid) {
					t.Fatalf("got %v, %v; want ErrInvalid", parts, err)
				}
				return
			}
			if err != nil || strings.Join(parts, "/") != tc.want {
				t.Fatalf("got %v, %v; want %s", parts, err, tc.want)
			}
		})
	}
}

// FuzzWorkspacePath: whatever the API path, an accepted one has only plain
// components (no way up, no empty or dot parts, no NUL).
func FuzzWorkspacePath(f *testing.F) {
	f.Add("workspace/a/b.txt")       // ordinary
	f.Add("/workspace/../etc")       // traversal
	f.Add("workspace/a//b")          // empty component
	f.Add("workspace/\x00")          // NUL
	f.Add("workspace/..%2f..%2fetc") // encoded traversal (already decoded by the mux; kept literal here)
	f.Fuzz(func(t *testing.T, p string) {
		parts, err := WorkspacePath(p)
		if err != nil {
			return
		}
		for _, c := range parts {
			if c == "" || c == "." || c == ".." || strings.ContainsAny(c, "/\x00") {
				t.Fatalf("accepted %q with component %q", p, c)
			}
		}
	})
}

func TestCapWriter(t *testing.T) {
	cases := []struct {
		name      string
		limit     int
		writes    []string
		want      string
		truncated bool
	}{
		{"under", 10, []string{"abc", "def"}, "abcdef", false},
		{"exact", 6, []string{"abc", "def"}, "abcdef", false},
		{"over in one write", 4, []string{"abcdef"}, "abcd" + TruncatedMarker, true},
		{"over across writes", 4, []string{"abc", "def", "ghi"}, "abcd" + TruncatedMarker, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var buf bytes.Buffer
			w := &capWriter{buf: &buf, limit: tc.limit}
			for _, s := range tc.writes {
				if n, err := w.Write([]byte(s)); n != len(s) || err != nil {
					t.Fatalf("Write(%q) = %d, %v: the writer must look fully consumed", s, n, err)
				}
			}
			if buf.String() != tc.want || w.truncated != tc.truncated {
				t.Errorf("got %q truncated=%v, want %q truncated=%v", buf.String(), w.truncated, tc.want, tc.truncated)
			}
		})
	}
}

func TestCheckEnv(t *testing.T) {
	cases := []struct {
		name string
		env  map[string]string
		ok   bool
	}{
		{"plain", map[string]string{"FOO": "bar"}, true},
		{"proxy override", map[string]string{"HTTPS_PROXY": "http://evil"}, false},
		{"identity override", map[string]string{"SLUICE_SANDBOX": "other"}, false},
		{"bad key", map[string]string{"A=B": "c"}, false},
		{"NUL value", map[string]string{"A": "b\x00c"}, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := checkEnv(tc.env)
			if (err == nil) != tc.ok || (err != nil && !errors.Is(err, ErrInvalid)) {
				t.Errorf("got %v, want ok=%v", err, tc.ok)
			}
		})
	}
}

func TestLimitsOrKeepsSetFieldsAndFillsZeros(t *testing.T) {
	d := Limits{Pids: 128, MemoryBytes: 1 << 28, CPUMillis: 1000, WorkspaceBytes: 1 << 26, TmpBytes: 1 << 24,
		OutputBytes: 1 << 20, FileBytes: 1 << 24, ExecTimeout: time.Minute, Lifetime: time.Hour}
	got := Limits{Pids: 5, ExecTimeout: time.Second}.Or(d)
	want := d
	want.Pids, want.ExecTimeout = 5, time.Second
	if got != want {
		t.Fatalf("Or = %+v, want %+v", got, want)
	}
	if (Limits{}).Or(d) != d {
		t.Fatal("zero limits should take every default")
	}
}

// TestLimitsWithinCeilings (THREATS B8): a requested limit above the
// configured one, or negative, is refused with an error naming the limit,
// the value asked for and the ceiling; at or below the ceiling it passes.
func TestLimitsWithinCeilings(t *testing.T) {
	ceil := DefaultLimits
	ceil.Lifetime = time.Hour
	for _, tc := range []struct {
		name    string
		req     Limits
		wantErr string // "" = within
	}{
		{"nothing set", Limits{}, ""},
		{"all at the ceiling", ceil, ""},
		{"pids above", Limits{Pids: 129}, "pids: requested 129 is above the ceiling 128 (sandboxd.yaml limits.pids)"},
		{"memory above", Limits{MemoryBytes: 1 << 30}, "memory_bytes: requested 1073741824 (1GiB) is above the ceiling 268435456 (256MiB)"},
		{"cpu above", Limits{CPUMillis: 1001}, "cpu_millis: requested 1001 is above the ceiling 1000"},
		{"workspace above", Limits{WorkspaceBytes: 64<<20 + 1}, "workspace_bytes: requested 67108865"},
		{"tmp above", Limits{TmpBytes: 17 << 20}, "tmp_bytes: requested 17825792"},
		{"output above", Limits{OutputBytes: 1<<20 + 1}, "output_bytes: requested 1048577"},
		{"file above", Limits{FileBytes: 1 << 40}, "file_bytes: requested 1099511627776"},
		{"exec timeout above", Limits{ExecTimeout: 61 * time.Second}, "exec_timeout: requested 1m1s is above the ceiling 1m0s"},
		{"lifetime above", Limits{Lifetime: 2 * time.Hour}, "lifetime: requested 2h0m0s is above the ceiling 1h0m0s"},
		{"negative pids", Limits{Pids: -1}, "pids: requested -1 must not be negative"},
		{"negative timeout", Limits{ExecTimeout: -time.Second}, "exec_timeout: requested -1s must not be negative"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.req.Within(ceil, "sandboxd.yaml limits")
			if tc.wantErr == "" {
				if err != nil {
					t.Fatalf("Within = %v, want nil", err)
				}
				return
			}
			var ce *CeilingError
			if err == nil || !errors.As(err, &ce) || !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("Within = %v, want a CeilingError (ErrInvalid) containing %q", err, tc.wantErr)
			}
		})
	}
	// A lifetime ceiling of 0 is none.
	if err := (Limits{Lifetime: 1000 * time.Hour}).Within(DefaultLimits, "x"); err != nil {
		t.Fatalf("lifetime under no ceiling: %v", err)
	}
}

// TestSizes: byte counts under limits may be written as sizes; each parses
// to its bytes, and FormatSize writes them back.
func TestSizes(t *testing.T) {
	c, err := ParseConfig([]byte("limits:\n  memory_bytes: 1GiB\n  workspace_bytes: 128MiB\n  tmp_bytes: '32MiB'\n  output_bytes: 64KiB\n  file_bytes: 2000000\n"))
	if err != nil {
		t.Fatal(err)
	}
	if l := c.Limits; l.MemoryBytes != 1<<30 || l.WorkspaceBytes != 128<<20 || l.TmpBytes != 32<<20 || l.OutputBytes != 64<<10 || l.FileBytes != 2000000 {
		t.Errorf("limits = %+v", l)
	}
	for _, tc := range []struct {
		in   string
		want int64
		ok   bool
	}{
		{"0", 0, true}, {"1048576", 1 << 20, true}, {"1KiB", 1024, true}, {"3GiB", 3 << 30, true}, {"2TiB", 2 << 40, true},
		{"500MB", 500e6, true}, {"1kB", 1000, true}, {"7B", 7, true},
		{"", 0, false}, {"GiB", 0, false}, {"1.5GiB", 0, false}, {"-1", 0, false}, {"1gib", 0, false}, {"0x10", 0, false},
		{"8388608TiB", 0, false}, // 2^63: one past int64
	} {
		got, err := ParseSize(tc.in)
		if (err == nil) != tc.ok || got != tc.want {
			t.Errorf("ParseSize(%q) = %d, %v; want %d ok=%v", tc.in, got, err, tc.want, tc.ok)
		}
	}
	for n, want := range map[int64]string{1 << 30: "1GiB", 1536 << 10: "1536KiB", 1000: "1000", 0: "0", 64 << 20: "64MiB"} {
		if got := FormatSize(n); got != want {
			t.Errorf("FormatSize(%d) = %q, want %q", n, got, want)
		}
	}
}

package bench

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sluice-gw/sluice/test/internal/otlpsink"
)

// tracingCommit is the subject of the commit that installed trace export;
// the "before" row is built from its parent (or from BENCH_BEFORE, a git
// revision).
const tracingCommit = "gateway: export traces over OTLP when the OTEL_* environment asks"

// benchTracing is the OpenTelemetry section: the full pipeline (Rego,
// cached credential, audit on /dev/shm) with tracing unset, with every
// span exported over OTLP/gRPC to a loopback collector, and the binary
// from before tracing existed, unset as well.
func benchTracing(t *testing.T, w *world) []*section {
	s := &section{Title: "OpenTelemetry tracing", Baseline: "sluice: tracing unset",
		Intro: "The section 1.7 call (strict schema, user Rego, cached credential scrubbed from the reply, audit on /dev/shm), sequential over a kept-alive sandbox connection, rows in turns as in section 1. " +
			"Tracing on exports every span (always_on sampler, batched every 100 ms) over OTLP/gRPC to a collector in the same namespace: a gRPC server implementing the collector's TraceService from go.opentelemetry.io/proto/otlp that receives and decodes every span and counts them (a deployment's collector does more, on other cores; this one shares the gateway's two)."}
	n := iterations(2000)
	base := gwOpts{Rego: benchRego, Credential: true}
	type variant struct {
		name, note string
		o          gwOpts
		skip       string
	}
	unset := base
	unset.Name = "trace-unset"
	on := base
	on.Name = "trace-on"
	sink := otlpsink.ServeCounting(t, w.ns.listen(t, "tcp", "127.0.0.1:0"))
	on.Env = []string{"OTEL_EXPORTER_OTLP_ENDPOINT=http://" + sink.Addr, "OTEL_EXPORTER_OTLP_PROTOCOL=grpc",
		"OTEL_EXPORTER_OTLP_INSECURE=true", "OTEL_TRACES_SAMPLER=always_on", "OTEL_BSP_SCHEDULE_DELAY=100"}
	tenth := on
	tenth.Name = "trace-tenth"
	tenth.Env = append(slices.Clone(on.Env[:3]), "OTEL_TRACES_SAMPLER=traceidratio", "OTEL_TRACES_SAMPLER_ARG=0.1", "OTEL_BSP_SCHEDULE_DELAY=100")
	before := base
	before.Name = "trace-before"
	vs := []variant{
		{"sluice: tracing unset", "no OTEL_* variable: no provider, no span started", unset, ""},
		{"sluice: tracing on, loopback collector", "OTLP/gRPC, every call sampled", on, ""},
		{"sluice: tracing on, 10% sampled", "OTEL_TRACES_SAMPLER=traceidratio, _ARG=0.1: an unsampled call's spans are not recorded", tenth, ""},
	}
	if bin, rev, err := beforeBinary(w); err != nil {
		vs = append(vs, variant{name: "sluice before tracing (unset)", skip: err.Error()})
	} else {
		before.Bin = bin
		vs = append(vs, variant{"sluice before tracing (unset)", "built from " + rev, before, ""})
	}
	// BENCH_AGAINST=REV: the on row again, from that revision's binary, in
	// turns with this one's.
	const onRow = "sluice: tracing on, loopback collector"
	if againstRev() != "" {
		if bin, short, err := w.againstBin(); err != nil {
			vs = append(vs, variant{name: againstName(onRow), skip: err.Error()})
		} else {
			against := on
			against.Name, against.Bin = "trace-against", bin
			vs = append(vs, variant{againstName(onRow), "built from " + short + "; its spans go to the same collector", against, ""})
		}
	}
	var ps []*probe
	for _, v := range vs {
		if v.skip != "" {
			ps = append(ps, &probe{name: v.name, err: fmt.Errorf("%s", v.skip)})
			continue
		}
		g, err := w.startGateway(t, v.o)
		if err != nil {
			ps = append(ps, &probe{name: v.name, err: err})
			continue
		}
		t.Cleanup(g.p.stop)
		c := sandboxClient(g.sock, benchAgent)
		ps = append(ps, &probe{name: v.name, note: v.note, fn: func() error {
			_, err := toolCall(c, "bench.create_item", `{"body":`+itemBody+`}`, 200)
			return err
		}})
	}
	interleave(ps, n, 20)
	s.addProbes(ps)
	// The on row is only a measurement if its spans reached the collector.
	if r := s.find("sluice: tracing on, loopback collector"); r != nil && r.measured() {
		deadline := time.Now().Add(5 * time.Second)
		for sink.Counted() == 0 && time.Now().Before(deadline) {
			time.Sleep(50 * time.Millisecond)
		}
		if got := sink.Counted(); got == 0 {
			r.Lat, r.Reason = nil, "not measured: the collector received no span"
		} else {
			r.Note += fmt.Sprintf("; the collector received %d spans", got)
		}
	}
	if againstRev() != "" {
		s.Notes = append(s.Notes, againstNote(w, onRow))
		againstVerdicts(s, nil, onRow)
	}
	unsetRow := s.find("sluice: tracing unset")
	s.Verdicts = append(s.Verdicts,
		verdictLat("issue 22: tracing on with a loopback collector ≤ 1.1× tracing off (p50)", s.find("sluice: tracing on, loopback collector"), unsetRow, 1.1),
		verdictP99("the same at p99", s.find("sluice: tracing on, loopback collector"), unsetRow, 1.1),
		verdictLat("tracing unset costs nothing: unset ≤ 1.05× the binary from before tracing (p50)", unsetRow, s.find("sluice before tracing (unset)"), 1.05))
	return []*section{s}
}

// beforeBinary builds sluice from the parent of the commit that added
// tracing (BENCH_BEFORE overrides the revision), exported with git
// archive into the run's directory. A smoke run does not build it.
func beforeBinary(w *world) (bin, rev string, err error) {
	if smoke() {
		return "", "", fmt.Errorf("a smoke run does not build the binary from before tracing (set SLUICE_BENCH=full)")
	}
	rev = os.Getenv("BENCH_BEFORE")
	if rev == "" {
		out, err := exec.Command("git", "-C", moduleRoot, "log", "-1", "--format=%H", "--fixed-strings", "--grep="+tracingCommit).Output()
		h := strings.TrimSpace(string(out))
		if err != nil || h == "" {
			return "", "", fmt.Errorf("no commit %q in this checkout's history (set BENCH_BEFORE)", tracingCommit)
		}
		rev = h + "^"
	}
	return buildAt(w, rev, "before")
}

// buildAt builds sluice at the git revision rev, exported with git
// archive into the run's directory (name distinguishes builds).
func buildAt(w *world, rev, name string) (bin, short string, err error) {
	src := filepath.Join(w.dir, name+"-src")
	if err := os.MkdirAll(src, 0o755); err != nil {
		return "", "", err
	}
	archive := exec.Command("sh", "-c", `git -C "$1" archive "$2" | tar -x -C "$3"`, "sh", moduleRoot, rev, src)
	if out, err := archive.CombinedOutput(); err != nil {
		return "", "", fmt.Errorf("git archive %s: %v: %s", rev, err, lastLines(string(out), 3))
	}
	bin = filepath.Join(w.dir, "sluice-"+name)
	build := exec.Command("go", "build", "-o", bin, "./cmd/sluice")
	build.Dir = src
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		return "", "", fmt.Errorf("go build at %s: %v: %s", rev, err, lastLines(string(out), 3))
	}
	out, _ := exec.Command("git", "-C", moduleRoot, "rev-parse", "--short", rev).Output()
	return bin, strings.TrimSpace(string(out)), nil
}

// Package policy decides every call with embedded OPA (v1 API): allow, ask or
// block, plus the rule that decided and any obligations.
//
// The engine prepares its query once and evaluates it per call. Policy can
// reach no network and no environment: the capabilities exclude http.send,
// net.* and opa.runtime. Any failure — a compile error at cold start, an
// evaluation error, an undefined result — is a block, never an allow.
//
// Reloading is explicit: Reload recompiles, Watch calls Reload when files
// change, and wiring SIGHUP to Reload is the caller's job (cmd/sluice). A
// failed reload keeps the previous policy serving.
//
// This package imports no other package of sluice except the embedded Rego
// library in rego/.
package policy

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/metrics"
	"github.com/open-policy-agent/opa/v1/rego"
	"github.com/open-policy-agent/opa/v1/topdown"
)

// InputVersion is the version of the input document described in rego/README.md.
const InputVersion = 1

// DefaultTimeout bounds one decision when the caller's context has no
// deadline. A decision takes microseconds; the bound is for runaway
// policies, and is generous because a tighter one turns scheduler stalls on
// a loaded host into spurious blocks.
const DefaultTimeout = time.Second

// Query is the decision of the shipped library, for `opa eval` and tests.
// The engine evaluates ModuleCandidatesQuery and matches and combines in Go
// the same way.
const Query = "data.sluice.main.decision"

// RulePolicyError is the Rule of every decision made because the policy
// failed (not loaded, evaluation error, timeout, undefined or malformed result).
const RulePolicyError = "policy_error"

// ReasonTimedOut is the Reason of a policy_error decision whose
// evaluation ran out of time (the caller's deadline or DefaultTimeout):
// on a loaded machine the same input may well be decided given longer.
const ReasonTimedOut = "policy: evaluation timed out"

// Action is what the policy decided.
type Action int

const (
	Block Action = iota // the zero value: fail closed
	Ask
	Allow
)

// String returns "block", "ask" or "allow".
func (a Action) String() string {
	switch a {
	case Block:
		return "block"
	case Ask:
		return "ask"
	case Allow:
		return "allow"
	}
	return fmt.Sprintf("Action(%d)", int(a))
}

// ParseAction parses "allow", "ask" or "block".
func ParseAction(s string) (Action, error) {
	switch s {
	case "block":
		return Block, nil
	case "ask":
		return Ask, nil
	case "allow":
		return Allow, nil
	}
	return Block, fmt.Errorf("policy: parse action %q: want allow, ask or block", s)
}

// MarshalText encodes the action as its name, so JSON shows "allow", not 2.
func (a Action) MarshalText() ([]byte, error) {
	switch a {
	case Block, Ask, Allow:
		return []byte(a.String()), nil
	}
	return nil, fmt.Errorf("policy: marshal action %d: unknown", int(a))
}

// UnmarshalText parses the action's name.
func (a *Action) UnmarshalText(b []byte) error {
	v, err := ParseAction(string(b))
	if err != nil {
		return err
	}
	*a = v
	return nil
}

// Caller is who is calling, as established by the gateway (never by the caller).
type Caller struct {
	Sandbox string `json:"sandbox"`
	Agent   string `json:"agent"`
	Session string `json:"session"`
	User    string `json:"user"`
	// Egress is the sandbox's narrowing of its agent's raw egress
	// allowlist (wire.Identity.Egress; "" = none). The gateway enforces
	// it before asking policy, so it is not part of the input document;
	// it is here so that it travels wherever the caller does.
	Egress string `json:"-"`
}

// Operation describes the OpenAPI operation behind a tool.
type Operation struct {
	ID     string   `json:"id"`
	Method string   `json:"method"`
	Path   string   `json:"path"`
	Risk   string   `json:"risk"`
	Tags   []string `json:"tags"`
}

// Request is the upstream request the gateway would send, without credentials.
type Request struct {
	Method  string              `json:"method"`
	Host    string              `json:"host"`
	Port    int                 `json:"port,omitempty"` // raw egress: the destination port
	Path    string              `json:"path"`
	Query   map[string][]string `json:"query"`
	Headers map[string][]string `json:"headers"`
	// Body is the request body when the gateway has it but no tool
	// arguments hold it (a forward-proxied request's, decoded from its
	// content coding; a raw-egress request Envoy sent with its body);
	// absent otherwise.
	Body string `json:"body,omitempty"`
}

// Input is the document every decision is made on (see rego/README.md).
type Input struct {
	Version   int       `json:"version"`
	Kind      string    `json:"kind"` // "tool_call", "http", "connect", "dns"
	Caller    Caller    `json:"caller"`
	Connector string    `json:"connector"`
	Tool      string    `json:"tool"`
	Operation Operation `json:"operation"`
	Args      any       `json:"args"`
	Request   Request   `json:"request"`
	Time      time.Time `json:"time"`
	// Envoy is the request in opa-envoy-plugin's input shape
	// (attributes, parsed_path, parsed_query, parsed_body, …) when it came
	// through Envoy's ext_authz; absent otherwise. A policy written for
	// opa-envoy-plugin reads it with `with input as input.envoy`. It is
	// the door's own JSON (one object, as encoding/json writes it): the
	// recorded input carries these bytes and the decision parses them
	// once (ParseJSON), never a map converted and encoded again.
	Envoy json.RawMessage `json:"envoy,omitempty"`
	// Findings are the suspected credentials in what the call would send
	// (policy/findings): Decide fills them in when nil, before deciding.
	Findings []Finding `json:"findings"`
	// Usage is what the gateway counted of this tool's calls for the
	// caller (sluice.yaml usage:), this call included; absent for a tool
	// that is not counted.
	Usage *Usage `json:"usage,omitempty"`
}

// Usage is input.usage: the calls of this call's tool by its agent, its
// user and its session over the last minute, hour and day (this call
// included), and whether this exact call (the same tool and canonical
// request hash) was approved by a person earlier in the session.
type Usage struct {
	Agent          UsageWindows `json:"agent"`
	User           UsageWindows `json:"user"`
	Session        UsageWindows `json:"session"`
	ApprovedBefore bool         `json:"approved_before"`
}

// UsageWindows are one caller's windows.
type UsageWindows struct {
	Minute UsageWindow `json:"minute"`
	Hour   UsageWindow `json:"hour"`
	Day    UsageWindow `json:"day"`
}

// UsageWindow is a count of calls and the sum of the tool's counted
// argument over them (0 when none is configured).
type UsageWindow struct {
	Count int64   `json:"count"`
	Sum   float64 `json:"sum"`
}

// Decision is the policy's answer.
type Decision struct {
	Action      Action         `json:"action"`
	Reason      string         `json:"reason"`
	Rule        string         `json:"rule"`
	Approvers   []string       `json:"approvers,omitempty"`
	Obligations map[string]any `json:"obligations,omitempty"`
	// Revision names the policy generation that decided: the bundle's
	// manifest revision, or a digest of the Rego and data files.
	Revision string `json:"revision,omitempty"`
}

// Rule is one simple rule from sluice.yaml's policies list.
type Rule struct {
	Match     string   // a glob over tool names; "*" matches everything
	Action    string   // "allow", "ask" or "block"
	Approvers []string // for ask
	Reason    string   // optional
}

// Config says what the engine loads.
type Config struct {
	Rules []Rule   // compiled into data for the shipped library
	Paths []string // files or directories of the security team's .rego modules
	// Egress maps an agent name to its raw-egress allowlist (sluice.yaml
	// agents[].egress): host names and "*.domain" patterns, compiled into
	// data.sluice.config.egress.
	Egress map[string][]string
	// ConnectPorts are the ports CONNECT may reach besides 443.
	ConnectPorts []int
	// Bundle, if set, is an OPA bundle compiled with the modules and data
	// under Paths (sluice.yaml policy.bundle).
	Bundle *BundleConfig
	// OnReload, if set, is called after every reload attempt (for metrics).
	OnReload func(ok bool, err error)
	// OnBundle, if set, is called after every attempt to install a new
	// bundle (a file change, a poll that fetched one): ok false means it
	// was refused and the previous policy keeps deciding.
	OnBundle func(ok bool, err error)
	Logger   *slog.Logger
	// NoMemo makes Decide evaluate every input, even one whose
	// projection onto what the policy reads it decided before (memo.go):
	// for benchmarks and for comparing against the memo.
	NoMemo bool
}

// Engine evaluates decisions. It is safe for concurrent use. A nil *Engine
// is valid and blocks everything with reason "policy not loaded".
type Engine struct {
	cfg      Config
	log      *slog.Logger
	cur      atomic.Pointer[prepared]
	version  atomic.Int64
	reloadMu sync.Mutex // serializes Reload so versions follow the swaps
	blockAll string     // set by BlockAll: every decision blocks with this reason
	bundle   *Bundle    // the bundle in force; guarded by reloadMu
}

// prepared is one compiled generation of the policy.
type prepared struct {
	pq     rego.PreparedEvalQuery // ModuleCandidatesQuery
	pqTool rego.PreparedEvalQuery // PolicyCandidatesQuery, for kind tool_call
	rules  *simpleTable
	// revision names this generation (Decision.Revision).
	revision string
	// deps is what its decisions read of the input (memo.go).
	deps func() inputDeps
	// live is Decide's memo of this generation's decisions (memo.go).
	live *liveMemo
}

// New compiles the shipped library, the rules and the modules. On a compile
// error it returns the error (naming file, row and the OPA error code) and
// no engine.
func New(ctx context.Context, cfg Config) (*Engine, error) {
	cfg.Rules = append([]Rule(nil), cfg.Rules...)
	cfg.Paths = append([]string(nil), cfg.Paths...)
	cfg.ConnectPorts = append([]int(nil), cfg.ConnectPorts...)
	if cfg.Bundle != nil && (cfg.Bundle.File == "") == (cfg.Bundle.URL == "") {
		return nil, errors.New("policy: bundle: want exactly one of file and url")
	}
	e := &Engine{cfg: cfg, log: cfg.Logger}
	if e.log == nil {
		e.log = slog.New(slog.DiscardHandler)
	}
	b, err := e.loadBundle(ctx)
	if err != nil {
		return nil, err
	}
	p, err := compile(ctx, cfg, b, e.log)
	if err != nil {
		return nil, err
	}
	e.bundle = b
	e.cur.Store(p)
	e.version.Store(1)
	return e, nil
}

// BlockAll returns an engine that blocks every call with reason; the gateway
// serves it when New fails at cold start. It cannot be reloaded: build a new
// engine with New instead.
func BlockAll(reason string) *Engine {
	if reason == "" {
		reason = "policy not loaded"
	}
	return &Engine{blockAll: reason, log: slog.New(slog.DiscardHandler)}
}

// Decide evaluates in. It never returns allow on error: an evaluation error,
// timeout or undefined result is a Block whose Reason says why.
func (e *Engine) Decide(ctx context.Context, in *Input) Decision {
	return e.guarded(func(p *prepared) Decision {
		if in == nil {
			return policyError("policy: no input")
		}
		if !validKind(in.Kind) {
			return policyError(fmt.Sprintf("policy: unknown input kind %q", in.Kind))
		}
		if in.Findings == nil {
			in.Findings = scanInput(in) // scan.go: before the decision, on what is sent
		}
		items, err := inputItems(in)
		if err != nil {
			return policyError(fmt.Sprintf("policy: build input: %v", err))
		}
		return e.decideLive(ctx, p, in, items) // memo.go
	})
}

// guarded runs decide on the loaded policy, the one way in for every
// decision (Decide, DecideParsed): no policy, a block-all load error or a
// panic is a Block saying why, and the decision carries the revision
// that made it.
func (e *Engine) guarded(decide func(p *prepared) Decision) (d Decision) {
	if e == nil {
		return policyError("policy not loaded")
	}
	if e.blockAll != "" {
		return policyError(e.blockAll)
	}
	defer func() {
		if r := recover(); r != nil {
			e.log.Error("bug(): policy: panic during decision", "panic", fmt.Sprint(r))
			d = policyError("bug(): policy evaluation panicked")
		}
	}()
	p := e.cur.Load()
	if p == nil {
		return policyError("policy not loaded")
	}
	defer func() { d.Revision = p.revision }()
	return decide(p)
}

// eval decides val, the input document in's AST value (in: what the
// simple rules and the log read of it).
func (e *Engine) eval(ctx context.Context, p *prepared, in *Input, val ast.Value) (d Decision) {
	// Cancel the evaluation at the caller's deadline or cancellation, or
	// after DefaultTimeout when the context has no deadline. Done this way
	// rather than with context.WithTimeout and OPA's own watcher goroutine:
	// a timer and an AfterFunc cost a fraction of a goroutine per call.
	cancel := topdown.NewCancel()
	var timer *time.Timer
	if _, ok := ctx.Deadline(); !ok {
		timer = time.AfterFunc(DefaultTimeout, cancel.Cancel)
		defer timer.Stop()
	}
	if ctx.Done() != nil {
		defer context.AfterFunc(ctx, cancel.Cancel)()
	}
	q := p.pq
	if in.Kind == "tool_call" {
		q = p.pqTool
	}
	rs, err := q.Eval(ctx, rego.EvalParsedInput(val), rego.EvalExternalCancel(cancel), evalNoMetrics)
	if err != nil {
		timedOut := timer != nil && !timer.Stop() // Stop reports false once the timer fired
		d = policyError(evalReason(ctx, timedOut, err))
		e.log.Error("policy: evaluation failed", "tool", in.Tool, "reason", d.Reason)
		return d
	}
	d, err = decisionOf(rs, p.rules, in)
	if err != nil {
		e.log.Error("policy: malformed decision", "tool", in.Tool, "error", err)
		d = policyError(err.Error())
	}
	return d
}

// Revision names the policy in force (see Decision.Revision); "" when none
// is loaded.
func (e *Engine) Revision() string {
	if e == nil {
		return ""
	}
	if p := e.cur.Load(); p != nil {
		return p.revision
	}
	return ""
}

// evalNoMetrics keeps the evaluation from allocating a metrics registry per call.
var evalNoMetrics = rego.EvalMetrics(metrics.NoOp())

// decisionOf combines the one result of ModuleCandidatesQuery (an
// *ast.Term holding a set, see prepare) with the matching simple rules.
func decisionOf(rs rego.ResultSet, rules *simpleTable, in *Input) (Decision, error) {
	switch {
	case len(rs) == 0:
		return Decision{}, errors.New("policy: decision undefined")
	case len(rs) > 1 || len(rs[0].Expressions) != 1:
		return Decision{}, errors.New("policy: multiple decisions")
	}
	t, ok := rs[0].Expressions[0].Value.(*ast.Term)
	if !ok {
		return Decision{}, fmt.Errorf("bug(): policy: result is %T, want *ast.Term", rs[0].Expressions[0].Value)
	}
	mods, ok := t.Value.(ast.Set)
	if !ok {
		return Decision{}, fmt.Errorf("bug(): policy: module candidates are %T, want a set", t.Value)
	}
	return combine(rules.candidates(in, mods.Slice()))
}

// Version is a counter that grows by one on every successful (re)load.
func (e *Engine) Version() int64 {
	if e == nil {
		return 0
	}
	return e.version.Load()
}

// Reload recompiles from the configured paths. On failure the previous
// policy keeps serving and the error is returned.
func (e *Engine) Reload(ctx context.Context) error {
	if e == nil || e.blockAll != "" {
		return errors.New("policy: reload: engine was not built by New")
	}
	e.reloadMu.Lock()
	defer e.reloadMu.Unlock()
	b, err := e.loadBundle(ctx)
	if err != nil {
		if e.cfg.Bundle != nil && e.cfg.OnBundle != nil {
			e.cfg.OnBundle(false, err)
		}
		err = fmt.Errorf("policy: reload: %w", err)
		e.log.Error("policy: reload rejected; previous policy keeps serving",
			"version", e.version.Load(), "revision", e.Revision(), "error", err)
		if e.cfg.OnReload != nil {
			e.cfg.OnReload(false, err)
		}
		return err
	}
	return e.swap(ctx, b)
}

// install compiles the policy with a newly fetched bundle and puts it in
// force; on failure the previous policy keeps deciding.
func (e *Engine) install(ctx context.Context, b *Bundle) error {
	e.reloadMu.Lock()
	defer e.reloadMu.Unlock()
	return e.swap(ctx, b)
}

// swap compiles a generation with bundle b and stores it. reloadMu is held.
func (e *Engine) swap(ctx context.Context, b *Bundle) error {
	newBundle := b != nil && b != e.bundle
	p, err := compile(ctx, e.cfg, b, e.log)
	if newBundle && e.cfg.OnBundle != nil {
		e.cfg.OnBundle(err == nil, err)
	}
	if err != nil {
		err = fmt.Errorf("policy: reload: %w", err)
		e.log.Error("policy: reload rejected; previous policy keeps serving",
			"version", e.version.Load(), "error", err)
		if e.cfg.OnReload != nil {
			e.cfg.OnReload(false, err)
		}
		return err
	}
	e.bundle = b
	e.cur.Store(p)
	v := e.version.Add(1)
	e.log.Info("policy: reloaded", "version", v, "revision", p.revision)
	if e.cfg.OnReload != nil {
		e.cfg.OnReload(true, nil)
	}
	return nil
}

func policyError(reason string) Decision {
	return Decision{Action: Block, Reason: reason, Rule: RulePolicyError}
}

func validKind(k string) bool {
	switch k {
	case "tool_call", "http", "connect", "dns":
		return true
	}
	return false
}

// evalReason names why evaluation failed: timeout, cancellation or the OPA
// error (code, message and location). timedOut says DefaultTimeout expired.
func evalReason(ctx context.Context, timedOut bool, err error) string {
	if timedOut || errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return ReasonTimedOut
	}
	if ctx.Err() != nil {
		return "policy: evaluation canceled"
	}
	var te *topdown.Error
	if errors.As(err, &te) {
		if te.Code == topdown.CancelErr {
			return "policy: evaluation canceled"
		}
		msg := te.Code + ": " + te.Message
		if te.Location != nil {
			msg += fmt.Sprintf(" (%s:%d)", te.Location.File, te.Location.Row)
		}
		return "policy: evaluation error: " + msg
	}
	return "policy: evaluation error: " + err.Error()
}

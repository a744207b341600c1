// Package replay decides recorded calls again with a candidate policy:
// `sluice policy replay` answers "which of last week's real calls would
// this change have decided differently?".
//
// It reads hash-chained audit logs (package audit) in one pass per file,
// verifying the chain as it goes (audit.Stream: each line checked on the
// deciding workers, the links in order): a broken chain is an error naming
// the file and line and no report at all, never a partial answer. Every decision record
// that carries its input (audit.record_inputs) is decided again by a
// policy.Engine (prepared queries, several workers) and compared with the
// recorded decision. A record that cannot be replayed is counted as
// skipped with its reason, never dropped silently.
//
// Each worker decides through a policy.Memo: records whose input agrees
// on every path the policy reads are evaluated once (exactly: a policy
// that could depend on more turns the memo off, and Report.Memo says
// why). An evaluation that runs out of time is tried once more with a
// longer budget; one that runs out again is skipped as an evaluation
// timeout, never reported as a change to policy_error.
package replay

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/open-policy-agent/opa/v1/ast"

	"github.com/sluice-gw/sluice/gateway/audit"
	"github.com/sluice-gw/sluice/policy"
)

// The reasons a decision record is skipped (Report.Skipped's keys).
const (
	SkipNoInput      = "no input recorded (audit.record_inputs off, or a record from before inputs were recorded)"
	SkipTruncated    = "input cut to audit.record_input_max: deciding part of it could differ"
	SkipBadInput     = "recorded input is not a valid input document"
	SkipBadRecord    = "decision record is not readable"
	SkipBadDecision  = "recorded decision is not allow, ask or block"
	SkipUnfinished   = "unfinished last line (a write the gateway did not finish)"
	SkipTimeout      = "evaluation timeout (twice: the second time with Options.RetryTimeout)"
	maxExamples      = 3
	eventDecision    = "decision"
	eventHoldCreated = "hold_created"
)

// GCPercent is the garbage collector's target `sluice policy replay`
// runs with (debug.SetGCPercent) unless GOGC is set: a replay is a batch
// whose live heap is small (the lines in flight and the tallies) and
// whose every record allocates its parse and evaluation, so collecting
// four times less often costs little memory and about a fifth of the CPU
// (BenchmarkRun: 186 → 151 cpu-µs a record).
const GCPercent = 400

// DefaultRetryTimeout is the budget of the second evaluation of a record
// whose first ran out of time (policy.DefaultTimeout when Options.Timeout
// is 0): a machine loaded enough to stall one evaluation for a second is
// given ten.
const DefaultRetryTimeout = 10 * policy.DefaultTimeout

// Options narrow a replay.
type Options struct {
	Since   time.Time // records before are not replayed (zero: all)
	Workers int       // deciding goroutines; 0 is GOMAXPROCS
	// NoMemo evaluates every record (policy.Memo off), to compare.
	NoMemo bool
	// Timeout bounds a record's first evaluation (0: policy.DefaultTimeout),
	// RetryTimeout its second, after a timeout (0: DefaultRetryTimeout).
	Timeout, RetryTimeout time.Duration
}

// Example names one record of a change: where it is and when it was.
type Example struct {
	File      string    `json:"file"`
	Line      int       `json:"line"`
	Seq       uint64    `json:"seq"`
	Time      time.Time `json:"time"`
	RequestID string    `json:"request_id"`
}

// Change is one row of the report: the calls of one tool whose decision
// went from one action and rule to another.
type Change struct {
	Tool     string    `json:"tool"`
	From     string    `json:"from"`
	To       string    `json:"to"`
	FromRule string    `json:"from_rule"`
	ToRule   string    `json:"to_rule"`
	Loosened bool      `json:"loosened"`  // To lets through what From did not (block→ask, block→allow, ask→allow)
	RuleOnly bool      `json:"rule_only"` // the same action, decided by another rule
	Count    int       `json:"count"`
	Examples []Example `json:"examples"` // the first few, in log order
}

// File is what was read of one audit log.
type File struct {
	Path     string `json:"path"`
	Lines    int    `json:"lines"`
	Verified int    `json:"verified"`
}

// Report is a replay's answer.
type Report struct {
	Files     []File         `json:"files"`
	Decisions int            `json:"decisions"` // decision records read (in --since)
	Replayed  int            `json:"replayed"`  // of them decided again
	Unchanged int            `json:"unchanged"`
	Changed   int            `json:"changed"`      // another action
	RuleOnly  int            `json:"rule_changed"` // the same action by another rule
	Loosened  int            `json:"loosened"`
	Changes   []Change       `json:"changes"`
	Skipped   map[string]int `json:"skipped"` // reason → records
	Seconds   float64        `json:"seconds"`
	// Evaluated is how many policy evaluations the replay made; the other
	// replayed records were answered by the memo (Memo: "on", or "off:"
	// and why).
	Evaluated int    `json:"evaluated"`
	Memo      string `json:"memo"`
	// Retried are the records whose first evaluation timed out and that
	// were evaluated again (those that timed out again are skipped).
	Retried int `json:"retried"`
}

// BrokenChainError is a log whose chain does not verify.
type BrokenChainError struct {
	File   string
	Line   int
	Reason string
}

func (e *BrokenChainError) Error() string {
	return fmt.Sprintf("replay: %s line %d: the audit chain is broken (%s); nothing was replayed", e.File, e.Line, e.Reason)
}

// recordedFields is the part of a decision record's fields a replay reads.
type recordedFields struct {
	Decision  string          `json:"decision"`
	Rule      string          `json:"rule"`
	Reason    string          `json:"reason"`
	Tool      string          `json:"tool"`
	Input     json.RawMessage `json:"input"`
	Truncated bool            `json:"input_truncated"`
}

type changeKey struct{ tool, from, to, fromRule, toRule string }

// tally is one worker's counts, merged at the end, and its memo.
type tally struct {
	decisions, replayed, unchanged, retried int
	evals                                   int // made without the memo
	skipped                                 map[string]int
	changes                                 map[changeKey]*Change
	memo                                    *policy.Memo // nil: Options.NoMemo
}

// Run replays files, in order, with eng.
func Run(ctx context.Context, eng *policy.Engine, files []string, o Options) (*Report, error) {
	start := time.Now()
	workers := o.Workers
	if workers <= 0 {
		workers = runtime.GOMAXPROCS(0)
	}
	rep := &Report{Skipped: map[string]int{}, Changes: []Change{}, Memo: "off: Options.NoMemo"}
	tallies := make([]*tally, workers)
	for i := range tallies {
		tallies[i] = &tally{skipped: map[string]int{}, changes: map[changeKey]*Change{}}
		if !o.NoMemo {
			tallies[i].memo = policy.NewMemo(eng, 0)
		}
	}
	if !o.NoMemo {
		rep.Memo = "on"
		if why := tallies[0].memo.Off(); why != "" {
			rep.Memo = "off: " + why
		}
	}
	// One pass per file: audit.Stream checks each line on the workers and
	// the links in order, and hands every line that passes its own checks
	// to decide. A break anywhere is an error and no report: what was
	// decided before the break was found is dropped with the tallies.
	for _, path := range files {
		ch, err := audit.Stream(ctx, path, workers, func(w, line int, rec *audit.Line, _ []byte) {
			if rec.Event == eventDecision || rec.Event == eventHoldCreated {
				tallies[w].decide(ctx, eng, path, line, rec, &o)
			}
		})
		if err != nil {
			return nil, fmt.Errorf("replay: %s: %w", path, err)
		}
		if b := ch.Break; b != nil {
			if !b.Unfinished {
				return nil, &BrokenChainError{File: path, Line: b.Line, Reason: b.Reason}
			}
			rep.Skipped[SkipUnfinished]++
		}
		rep.Files = append(rep.Files, File{Path: path, Lines: ch.Lines, Verified: ch.Verified})
	}
	byKey := map[changeKey]*Change{}
	for _, t := range tallies {
		rep.Decisions += t.decisions
		rep.Replayed += t.replayed
		rep.Unchanged += t.unchanged
		rep.Retried += t.retried
		rep.Evaluated += t.evals
		if t.memo != nil {
			evals, _ := t.memo.Stats()
			rep.Evaluated += evals
		}
		for k, n := range t.skipped {
			rep.Skipped[k] += n
		}
		for k, c := range t.changes {
			m, ok := byKey[k]
			if !ok {
				cc := *c
				byKey[k] = &cc
				continue
			}
			m.Count += c.Count
			m.Examples = append(m.Examples, c.Examples...)
		}
	}
	for _, c := range byKey {
		slices.SortFunc(c.Examples, func(a, b Example) int { return cmpExample(files, a, b) })
		c.Examples = c.Examples[:min(len(c.Examples), maxExamples)]
		rep.Changes = append(rep.Changes, *c)
		if c.RuleOnly {
			rep.RuleOnly += c.Count
		} else {
			rep.Changed += c.Count
		}
		if c.Loosened {
			rep.Loosened += c.Count
		}
	}
	slices.SortFunc(rep.Changes, func(a, b Change) int {
		if a.Loosened != b.Loosened { // loosenings first: they are what a reviewer must see
			if a.Loosened {
				return -1
			}
			return 1
		}
		return strings.Compare(a.Tool+"\x00"+a.From+"\x00"+a.To+"\x00"+a.FromRule+"\x00"+a.ToRule,
			b.Tool+"\x00"+b.From+"\x00"+b.To+"\x00"+b.FromRule+"\x00"+b.ToRule)
	})
	rep.Seconds = time.Since(start).Seconds()
	return rep, nil
}

func cmpExample(files []string, a, b Example) int {
	ai, bi := slices.Index(files, a.File), slices.Index(files, b.File)
	if ai != bi {
		return ai - bi
	}
	return a.Line - b.Line
}

// decide replays one decision record into t. The record's fields are
// parsed once, straight into the AST value the engine decides
// (policy.ParseJSON, policy.InputFromValue); an input in a shape other
// than the gateway records is decoded strictly and decided as `sluice
// policy eval` would (slowInput).
func (t *tally) decide(ctx context.Context, eng *policy.Engine, file string, line int, rec *audit.Line, o *Options) {
	if len(rec.Fields) == 0 {
		return // no fields: not a decision
	}
	f, input, err := readFields(rec.Fields)
	if err != nil {
		t.decisions++
		t.skipped[SkipBadRecord]++
		return
	}
	if f.Decision == "" {
		return // refused before any decision (unknown tool, not granted …): nothing to replay
	}
	if !o.Since.IsZero() && rec.Time.Before(o.Since) {
		return
	}
	t.decisions++
	from, fromRule, err := recordedDecision(f.Decision, f.Rule, f.Reason)
	switch {
	case err != nil:
		t.skipped[SkipBadDecision]++
		return
	case f.Truncated:
		t.skipped[SkipTruncated]++
		return
	case input == nil || isNull(input):
		t.skipped[SkipNoInput]++
		return
	}
	var decide func(context.Context) policy.Decision
	tool := f.Tool
	pi, err := policy.InputFromValue(input.Value)
	if err == nil && tool == "" {
		tool = pi.Tool
	}
	switch {
	case err == nil && t.memo != nil:
		decide = func(ctx context.Context) policy.Decision { return t.memo.DecideParsed(ctx, pi) }
	case err == nil:
		decide = func(ctx context.Context) policy.Decision { t.evals++; return eng.DecideParsed(ctx, pi) }
	case errors.Is(err, policy.ErrNotCanonical):
		in, err := slowInput(rec.Fields)
		if err != nil {
			t.skipped[SkipBadInput]++
			return
		}
		if tool == "" {
			tool = in.Tool
		}
		decide = func(ctx context.Context) policy.Decision { t.evals++; return eng.Decide(ctx, in) }
	default:
		t.skipped[SkipBadInput]++
		return
	}
	d, ok := t.budgeted(ctx, o, decide)
	if !ok {
		t.skipped[SkipTimeout]++
		return
	}
	t.replayed++
	if d.Action == from && d.Rule == fromRule {
		t.unchanged++
		return
	}
	k := changeKey{tool, from.String(), d.Action.String(), fromRule, d.Rule}
	c, ok := t.changes[k]
	if !ok {
		c = &Change{Tool: tool, From: k.from, To: k.to, FromRule: fromRule, ToRule: d.Rule, Loosened: d.Action > from, RuleOnly: d.Action == from}
		t.changes[k] = c
	}
	c.Count++
	if len(c.Examples) < maxExamples {
		c.Examples = append(c.Examples, Example{File: file, Line: line, Seq: rec.Seq, Time: rec.Time, RequestID: rec.RequestID})
	}
}

// budgeted decides within o.Timeout and, when that runs out, once more
// within o.RetryTimeout; ok is false when the second runs out too.
func (t *tally) budgeted(ctx context.Context, o *Options, decide func(context.Context) policy.Decision) (d policy.Decision, ok bool) {
	if o.Timeout > 0 {
		d = within(ctx, o.Timeout, decide)
	} else {
		d = decide(ctx) // the engine's own bound (policy.DefaultTimeout) without a context to make
	}
	if !timedOut(d) {
		return d, true
	}
	t.retried++
	d = within(ctx, cmp.Or(o.RetryTimeout, DefaultRetryTimeout), decide)
	return d, !timedOut(d)
}

func within(ctx context.Context, budget time.Duration, decide func(context.Context) policy.Decision) policy.Decision {
	ctx, cancel := context.WithTimeout(ctx, budget)
	defer cancel()
	return decide(ctx)
}

func timedOut(d policy.Decision) bool {
	return d.Rule == policy.RulePolicyError && d.Reason == policy.ReasonTimedOut
}

// readKeys are the fields a replay reads of a decision record, in
// readFields's order; the rest are checked and skipped.
var readKeys = []string{"decision", "rule", "reason", "tool", "input_truncated", "input"}

// readFields parses a decision record's fields in one pass
// (policy.ParseObjectFields): what a replay reads of them, and the
// input's term (nil when absent). A field of the wrong type is an error,
// as json.Unmarshal into recordedFields would give.
func readFields(raw []byte) (recordedFields, *ast.Term, error) {
	var f recordedFields
	vs, err := policy.ParseObjectFields(raw, readKeys, "input")
	if err != nil {
		return f, nil, err
	}
	for i, dst := range []*string{&f.Decision, &f.Rule, &f.Reason, &f.Tool} {
		if x := vs[i]; x != nil && !isNull(x) {
			s, ok := x.Value.(ast.String)
			if !ok {
				return f, nil, fmt.Errorf("replay: field %s is not a string", readKeys[i])
			}
			*dst = string(s)
		}
	}
	if x := vs[4]; x != nil && !isNull(x) {
		b, ok := x.Value.(ast.Boolean)
		if !ok {
			return f, nil, errors.New("replay: field input_truncated is not a boolean")
		}
		f.Truncated = bool(b)
	}
	return f, vs[5], nil
}

func isNull(t *ast.Term) bool {
	_, ok := t.Value.(ast.Null)
	return ok
}

// slowInput decodes the input of fields strictly (policy.DecodeInput), for
// an input not in the shape the gateway records.
func slowInput(fields []byte) (*policy.Input, error) {
	var f recordedFields
	if err := json.Unmarshal(fields, &f); err != nil {
		return nil, err
	}
	return policy.DecodeInput(f.Input)
}

// recordedDecision is the policy's decision a record states. A call an
// "always allow" grant let through is recorded as allowed by rule
// "grant:ID"; the policy had asked, under the rule its reason names.
func recordedDecision(action, rule, reason string) (policy.Action, string, error) {
	a, err := policy.ParseAction(action)
	if err != nil {
		return policy.Block, "", err
	}
	if strings.HasPrefix(rule, "grant:") && a == policy.Allow {
		_, after, ok := strings.Cut(reason, "; policy ")
		r, _, ok2 := strings.Cut(after, " asked")
		if !ok || !ok2 {
			return policy.Block, "", errors.New("replay: grant record without the policy's rule")
		}
		return policy.Ask, r, nil
	}
	return a, rule, nil
}

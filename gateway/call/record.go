package call

import (
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/sluice-gw/sluice/gateway/refusal"
)

// Kind is what a record is about: a tool call, or a piece of raw egress.
type Kind string

// The kinds of record.
const (
	KindToolCall Kind = "tool_call"
	KindHTTP     Kind = "http"    // a forward-proxied or intercepted HTTP request
	KindConnect  Kind = "connect" // a CONNECT tunnel
	KindDNS      Kind = "dns"     // a DNS question
)

// String returns the kind as recorded.
func (k Kind) String() string { return string(k) }

// egress says whether records of k are raw egress's.
func (k Kind) egress() bool { return k != KindToolCall }

// The keys of audit record fields and of the canonical log line. Every
// writer uses these constants; a key spelled twice is a key that drifts.
const (
	KeyRequestID       = "request_id"
	KeyKind            = "kind"
	KeyTransport       = "transport"
	KeyListener        = "listener" // the listener the caller came through, when not the sandbox socket ("hosted")
	KeyDecision        = "decision"
	KeyReason          = "reason"
	KeyRule            = "rule"
	KeyCode            = "code"
	KeyAgent           = "agent"
	KeySession         = "session"
	KeyUser            = "user"
	KeySandbox         = "sandbox"
	KeyTool            = "tool"
	KeyCredential      = "credential"
	KeyDestHost        = "dest_host"
	KeyPort            = "port"
	KeyResolvedIP      = "resolved_ip"
	KeyStatus          = "status"
	KeyUpstreamStatus  = "upstream_status"
	KeyUpstreamError   = "upstream_error"
	KeySecretReflected = "secret_reflected"
	KeyBytesUp         = "bytes_up"
	KeyBytesDown       = "bytes_down"
	KeyDurationMS      = "duration_ms"
	KeyEgress          = "egress" // the sandbox's egress narrowing (sandboxd --egress), when it has one
	// KeyPolicyRevision names the policy that decided: an OPA bundle's
	// revision or a digest of the Rego and data files.
	KeyPolicyRevision = "policy_revision"

	// A decision record carries its input document (audit.record_inputs):
	// KeyInput is the document as JSON; when it was larger than
	// audit.record_input_max, KeyInputTruncated is true, KeyInputSize its
	// size before the cut and KeyInputCut what was left out ("args.body",
	// "request.body", or "input" when nothing could be kept).
	KeyInput          = "input"
	KeyInputCut       = "input_cut"
	KeyInputSize      = "input_size"
	KeyInputTruncated = "input_truncated"

	KeyTraceID = "trace_id" // the call's OpenTelemetry trace, when tracing is on

	// A DNS answer's record (EventDNSAnswered) adds these.
	KeyAnswers = "answers"
	KeyQType   = "qtype"
	KeyRCode   = "rcode"
)

// ListenerHosted is Record.Listener for a caller that came through
// gateway.hosted's listener.
const ListenerHosted = "hosted"

// The audit events a record is written under.
const (
	EventDecision        = "decision"         // decided (or refused before a decision); written before anything is sent
	EventResult          = "result"           // the upstream's answer, or why there was none
	EventSecretReflected = "secret_reflected" // the upstream echoed a credential; it was scrubbed
	EventDNSAnswered     = "dns_answered"     // raw egress: what a DNS question was answered (with KeyAnswers, KeyQType, KeyRCode)
)

// The messages of the canonical log lines.
const (
	LineToolCall = "tool_call"
	LineEgress   = "egress"
)

// Decision is a policy decision as recorded.
type Decision struct {
	Action string // allow, ask or block
	Rule   string
	Reason string
	// Revision is the policy revision that decided (policy.Decision.Revision).
	Revision string
}

// Field is one key and value of an audit record's fields.
type Field struct {
	Key   string
	Value any
}

// Record is what one decision writes: every audit record of a tool call
// or of raw egress and its one canonical log line are made from it, so
// that the two cannot drift. Fields a kind does not have stay zero and
// are left out.
type Record struct {
	RequestID string
	Start     time.Time
	Kind      Kind
	Transport Transport // tool calls: the door
	Sandbox   string
	Agent     string
	Session   string
	User      string
	Egress    string // the caller's egress narrowing, as in its preamble ("" when none)
	Tool      string // tool calls: the tool's name (never its alias)
	TraceID   string // the OpenTelemetry trace of the call ("" when tracing is off)

	// Listener is the listener the caller's connection came through when
	// it is not the sandbox socket: ListenerHosted for gateway.hosted's
	// TLS listener (a token named the caller, not a relay). "" otherwise.
	Listener string

	Decision Decision
	Decided  bool // Decision holds the policy's decision

	DestHost   string
	Port       int // raw egress
	resolvedIP atomic.Pointer[string]
	Credential string // where the credential went ("header:X-Api-Key"), never its value

	Status         int // the gateway's answer to the caller
	UpstreamStatus int // the upstream's status (0: none)
	// UpstreamErr says why an upstream's reply was not relayed, or was
	// cut (encoded_reply, malformed_response …).
	UpstreamErr string
	// Event is raw egress's refusal before policy (doh_refused,
	// sni_mismatch …): the record's reason when there is no decision.
	Event     string
	Reflected bool // the upstream echoed a credential (scrubbed)

	// Input is the decision's input document as the decision record
	// carries it (KeyInput): compact encoding/json output (EncodedJSON:
	// the audit log writes it as is), taken before
	// any credential is attached; nil when inputs are not recorded or it
	// was cut whole. InputCut says what was cut, InputSize the size
	// before the cut (both zero when nothing was).
	Input     EncodedJSON
	InputCut  string
	InputSize int

	BytesUp, BytesDown atomic.Int64 // raw egress
}

// EncodedJSON is JSON the gateway encoded itself, with encoding/json or
// an encoder held byte for byte to it (toolinput.AppendJSON, fuzzed):
// compact and HTML-escaped. The audit log writes it as it is, with no
// second scan (audit.Encoded); JSON that came from outside and was not
// encoded here is a json.RawMessage, which the log checks. Nothing but
// such an encoder's output may be converted to it.
type EncodedJSON []byte

// EncodedJSON returns j's bytes, for audit.Encoded.
func (j EncodedJSON) EncodedJSON() []byte { return j }

// MarshalJSON returns j's bytes, so that encoding/json (the audit log's
// fallback, the stream, the admin API) writes the document, not base64.
func (j EncodedJSON) MarshalJSON() ([]byte, error) {
	if j == nil {
		return []byte("null"), nil
	}
	return j, nil
}

// SetResolvedIP records the address actually dialled. It may be called
// from dial callbacks that outlive the request.
func (r *Record) SetResolvedIP(ip string) { r.resolvedIP.Store(&ip) }

// ResolvedIP returns the address recorded by SetResolvedIP, or "".
func (r *Record) ResolvedIP() string {
	if p := r.resolvedIP.Load(); p != nil {
		return *p
	}
	return ""
}

// Fields are the record's audit fields for event, refused with code (""
// when not refused), in increasing key order with no key twice (the
// shape audit.Record.Sorted takes, so no map is built per record).
func (r *Record) Fields(event string, code refusal.Code) []Field {
	return AppendFields(make([]Field, 0, 20), r, event, code)
}

// FieldShape is the shape of one key and value: Field, and the audit
// log's own field type, which call does not import.
type FieldShape interface {
	~struct {
		Key   string
		Value any
	}
}

// AppendFields appends r's Fields to f as the caller's field type, so that
// a writer hands the audit log its fields without copying them.
func AppendFields[F FieldShape](f []F, r *Record, event string, code refusal.Code) []F {
	eg := r.Kind.egress()
	end := event == EventResult || (!eg && event == EventSecretReflected)
	f = append(f, F(Field{KeyAgent, r.Agent}))
	if eg && event == EventResult {
		f = append(f, F(Field{KeyBytesDown, r.BytesDown.Load()}), F(Field{KeyBytesUp, r.BytesUp.Load()}))
	}
	if code != "" {
		f = append(f, F(Field{KeyCode, string(code)}))
	}
	if r.Credential != "" {
		f = append(f, F(Field{KeyCredential, r.Credential}))
	}
	if r.Decided {
		f = append(f, F(Field{KeyDecision, r.Decision.Action}))
	}
	if eg || r.DestHost != "" {
		f = append(f, F(Field{KeyDestHost, r.DestHost}))
	}
	if end {
		f = append(f, F(Field{KeyDurationMS, time.Since(r.Start).Milliseconds()}))
	}
	if r.Egress != "" {
		f = append(f, F(Field{KeyEgress, r.Egress}))
	}
	if event == EventDecision {
		if r.Input != nil {
			f = append(f, F(Field{KeyInput, r.Input}))
		}
		if r.InputCut != "" {
			f = append(f, F(Field{KeyInputCut, r.InputCut}), F(Field{KeyInputSize, r.InputSize}), F(Field{KeyInputTruncated, true}))
		}
	}
	if eg {
		f = append(f, F(Field{KeyKind, string(r.Kind)}))
	}
	if r.Listener != "" {
		f = append(f, F(Field{KeyListener, r.Listener}))
	}
	// policy_revision sorts before port: out of order, the audit log
	// folds the pairs into a map and sorts them again for every record.
	if r.Decided && r.Decision.Revision != "" {
		f = append(f, F(Field{KeyPolicyRevision, r.Decision.Revision}))
	}
	if r.Port != 0 {
		f = append(f, F(Field{KeyPort, r.Port}))
	}
	switch {
	case r.Decided:
		f = append(f, F(Field{KeyReason, r.Decision.Reason}))
	case eg && r.Event != "":
		f = append(f, F(Field{KeyReason, r.Event}))
	}
	if ip := r.ResolvedIP(); ip != "" {
		f = append(f, F(Field{KeyResolvedIP, ip}))
	}
	if r.Decided {
		f = append(f, F(Field{KeyRule, r.Decision.Rule}))
	}
	f = append(f, F(Field{KeySandbox, r.Sandbox}))
	if !eg && end {
		f = append(f, F(Field{KeySecretReflected, r.Reflected}))
	}
	f = append(f, F(Field{KeySession, r.Session}))
	if r.Status != 0 {
		f = append(f, F(Field{KeyStatus, r.Status}))
	}
	if !eg {
		f = append(f, F(Field{KeyTool, r.Tool}))
	}
	if r.TraceID != "" {
		f = append(f, F(Field{KeyTraceID, r.TraceID}))
	}
	if r.Transport != "" {
		f = append(f, F(Field{KeyTransport, string(r.Transport)}))
	}
	if r.UpstreamErr != "" {
		f = append(f, F(Field{KeyUpstreamError, r.UpstreamErr}))
	}
	if r.UpstreamStatus != 0 {
		f = append(f, F(Field{KeyUpstreamStatus, r.UpstreamStatus}))
	}
	f = append(f, F(Field{KeyUser, r.User}))
	return f
}

// Line is the record's canonical log line: its message, its level and its
// attributes, with reason (Reason's) in it. One line per tool call, per
// proxied request, per tunnel and per DNS question.
func (r *Record) Line(e *refusal.Error, reason string) (msg string, level slog.Level, attrs []slog.Attr) {
	return r.AppendLine(make([]slog.Attr, 0, LineAttrs), e, reason)
}

// LineAttrs is the most attributes a canonical line has.
const LineAttrs = 20

// AppendLine is Line appending the attributes to attrs: a writer that
// hands them straight to the logger keeps them on its stack.
func (r *Record) AppendLine(attrs []slog.Attr, e *refusal.Error, reason string) (msg string, level slog.Level, _ []slog.Attr) {
	level = slog.LevelInfo
	if e != nil && e.Status >= 500 {
		level = slog.LevelWarn
	}
	decision := ""
	if r.Decided {
		decision = r.Decision.Action
	}
	eg := r.Kind.egress()
	msg = LineToolCall
	attrs = append(attrs, slog.String(KeyRequestID, r.RequestID))
	if eg {
		msg = LineEgress
		attrs = append(attrs, slog.String(KeyKind, string(r.Kind)))
	}
	attrs = append(attrs,
		slog.String(KeyDecision, decision),
		slog.String(KeyReason, reason),
		slog.String(KeyRule, r.Decision.Rule),
		slog.String(KeyAgent, r.Agent),
		slog.String(KeySession, r.Session),
		slog.String(KeyUser, r.User),
		slog.String(KeySandbox, r.Sandbox))
	if !eg {
		attrs = append(attrs, slog.String(KeyTool, r.Tool), slog.String(KeyTransport, string(r.Transport)))
	}
	attrs = append(attrs, slog.String(KeyDestHost, r.DestHost))
	if eg {
		attrs = append(attrs, slog.Int(KeyPort, r.Port))
		if r.Transport != "" {
			attrs = append(attrs, slog.String(KeyTransport, string(r.Transport)))
		}
	}
	attrs = append(attrs,
		slog.String(KeyResolvedIP, r.ResolvedIP()),
		slog.Int(KeyStatus, r.Status),
		slog.Int(KeyUpstreamStatus, r.UpstreamStatus))
	if eg {
		attrs = append(attrs, slog.Int64(KeyBytesUp, r.BytesUp.Load()), slog.Int64(KeyBytesDown, r.BytesDown.Load()))
	}
	attrs = append(attrs, slog.Float64(KeyDurationMS, float64(time.Since(r.Start).Microseconds())/1000))
	if r.TraceID != "" {
		attrs = append(attrs, slog.String(KeyTraceID, r.TraceID))
	}
	if r.Listener != "" {
		attrs = append(attrs, slog.String(KeyListener, r.Listener))
	}
	return msg, level, attrs
}

// Reason is the line's reason: for a refusal its code (raw egress's
// Event instead, when set) and, for the log only, its cause; a reply that
// echoed a credential is secret_reflected; otherwise the decision's
// reason.
func (r *Record) Reason(e *refusal.Error) string {
	if e == nil {
		if r.Reflected {
			return EventSecretReflected
		}
		return r.Decision.Reason
	}
	reason := string(e.Code)
	if r.Kind.egress() && r.Event != "" {
		reason = r.Event
	}
	if c := e.Cause(); c != nil {
		reason += ": " + c.Error()
	}
	return reason
}

// Package extauthz is the gateway's door for Envoy: an
// envoy.service.auth.v3.Authorization server (Envoy's ext_authz filter,
// Istio's envoyExtAuthzGrpc provider, Envoy Gateway's extAuth) and, on the
// same gRPC listener, an ADS server that configures a sluice-managed Envoy.
//
// The door is thin. It turns a CheckRequest into a Request (Parse: the
// target and authority exactly as Envoy will send them, refused when not
// canonical), takes the identity only from what Envoy vouches for
// (Identify: the mTLS source principal or context_extensions, never a
// header), and hands the request to the gateway's one call pipeline
// through Deps: a request that maps to a connector's tool is decided as
// that tool call in decide-only mode (the pipeline returns the credential
// to attach), any other host as raw egress. The Verdict becomes a
// CheckResponse: allow is an OkHttpResponse whose header mutations
// overwrite the credential header and remove Proxy-Authorization and every
// x-sluice-* header the client sent; every refusal, hold or failure is a
// DeniedHttpResponse with sluice's JSON error body. A policy outcome is
// never a gRPC error, so Envoy's failure_mode_allow never decides.
//
// This package never imports the root gateway package: the root fills in
// Deps.
package extauthz

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/genproto/googleapis/rpc/code"
	rpcstatus "google.golang.org/genproto/googleapis/rpc/status"

	"github.com/sluice-gw/sluice/gateway/config"
	"github.com/sluice-gw/sluice/gateway/guard"
)

// Refusal codes this door answers itself, before the pipeline.
const (
	CodeBadRequest       = "bad_request"
	CodeIdentityRequired = "identity_required"
	CodeEgressDenied     = "egress_denied"
	CodeApprovalPending  = "approval_pending"
	CodeBug              = "internal_error"
)

// Match is a request mapped to a connector's tool.
type Match struct {
	Connector  string
	Tool       string            // "<slug>.<operation>"
	PathParams map[string]string // from the path template, decoded
}

// Found says what Deps.Match found for a request.
type Found int

const (
	// NoConnector: the host is no connector's; the request is raw egress.
	NoConnector Found = iota
	// Matched: the request is Match.Tool.
	Matched
	// NoOperation: the host is a connector's but no operation of its spec
	// has this method and path. It is refused, never decided as raw
	// egress: a connector's host is reached only through its tools.
	NoOperation
	// Ambiguous: two connectors' operations fit equally; refused.
	Ambiguous
)

// String names the result.
func (f Found) String() string {
	switch f {
	case NoConnector:
		return "no_connector"
	case Matched:
		return "matched"
	case NoOperation:
		return "no_operation"
	case Ambiguous:
		return "ambiguous"
	}
	return "found(" + strconv.Itoa(int(f)) + ")"
}

// CodeUnknownTool is the refusal of a request to a connector's host that
// is none of its operations.
const CodeUnknownTool = "unknown_tool"

// Header is one header the answer sets, overwriting any the client sent.
type Header struct{ Name, Value string }

// Verdict is the pipeline's answer to one request, in the door's terms.
type Verdict struct {
	// Allow lets Envoy send the request with Set applied (overwriting),
	// Remove removed and SetQuery set.
	Allow    bool
	Set      []Header
	SetQuery []Header
	Remove   []string

	// Status, Code and Message are the refusal (Allow false): the HTTP
	// status Envoy answers the client with and sluice's stable code.
	Status  int
	Code    string
	Message string
	// RetryAfter is sent as Retry-After (holds, rate limits).
	RetryAfter time.Duration
	// HoldID is set when the request is held for a person's approval
	// (Status 202); HoldState is the hold's state.
	HoldID    string
	HoldState string

	// RequestID ties the answer to the audit record and log line.
	RequestID string
}

// Deps is what the door needs from the gateway; the root fills it in.
type Deps struct {
	Log        *slog.Logger
	Principals []config.ExtAuthzPrincipal
	// HoldWait bounds the inline wait for a held request's decision
	// (gateway.ext_authz.hold_wait); the gRPC deadline bounds it too.
	HoldWait time.Duration
	// Match maps a request to a connector's tool by base_url and the
	// spec's path templates; ok is false when the host is no connector's.
	// port is 0 when the request's authority named none.
	// rawQuery picks between operations that differ by a fixed query.
	Match func(host string, port int, method, escapedPath, rawQuery string) (Match, Found)
	// Call decides a request that maps to a tool: the one call pipeline
	// in decide-only mode (identity, limits, Rego, hold, credential,
	// audit with transport envoy). wait bounds an ask's inline wait.
	Call func(ctx context.Context, r *Request, m Match, wait time.Duration) Verdict
	// Egress decides a request to a host that is no connector's as raw
	// egress (kind http, or connect for CONNECT), audited likewise.
	Egress func(ctx context.Context, r *Request, wait time.Duration) Verdict
	// Refused audits a request the door refused before the pipeline (no
	// identity, a request that cannot be decided as sent); it returns
	// the request id of the record. r may lack an identity.
	Refused func(ctx context.Context, r *Request, v Verdict) string
}

// Authz is the Authorization service.
type Authz struct {
	authv3.UnimplementedAuthorizationServer
	d          Deps
	principals map[string]config.ExtAuthzPrincipal
}

// NewAuthz returns the Authorization service over d.
func NewAuthz(d Deps) *Authz {
	if d.Log == nil {
		d.Log = slog.New(slog.DiscardHandler)
	}
	p := make(map[string]config.ExtAuthzPrincipal, len(d.Principals))
	for _, x := range d.Principals {
		p[x.Principal] = x
	}
	return &Authz{d: d, principals: p}
}

// holdMargin is kept from the gRPC deadline for answering after an inline
// hold wait: a wait that used all of it would leave Envoy to time out,
// and Envoy's timeout is a failure (failure_mode_allow's to decide).
const holdMargin = 250 * time.Millisecond

// Check decides one request. Its error is always nil: every outcome,
// refusals and failures included, is an answer Envoy relays.
func (a *Authz) Check(ctx context.Context, cr *authv3.CheckRequest) (*authv3.CheckResponse, error) {
	return a.check(ctx, cr), nil
}

func (a *Authz) check(ctx context.Context, cr *authv3.CheckRequest) *authv3.CheckResponse {
	r := &Request{}
	id, src, ierr := Identify(cr, a.principals)
	if ierr == nil {
		r.Identity, r.IdentitySource = id, src
	}
	pr, perr := Parse(cr)
	if perr == nil {
		pr.Identity, pr.IdentitySource = r.Identity, r.IdentitySource
		r = pr
	}
	refuse := func(status int, code, msg string) *authv3.CheckResponse {
		v := Verdict{Status: status, Code: code, Message: msg}
		if a.d.Refused != nil {
			v.RequestID = a.d.Refused(ctx, r, v)
		}
		a.d.Log.Info("ext_authz refused", "decision", "block", "reason", code, "agent", r.Identity.Agent, "dest_host", r.Host, "request_id", v.RequestID)
		return Answer(v, r)
	}
	if ierr != nil {
		return refuse(http.StatusForbidden, CodeIdentityRequired, ierr.Error())
	}
	if perr != nil {
		var be *BadRequestError
		if errors.As(perr, &be) {
			return refuse(http.StatusBadRequest, CodeBadRequest, be.Reason)
		}
		return refuse(http.StatusBadRequest, CodeBadRequest, "the request cannot be decided")
	}
	env, err := EnvoyJSON(cr, r)
	if err != nil {
		return refuse(http.StatusInternalServerError, CodeBug, "bug: the request cannot be rendered for policy")
	}
	r.Envoy = env

	wait := a.d.HoldWait
	if dl, ok := ctx.Deadline(); ok {
		if left := time.Until(dl) - holdMargin; left < wait {
			wait = max(left, 0)
		}
	}
	var v Verdict
	m, found := a.match(r)
	switch found {
	case NoOperation:
		return refuse(http.StatusNotFound, CodeUnknownTool, r.Method+" "+r.Path+" is none of the operations of the connector at "+r.Host)
	case Ambiguous:
		return refuse(http.StatusConflict, CodeUnknownTool, r.Method+" "+r.Path+" on "+r.Host+" fits operations of two connectors; give them distinct base_urls")
	}
	if found == Matched {
		if a.d.Call == nil {
			return refuse(http.StatusInternalServerError, CodeBug, "bug: no call pipeline")
		}
		v = a.d.Call(ctx, r, m, wait)
	} else {
		// Raw egress: an address the guard refuses is refused here, before
		// policy (THREATS C1, C2): Envoy, not the gateway, will dial it.
		if reason, refused := refusedHost(r.Host); refused {
			return refuse(http.StatusForbidden, CodeEgressDenied, reason)
		}
		if a.d.Egress == nil {
			return refuse(http.StatusInternalServerError, CodeBug, "bug: no egress decision")
		}
		v = a.d.Egress(ctx, r, wait)
	}
	return Answer(v, r)
}

func (a *Authz) match(r *Request) (Match, Found) {
	if a.d.Match == nil || r.Method == http.MethodConnect {
		return Match{}, NoConnector
	}
	port := 0
	if r.ExplicitPort {
		port = r.Port
	}
	return a.d.Match(r.Host, port, r.Method, r.Path, r.RawQuery)
}

// refusedHost says whether host (canonical) is an address or name the
// guard refuses to dial whatever the policy says.
func refusedHost(host string) (string, bool) {
	if ip, err := netip.ParseAddr(host); err == nil {
		if c := guard.Classify(ip); c != guard.Public {
			return "destination " + host + " is a " + c.String() + " address", true
		}
		return "", false
	}
	if c := guard.NameClass(host); c != guard.Public {
		return "destination " + host + " is a " + c.String() + " name", true
	}
	return "", false
}

// errorBody is sluice's JSON refusal, as on the sandbox socket.
type errorBody struct {
	Error struct {
		Code      string `json:"code"`
		Message   string `json:"message"`
		RequestID string `json:"request_id"`
	} `json:"error"`
	Hold *holdBody `json:"hold,omitempty"`
}

type holdBody struct {
	ID     string `json:"id"`
	Status string `json:"status"`
}

// stripped are request headers the answer always removes: the proxy's
// credentials are for the proxy, and x-sluice-* are the gateway's to set.
var stripped = []string{"proxy-authorization", "proxy-authenticate"}

// Answer renders a verdict as Envoy's CheckResponse. r is the request it
// answers (its headers name the x-sluice-* fields to remove); it may be
// nil.
func Answer(v Verdict, r *Request) *authv3.CheckResponse {
	if v.Allow {
		ok := &authv3.OkHttpResponse{}
		var setBuf [4]string
		set := setBuf[:0] // the set names lowered once, for both uses
		for _, h := range v.Set {
			set = append(set, strings.ToLower(h.Name))
			ok.Headers = append(ok.Headers, overwrite(set[len(set)-1], h.Value))
		}
		for _, q := range v.SetQuery {
			ok.QueryParametersToSet = append(ok.QueryParametersToSet, &corev3.QueryParameter{Key: q.Name, Value: q.Value})
		}
		// One slice, sorted and without repeats (not a map and its
		// sorted keys: this is every allowed Check's).
		remove := make([]string, 0, len(stripped)+len(v.Remove)+2)
		remove = append(remove, stripped...)
		for _, h := range v.Remove {
			remove = append(remove, strings.ToLower(h))
		}
		if r != nil {
			for k := range r.Headers {
				if lk := strings.ToLower(k); strings.HasPrefix(lk, "x-sluice-") || strings.HasPrefix(lk, "sluice-") {
					remove = append(remove, lk)
				}
			}
		}
		remove = slices.DeleteFunc(remove, func(lk string) bool {
			return slices.Contains(set, lk) // set, not removed
		})
		if len(remove) > 0 {
			slices.Sort(remove)
			ok.HeadersToRemove = slices.Compact(remove)
		}
		return &authv3.CheckResponse{
			Status:       &rpcstatus.Status{Code: int32(code.Code_OK)},
			HttpResponse: &authv3.CheckResponse_OkResponse{OkResponse: ok},
		}
	}
	status := v.Status
	if status == 0 || (status >= 200 && status < 300 && v.HoldID == "") {
		// A refusal without a status, or a 2xx that is no hold, is a bug
		// in the caller; it still closes.
		status, v.Code, v.Message = http.StatusForbidden, CodeBug, "bug: refusal without a status"
	}
	var b errorBody
	b.Error.Code, b.Error.Message, b.Error.RequestID = v.Code, v.Message, v.RequestID
	if v.HoldID != "" {
		st := v.HoldState
		if st == "" {
			st = "pending"
		}
		b.Hold = &holdBody{ID: v.HoldID, Status: st}
		if b.Error.Code == "" {
			b.Error.Code = CodeApprovalPending
		}
	}
	body, _ := json.Marshal(b)
	hs := []*corev3.HeaderValueOption{overwrite("content-type", "application/json")}
	if v.RequestID != "" {
		hs = append(hs, overwrite("x-sluice-request-id", v.RequestID))
	}
	if v.HoldID != "" {
		hs = append(hs, overwrite("x-sluice-hold", v.HoldID))
	}
	if v.RetryAfter > 0 {
		secs := int64((v.RetryAfter + time.Second - 1) / time.Second)
		hs = append(hs, overwrite("retry-after", strconv.FormatInt(secs, 10)))
	}
	return &authv3.CheckResponse{
		Status: &rpcstatus.Status{Code: int32(code.Code_PERMISSION_DENIED), Message: v.Code},
		HttpResponse: &authv3.CheckResponse_DeniedResponse{DeniedResponse: &authv3.DeniedHttpResponse{
			Status:  &typev3.HttpStatus{Code: typev3.StatusCode(status)},
			Headers: hs,
			Body:    string(body) + "\n",
		}},
	}
}

// overwrite is a header mutation that replaces every value the request had
// (never appends: a client-sent Authorization must not travel beside the
// credential).
func overwrite(name, value string) *corev3.HeaderValueOption {
	return &corev3.HeaderValueOption{
		Header:       &corev3.HeaderValue{Key: strings.ToLower(name), Value: value},
		AppendAction: corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD,
	}
}

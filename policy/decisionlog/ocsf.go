package decisionlog

import (
	"encoding/json"
	"sort"
	"strings"
)

// OCSF API Activity (class 6003, category 6 Application Activity),
// schema 1.3.0, with the Security Control profile's disposition and
// policy: what a SIEM expects of an authorization decision.
const (
	ocsfVersion  = "1.3.0"
	ocsfClass    = 6003
	ocsfCategory = 6
)

// ocsf maps a masked event to an OCSF API Activity event. Fields the input
// does not carry are left out; the decision's own fields go to policy and
// unmapped.
func ocsf(ev Event) map[string]any {
	var in struct {
		Kind   string `json:"kind"`
		Tool   string `json:"tool"`
		Caller struct {
			Sandbox, Agent, Session, User string
		} `json:"caller"`
		Operation struct {
			Method string `json:"method"`
		} `json:"operation"`
		Request struct {
			Method string `json:"method"`
			Host   string `json:"host"`
			Port   int    `json:"port"`
		} `json:"request"`
	}
	_ = json.Unmarshal(ev.Input, &in) // a field that does not decode is left out
	var d struct {
		Action string `json:"action"`
		Reason string `json:"reason"`
		Rule   string `json:"rule"`
	}
	if b, err := json.Marshal(ev.Result); err == nil {
		_ = json.Unmarshal(b, &d)
	}
	method := in.Request.Method
	if method == "" {
		method = in.Operation.Method
	}
	activity, name := 99, "Other"
	switch strings.ToUpper(method) {
	case "POST":
		activity, name = 1, "Create"
	case "GET", "HEAD":
		activity, name = 2, "Read"
	case "PUT", "PATCH":
		activity, name = 3, "Update"
	case "DELETE":
		activity, name = 4, "Delete"
	}
	severity, status, disposition, dispName := 1, 1, 1, "Allowed" // informational, success
	switch d.Action {
	case "ask":
		severity, status, disposition, dispName = 2, 99, 17, "Approval Required"
	case "allow":
	default:
		severity, status, disposition, dispName = 3, 2, 2, "Blocked"
	}
	op := in.Tool
	if op == "" {
		op = in.Kind
	}
	out := map[string]any{
		"class_uid":      ocsfClass,
		"class_name":     "API Activity",
		"category_uid":   ocsfCategory,
		"category_name":  "Application Activity",
		"activity_id":    activity,
		"activity_name":  name,
		"type_uid":       ocsfClass*100 + activity,
		"time":           ev.Timestamp.UnixMilli(),
		"severity_id":    severity,
		"status_id":      status,
		"disposition_id": disposition,
		"disposition":    dispName,
		"message":        d.Reason,
		"metadata": map[string]any{
			"version": ocsfVersion,
			"uid":     ev.DecisionID,
			"product": map[string]any{"name": "sluice", "vendor_name": "sluice"},
			"labels":  labelList(ev.Labels),
		},
		"actor": map[string]any{
			"user":     map[string]any{"name": in.Caller.User},
			"app_name": in.Caller.Agent,
			"session":  map[string]any{"uid": in.Caller.Session},
		},
		"api": map[string]any{
			"operation": op,
			"request":   map[string]any{"uid": ev.RequestID},
		},
		"src_endpoint": map[string]any{"uid": in.Caller.Sandbox},
		"policy":       map[string]any{"name": d.Rule, "desc": d.Reason, "version": ev.Revision},
		"unmapped":     map[string]any{"decision": d.Action, "path": ev.Path, "erased": ev.Erased, "input": ev.Input},
	}
	if in.Request.Host != "" {
		dst := map[string]any{"hostname": in.Request.Host}
		if in.Request.Port != 0 {
			dst["port"] = in.Request.Port
		}
		out["dst_endpoint"] = dst
	}
	return out
}

func labelList(m map[string]string) []string {
	out := make([]string, 0, len(m))
	for k, v := range m {
		out = append(out, k+":"+v)
	}
	sort.Strings(out)
	return out
}

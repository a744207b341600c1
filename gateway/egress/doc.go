// Package egress is raw egress of a sandbox: absolute-form HTTP through the
// forward proxy, CONNECT (relayed socket to socket, or intercepted: HTTP/1.1,
// HTTP/2 and WebSocket, with host-bound placeholders), and the DNS answerer
// of POST /v1/dns (one question, or the stub's stream) with DoH refused.
// Every request is decided by policy (kinds http, connect and dns) after
// the sandbox's narrowing and the session check, dialled only through the
// guard with no allow_private, and audited like a tool call.
//
// Raw egress is never held and never touches the tool catalog, the store
// or the socket's package: the root gateway builds a Proxy with New from a
// Deps of hooks (the current policy, the one audit write, the credential
// source, the session check, the stop hooks, the shared instruments) and
// routes the sandbox socket's absolute-form and CONNECT requests to
// ServeProxy and POST /v1/dns to ServeDNS.
package egress

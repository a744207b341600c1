// Package fault is the durability half of the attack-and-fault suite
// (THREATS.md group G, and the upstream faults of F6): it runs the real
// `sluice serve` binary in a network namespace with a real upstream and
// breaks things under it — kill -9 with held calls, a full or unlinked
// audit file, a broken policy at reload and at cold start, a full store,
// an upstream that hangs, resets or answers garbage — and registers each
// designed outcome, with a control that succeeds, through casebook.
package fault

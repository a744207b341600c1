package egress

import (
	"sync"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// decisionOpts caches the sluice.decisions metric option of each
// (action, rule) pair, so counting a raw-egress decision (a proxied
// request, a tunnel, a DNS question) does not build an attribute set each
// time.
type decisionOpts struct {
	mu sync.RWMutex
	m  map[[2]string]metric.AddOption
}

func (a *decisionOpts) get(action, rule string) metric.AddOption {
	k := [2]string{action, rule}
	a.mu.RLock()
	o, ok := a.m[k]
	a.mu.RUnlock()
	if ok {
		return o
	}
	o = metric.WithAttributes(attribute.String("action", action), attribute.String("rule", rule))
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.m == nil || len(a.m) >= 1024 { // rules come from config and Rego: bounded, but never grow without limit
		a.m = make(map[[2]string]metric.AddOption)
	}
	a.m[k] = o
	return o
}

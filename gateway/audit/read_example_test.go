package audit_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/sluice-gw/sluice/gateway/audit"
)

// ExampleScan reads a log for people: every line in order, each saying
// whether the chain verifies through it, reduced to what a table shows.
func ExampleScan() {
	dir, _ := os.MkdirTemp("", "audit-example-")
	defer os.RemoveAll(dir)
	path := filepath.Join(dir, "audit.log")
	l, _ := audit.Open(path)
	for _, r := range []audit.Record{
		{Event: "decision", Fields: map[string]any{"tool": "billing.create_refund", "decision": "ask", "session": "s-1"}},
		{Event: "decision", Fields: map[string]any{"kind": "connect", "dest_host": "pypi.org", "port": 443, "decision": "allow", "session": "s-1"}},
	} {
		_, _ = l.Append(context.Background(), r)
	}
	_ = l.Close()
	ch, _ := audit.Scan(path, func(e audit.Entry) {
		b := audit.Briefly(e.Record)
		fmt.Printf("line %d verified=%v: %s %s %s\n", e.Line, e.Verified, b.Kind, b.What, b.Decision)
	})
	fmt.Println(ch.Verified, "records verify; broken:", ch.Break != nil)
	// Output:
	// line 1 verified=true: tool call billing.create_refund ask
	// line 2 verified=true: tunnel pypi.org:443 allow
	// 2 records verify; broken: false
}

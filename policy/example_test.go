package policy_test

import (
	"context"
	"fmt"

	"github.com/sluice-gw/sluice/policy"
)

func ExampleEngine_Decide() {
	e, err := policy.New(context.Background(), policy.Config{Rules: []policy.Rule{
		{Match: "billing-api.get_*", Action: "allow"},
		{Match: "billing-api.create_refund", Action: "ask", Approvers: []string{"group:finance"}},
		{Match: "*", Action: "block", Reason: "not on the list"},
	}})
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, tool := range []string{"billing-api.get_invoice", "billing-api.create_refund", "billing-api.delete_customer"} {
		d := e.Decide(context.Background(), &policy.Input{Version: policy.InputVersion, Kind: "tool_call", Tool: tool})
		fmt.Println(tool, d.Action, d.Rule, d.Approvers, d.Reason)
	}

	var notLoaded *policy.Engine
	fmt.Println(notLoaded.Decide(context.Background(), &policy.Input{Kind: "tool_call"}).Reason)
	// Output:
	// billing-api.get_invoice allow policies[0] [] matched billing-api.get_*
	// billing-api.create_refund ask policies[1] [group:finance] matched billing-api.create_refund
	// billing-api.delete_customer block policies[2] [] not on the list
	// policy not loaded
}

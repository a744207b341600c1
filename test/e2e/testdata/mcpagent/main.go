// Command mcpagent is MCP client code a test runs inside a sandbox: the
// official Go SDK's client connects to SLUICE_MCP_URL (sandboxd's relay),
// lists the tools and makes an allowed and a blocked call, printing one
// line per step for the test to read.
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"sort"
	"strings"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
)

func main() {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	url := os.Getenv("SLUICE_MCP_URL")
	fmt.Printf("url %s\n", url)
	c := sdk.NewClient(&sdk.Implementation{Name: "sandbox-go", Version: "1"}, nil)
	hc := &http.Client{Transport: &http.Transport{Proxy: nil}}
	cs, err := c.Connect(ctx, &sdk.StreamableClientTransport{Endpoint: url, HTTPClient: hc, MaxRetries: -1}, nil)
	if err != nil {
		fmt.Printf("connect error %v\n", err)
		os.Exit(1)
	}
	defer cs.Close()
	lt, err := cs.ListTools(ctx, nil)
	if err != nil {
		fmt.Printf("list error %v\n", err)
		os.Exit(1)
	}
	var names []string
	for _, t := range lt.Tools {
		names = append(names, t.Name)
	}
	sort.Strings(names)
	fmt.Printf("tools %s\n", strings.Join(names, ","))
	for _, step := range []struct {
		name, tool string
		args       map[string]any
	}{
		{"allowed", "tickets.list_tickets", map[string]any{"query": map[string]any{"limit": 3}}},
		{"blocked", "tickets.delete_ticket", map[string]any{"path": map[string]any{"id": "T-1"}}},
	} {
		r, err := cs.CallTool(ctx, &sdk.CallToolParams{Name: step.tool, Arguments: step.args})
		if err != nil {
			fmt.Printf("%s error %v\n", step.name, err)
			continue
		}
		var text string
		for _, ct := range r.Content {
			if tc, ok := ct.(*sdk.TextContent); ok {
				text += tc.Text
			}
		}
		sc, _ := json.Marshal(r.StructuredContent)
		fmt.Printf("%s %v %s %s\n", step.name, r.IsError, sc, strings.ReplaceAll(text, "\n", " "))
	}
}

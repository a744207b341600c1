package mcp

// metaTraceparent is the W3C traceparent an MCP client put in a request's
// _meta (the key the MCP tracing convention uses), or "" when there is
// none or it is not a string. It is handed to the pipeline like the HTTP
// door's traceparent header: the call's span takes it as a link, never as
// its parent (THREATS F13, F17).
func metaTraceparent(meta map[string]any) string {
	s, _ := meta["traceparent"].(string)
	return s
}

package gateway

import (
	"bufio"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"

	mdns "github.com/miekg/dns"

	"github.com/sluice-gw/sluice/gateway/egress/egresstest"
)

// sumSeries adds up the samples of every series of family whose labels
// contain each of labels (a family without the label filter when none).
func sumSeries(t *testing.T, m, family string, labels ...string) float64 {
	t.Helper()
	var sum float64
	for l := range strings.Lines(m) {
		l = strings.TrimSpace(l)
		if !strings.HasPrefix(l, family+"{") && !strings.HasPrefix(l, family+" ") {
			continue
		}
		series, value, ok := strings.Cut(l, " ")
		if !ok {
			continue
		}
		match := true
		for _, lb := range labels {
			match = match && strings.Contains(series, lb)
		}
		if !match {
			continue
		}
		v, err := strconv.ParseFloat(value, 64)
		if err != nil {
			t.Fatalf("/metrics: %q: %v", l, err)
		}
		sum += v
	}
	return sum
}

// TestEgressMetricsReachAdmin: raw egress's own instruments (package
// egress's meter, handed to it in egress.Deps) and the shared decisions
// counter it adds to are the ones the admin listener's /metrics serves:
// DNS questions and refused proxy requests made over the real sandbox
// socket move sluice_dns_answers_total by rcode and
// sluice_decisions_total (allow for the questions, block for the
// refusals) by exactly the calls made.
func TestEgressMetricsReachAdmin(t *testing.T) {
	up := egresstest.NewDNSUpstream(t, map[string]string{"a.allowed.test": "93.184.216.34"})
	g := startEgressGateway(t, up, nil)
	before := scrape(t, g)

	c := rawConn(t, g, agentA)
	defer c.Close()
	br := bufio.NewReader(c)
	ask := func(name string) int {
		t.Helper()
		m := new(mdns.Msg)
		m.SetQuestion(mdns.Fqdn(name), mdns.TypeA)
		q, _ := m.Pack()
		fmt.Fprintf(c, "POST /v1/dns HTTP/1.1\r\nHost: sluice\r\nContent-Type: application/dns-message\r\nContent-Length: %d\r\n\r\n%s", len(q), q)
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		a := new(mdns.Msg)
		if resp.StatusCode != 200 || a.Unpack(b) != nil {
			t.Fatalf("POST /v1/dns %s: %d %q", name, resp.StatusCode, b)
		}
		return a.Rcode
	}
	const answered, missing, refused = 3, 2, 2
	for range answered {
		if rc := ask("a.allowed.test"); rc != mdns.RcodeSuccess {
			t.Fatalf("a.allowed.test: %s, want NOERROR", mdns.RcodeToString[rc])
		}
	}
	for range missing {
		if rc := ask("nx.test"); rc != mdns.RcodeNameError {
			t.Fatalf("nx.test: %s, want NXDOMAIN", mdns.RcodeToString[rc])
		}
	}
	for range refused { // a refusal ends its connection: one each
		resp, body, conn, _ := exchange(t, g, "GET http://denied.test/x HTTP/1.1\r\nHost: denied.test\r\n\r\n")
		conn.Close()
		if resp.StatusCode != http.StatusForbidden || errCode(body) != "egress_denied" {
			t.Fatalf("GET http://denied.test/x: %d %s, want 403 egress_denied", resp.StatusCode, body)
		}
	}

	after := scrape(t, g)
	for _, tc := range []struct {
		family string
		labels []string
		want   float64
	}{
		{"sluice_dns_answers_total", []string{`rcode="NOERROR"`}, answered},
		{"sluice_dns_answers_total", []string{`rcode="NXDOMAIN"`}, missing},
		{"sluice_dns_answers_total", nil, answered + missing},
		{"sluice_decisions_total", []string{`action="allow"`, `rule="egress"`}, answered + missing}, // one decision per question, cached or not
		{"sluice_decisions_total", []string{`action="block"`}, refused},
	} {
		if d := sumSeries(t, after, tc.family, tc.labels...) - sumSeries(t, before, tc.family, tc.labels...); d != tc.want {
			t.Errorf("%s%v moved by %v, want %v:\n%s", tc.family, tc.labels, d, tc.want, metricLines(after, tc.family))
		}
	}
}

//go:build linux

package attack

import (
	"strings"
	"testing"

	"github.com/sluice-gw/sluice/test/internal/casebook"
	"github.com/sluice-gw/sluice/test/internal/gwenv"
)

// TestSecretWithCRLFRefused is THREATS D6 for stored values: `sluice
// secrets set` refuses a value with CR or LF inside (it would split the
// header it is attached to) and stores nothing; a clean value is stored.
func TestSecretWithCRLFRefused(t *testing.T) {
	e := gwenv.New(t, gatewayBin(t))
	d := e.BaseConfig("crlf")
	path := e.Write(d)
	list := func() string {
		out, err := e.CLI("", "secrets", "list", "--config", path)
		if err != nil {
			t.Fatalf("secrets list: %v\n%s", err, out)
		}
		return out
	}
	for _, tc := range []struct{ name, value string }{
		{"CR LF and a second header inside the value", "tok-0123456789\r\nX-Evil: 1"},
		{"a lone LF inside the value", "tok-0123\n456789"},
		{"a lone CR inside the value", "tok-0123\r456789"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := casebook.Expect(t, "D6", "sluice secrets set NAME with "+tc.name,
				"non-zero exit naming the forbidden byte, the value not echoed, nothing stored")
			out, err := e.CLI(tc.value+"\n", "secrets", "set", "smuggle", "--scope", "project", "--config", path)
			stored := strings.Contains(list(), "smuggle")
			c.Observef("exit error %v, names the byte %v, stored %v", err != nil, strings.Contains(out, "forbidden byte"), stored)
			if err == nil || !strings.Contains(out, "forbidden byte") {
				t.Errorf("secrets set: %v\n%s", err, out)
			}
			if strings.Contains(out, "tok-0123") {
				t.Error("the refusal echoed the value")
			}
			if stored {
				t.Error("the refused value was stored")
			}
		})
	}
	t.Run("control: a clean value is stored", func(t *testing.T) {
		c := casebook.Expect(t, "D6", "control: sluice secrets set NAME with a clean value", "stored, listed by name")
		e.SetSecret(path, "clean", "tok-0123456789")
		ok := strings.Contains(list(), "clean")
		c.Observef("listed %v", ok)
		if !ok {
			t.Error("the clean value is not listed")
		}
	})
}

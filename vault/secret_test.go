package vault

import (
	"bytes"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"testing"
)

const plain = "sk-live-SUPERSECRET-1234"

func TestSecretRedacts(t *testing.T) {
	s := NewSecret([]byte(plain))
	type holder struct {
		Token Secret
		Ptr   *Secret
	}
	h := holder{Token: s, Ptr: &s}

	outputs := map[string]string{}
	for _, verb := range []string{"%v", "%+v", "%#v", "%s", "%q", "%x", "%X", "%d", "%10.3s"} {
		outputs["fmt "+verb] = fmt.Sprintf(verb, s)
		outputs["fmt struct "+verb] = fmt.Sprintf(verb, h)
	}
	outputs["fmt Sprint"] = fmt.Sprint(s, h)
	outputs["fmt Sprintln"] = fmt.Sprintln(s)
	js, err := json.Marshal(h)
	if err != nil {
		t.Fatal(err)
	}
	outputs["json struct"] = string(js)
	var buf bytes.Buffer
	slog.New(slog.NewJSONHandler(&buf, nil)).Info("attach", "token", s, "holder", h, slog.Any("ptr", &s))
	outputs["slog JSON"] = buf.String()
	buf.Reset()
	slog.New(slog.NewTextHandler(&buf, nil)).Info("attach", "token", s)
	outputs["slog text"] = buf.String()

	for name, out := range outputs {
		t.Run(name, func(t *testing.T) {
			if strings.Contains(out, plain) || strings.Contains(out, fmt.Sprintf("%x", plain)) || strings.Contains(out, "115 107") {
				t.Fatalf("output leaks the secret: %s", out)
			}
			if !strings.Contains(out, "[redacted]") {
				t.Fatalf("output %q does not say [redacted]", out)
			}
		})
	}
}

func TestSecretCopies(t *testing.T) {
	b := []byte(plain)
	s := NewSecret(b)
	b[0] = 'X'
	if got := string(s.Reveal()); got != plain {
		t.Fatalf("Reveal = %q after caller modified its slice, want %q", got, plain)
	}
	if !(Secret{}).IsZero() || s.IsZero() || s.Len() != len(plain) {
		t.Fatalf("IsZero/Len wrong: zero=%v s.IsZero=%v s.Len=%d", (Secret{}).IsZero(), s.IsZero(), s.Len())
	}
}

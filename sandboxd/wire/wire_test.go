package wire

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"
)

func TestRoundTrip(t *testing.T) {
	ids := map[string]Identity{
		"all fields": {Sandbox: "sb-1", Agent: "billing-bot", Session: "s-42", User: "alice@example.com", Host: "runner-3"},
		"minimal":    {Sandbox: "sb", Agent: "a"},
		"unicode":    {Sandbox: "sb", Agent: "agënt", User: "José \"J\" <x>"},
		"max field":  {Sandbox: strings.Repeat("s", MaxField), Agent: strings.Repeat("é", MaxField/2)},
	}
	for name, id := range ids {
		t.Run(name, func(t *testing.T) {
			line, err := Encode(id)
			if err != nil {
				t.Fatalf("Encode: %v", err)
			}
			if !strings.HasPrefix(string(line), Prefix+"{") || !strings.HasSuffix(string(line), "}\n") {
				t.Fatalf("Encode = %q, want prefix and trailing newline", line)
			}
			got, err := Read(bufio.NewReader(strings.NewReader(string(line))))
			if err != nil {
				t.Fatalf("Read: %v", err)
			}
			if got != id {
				t.Fatalf("Read = %+v, want %+v", got, id)
			}
		})
	}
}

func TestEncodeRejects(t *testing.T) {
	cases := map[string]Identity{
		"missing agent":   {Sandbox: "sb"},
		"missing sandbox": {Agent: "a"},
		"newline in user": {Sandbox: "sb", Agent: "a", User: "x\nSLUICE-IDENTITY"},
		"NUL":             {Sandbox: "sb", Agent: "a\x00"},
		"too long":        {Sandbox: "sb", Agent: strings.Repeat("a", MaxField+1)},
		"bad UTF-8":       {Sandbox: "sb", Agent: "a\xff"},
		"line separator":  {Sandbox: "sb", Agent: "a\u2028b"},
		"C1 control":      {Sandbox: "sb", Agent: "a\u0085b"},
	}
	for name, id := range cases {
		t.Run(name, func(t *testing.T) {
			if line, err := Encode(id); err == nil {
				t.Fatalf("Encode(%+v) = %q, want error", id, line)
			}
		})
	}
}

func TestReadRejects(t *testing.T) {
	valid := `{"sandbox":"sb","agent":"a","session":"","user":"","host":""}`
	cases := []struct {
		name  string
		input string
		is    error // when set, errors.Is must hold
		want  string
	}{
		{"no prefix", valid + "\n", ErrMissingPrefix, "missing prefix"},
		{"HTTP request line instead", "GET http://example.com/ HTTP/1.1\r\nHost: example.com\r\n\r\n", ErrMissingPrefix, "missing prefix"},
		{"lowercase prefix", "sluice-identity " + valid + "\n", ErrMissingPrefix, "missing prefix"},
		{"too long", Prefix + `{"sandbox":"` + strings.Repeat("x", MaxLine) + "\"}\n", ErrTooLong, "too long"},
		{"too long without newline ever", Prefix + strings.Repeat("x", 10*MaxLine), ErrTooLong, "too long"},
		{"unknown field", Prefix + `{"sandbox":"sb","agent":"a","admin":"true"}` + "\n", nil, `unknown field "admin"`},
		{"case-folded key", Prefix + `{"sandbox":"sb","AGENT":"a"}` + "\n", nil, `unknown field "AGENT"`},
		{"duplicate key", Prefix + `{"sandbox":"sb","agent":"a","agent":"root"}` + "\n", nil, `duplicate field "agent"`},
		{"missing agent", Prefix + `{"sandbox":"sb"}` + "\n", nil, "agent is required"},
		{"null agent", Prefix + `{"sandbox":"sb","agent":null}` + "\n", nil, "not a string"},
		{"number field", Prefix + `{"sandbox":"sb","agent":1}` + "\n", nil, "not a string"},
		{"CR in field", Prefix + `{"sandbox":"sb","agent":"a\rb"}` + "\n", nil, "non-printable"},
		{"escaped newline in field", Prefix + `{"sandbox":"sb","agent":"a\nb"}` + "\n", nil, "non-printable"},
		{"trailing junk", Prefix + valid + "x\n", nil, "trailing data"},
		{"trailing CR", Prefix + valid + "\r\n", nil, "trailing data"},
		{"second object", Prefix + valid + valid + "\n", nil, "trailing data"},
		{"array", Prefix + `["sb","a"]` + "\n", nil, "not a JSON object"},
		{"truncated object", Prefix + `{"sandbox":"sb"` + "\n", nil, "decode preamble"},
		{"no newline before EOF", Prefix + valid, ErrNoNewline, "not terminated"},
		{"empty", "", io.ErrUnexpectedEOF, "unexpected EOF"},
		{"invalid UTF-8", Prefix + `{"sandbox":"sb","agent":"a` + "\xff" + `"}` + "\n", nil, "not valid UTF-8"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			id, err := Read(bufio.NewReader(strings.NewReader(tc.input)))
			if err == nil {
				t.Fatalf("Read = %+v, want error", id)
			}
			if tc.is != nil && !errors.Is(err, tc.is) {
				t.Errorf("Read error = %v, want errors.Is %v", err, tc.is)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Read error = %q, want it to contain %q", err, tc.want)
			}
			if !strings.HasPrefix(err.Error(), "wire: ") {
				t.Errorf("Read error = %q, want prefix %q", err, "wire: ")
			}
		})
	}
}

// TestReadBounded checks that a line without newline stops at MaxLine bytes
// and an HTTP request stops at its first mismatching byte.
func TestReadBounded(t *testing.T) {
	r := bufio.NewReaderSize(strings.NewReader(Prefix+strings.Repeat("x", 3*MaxLine)), 16)
	if _, err := Read(r); !errors.Is(err, ErrTooLong) {
		t.Fatalf("Read error = %v, want ErrTooLong", err)
	}
	rest, _ := io.ReadAll(r)
	if consumed := len(Prefix) + 3*MaxLine - len(rest); consumed != MaxLine {
		t.Errorf("consumed %d bytes, want exactly MaxLine=%d", consumed, MaxLine)
	}

	r = bufio.NewReader(strings.NewReader("GET / HTTP/1.1\r\n"))
	if _, err := Read(r); !errors.Is(err, ErrMissingPrefix) {
		t.Fatalf("Read error = %v, want ErrMissingPrefix", err)
	}
	if rest, _ := io.ReadAll(r); string(rest) != "ET / HTTP/1.1\r\n" {
		t.Errorf("after refusing, remaining = %q: Read consumed past the first bad byte", rest)
	}
}

func TestReadLeavesFollowingBytes(t *testing.T) {
	id := Identity{Sandbox: "sb", Agent: "a"}
	line, err := Encode(id)
	if err != nil {
		t.Fatal(err)
	}
	const follow = "GET http://api.example.com/ HTTP/1.1\r\nHost: api.example.com\r\n\r\n"
	// A small buffer makes the preamble span several fills.
	r := bufio.NewReaderSize(strings.NewReader(string(line)+follow), 16)
	got, err := Read(r)
	if err != nil {
		t.Fatalf("Read: %v", err)
	}
	if got != id {
		t.Fatalf("Read = %+v, want %+v", got, id)
	}
	rest, err := io.ReadAll(r)
	if err != nil {
		t.Fatal(err)
	}
	if string(rest) != follow {
		t.Fatalf("bytes after preamble = %q, want %q", rest, follow)
	}
}

func FuzzRead(f *testing.F) {
	// A valid preamble as sandboxd sends it.
	f.Add([]byte(Prefix + `{"sandbox":"sb-1","agent":"bot","session":"s","user":"u","host":"h"}` + "\n"))
	// Minimal valid preamble followed by the relayed HTTP stream.
	f.Add([]byte(Prefix + `{"sandbox":"sb","agent":"a"}` + "\nGET / HTTP/1.1\r\n\r\n"))
	// An HTTP request where a preamble should be.
	f.Add([]byte("CONNECT example.com:443 HTTP/1.1\r\n\r\n"))
	// Escapes, including an escaped control character and a surrogate pair.
	f.Add([]byte(Prefix + `{"sandbox":"\u0073b","agent":"\u0007","user":"\ud83d\ude00"}` + "\n"))
	// Duplicate and case-folded keys.
	f.Add([]byte(Prefix + `{"sandbox":"sb","Agent":"a","agent":"b"}` + "\n"))
	// Whitespace inside and after the object.
	f.Add([]byte(Prefix + ` { "sandbox" : "sb" , "agent" : "a" } ` + "\n"))
	// Unterminated string and no newline.
	f.Add([]byte(Prefix + `{"sandbox":"sb`))
	f.Fuzz(func(t *testing.T, data []byte) {
		id, err := Read(bufio.NewReader(strings.NewReader(string(data))))
		if err != nil {
			return
		}
		line, err := Encode(id)
		if err != nil {
			t.Fatalf("Read accepted %+v but Encode refuses it: %v", id, err)
		}
		again, err := Read(bufio.NewReader(strings.NewReader(string(line))))
		if err != nil {
			t.Fatalf("Read(Encode(%+v)): %v", id, err)
		}
		if again != id {
			t.Fatalf("round trip = %+v, want %+v", again, id)
		}
	})
}

func ExampleEncode() {
	line, err := Encode(Identity{Sandbox: "sb-1", Agent: "billing-bot", User: "alice"})
	if err != nil {
		panic(err)
	}
	fmt.Print(string(line))
	// Output: SLUICE-IDENTITY {"sandbox":"sb-1","agent":"billing-bot","session":"","user":"alice","host":""}
}

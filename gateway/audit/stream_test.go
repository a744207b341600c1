package audit

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
)

// TestStreamMatchesVerify: Stream breaks where the whole-file verifier
// does, with the same reason, on an intact log and on every kind of edit,
// and hands fn exactly the lines before the break (what Lines would).
func TestStreamMatchesVerify(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "audit.log")
	writeLog(t, path, 700, "decision") // three batches and part of a fourth
	data, err := os.ReadFile(path)
	must(t, err)
	lines := strings.SplitAfter(string(data), "\n")
	lines = lines[:len(lines)-1] // the empty string after the last newline
	edit := func(f func(ls []string) []string) string {
		return strings.Join(f(slices.Clone(lines)), "")
	}
	cases := map[string]string{
		"intact": string(data),
		"edited field": edit(func(ls []string) []string {
			ls[300] = strings.Replace(ls[300], `"event":"decision"`, `"event":"decisiox"`, 1)
			return ls
		}),
		"deleted record":  edit(func(ls []string) []string { return append(ls[:511], ls[512:]...) }),
		"swapped records": edit(func(ls []string) []string { ls[5], ls[6] = ls[6], ls[5]; return ls }),
		"garbage line":    edit(func(ls []string) []string { return slices.Insert(ls, 256, "not json at all\n") }),
		"unknown key": edit(func(ls []string) []string {
			ls[0] = strings.Replace(ls[0], `{"seq":1,`, `{"x":1,"seq":1,`, 1)
			return ls
		}),
		"fields not an object": edit(func(ls []string) []string {
			ls[699] = `{"seq":700,"fields":[1],"hash":"` + strings.Repeat("0", 64) + "\"}\n"
			return ls
		}),
		"last line cut":     string(data[:len(data)-40]),
		"last newline gone": string(data[:len(data)-1]),
		"partial not a record": edit(func(ls []string) []string {
			return append(ls, `{"seq":9,"time":"x`)
		}),
		"too long": edit(func(ls []string) []string {
			return append(ls, strings.Repeat("x", MaxRecord+10)+"\n")
		}),
		"empty": "",
	}
	for name, content := range cases {
		t.Run(name, func(t *testing.T) {
			p := filepath.Join(dir, strings.ReplaceAll(name, " ", "_"))
			must(t, os.WriteFile(p, []byte(content), 0o600))
			var mu sync.Mutex
			var got []int
			ch, err := Stream(context.Background(), p, 3, func(_, line int, rec *Line, raw []byte) {
				if rec.Seq == 0 || len(raw) == 0 {
					t.Errorf("line %d handed over without its record", line)
				}
				mu.Lock()
				got = append(got, line)
				mu.Unlock()
			})
			must(t, err)
			n, verr := Verify(strings.NewReader(content))
			if ch.Verified != n {
				t.Fatalf("Stream verified %d lines, Verify %d (%v)", ch.Verified, n, verr)
			}
			if (verr == nil) != (ch.Break == nil) {
				t.Fatalf("Stream break %+v, Verify %v", ch.Break, verr)
			}
			if verr != nil {
				ve := verr.(*VerifyError)
				if *ch.Break != *ve {
					t.Fatalf("Stream break %+v, Verify %+v", *ch.Break, *ve)
				}
			}
			// fn saw every verified line; past the break it may have seen
			// lines (the caller drops them), never the broken line itself.
			slices.Sort(got)
			for i := range n {
				if i >= len(got) || got[i] != i+1 {
					t.Fatalf("fn did not get every verified line: %d of %d", len(got), n)
				}
			}
			if ch.Break != nil && slices.Contains(got, ch.Break.Line) && name != "deleted record" && name != "swapped records" {
				t.Fatalf("fn got the line that does not verify by itself (%d)", ch.Break.Line)
			}
		})
	}
}

// TestStreamFromMarker: a file the log re-created after it was unlinked
// starts with the marker and continues the chain; Stream follows it as
// Lines does.
func TestStreamFromMarker(t *testing.T) {
	l, path := openTest(t)
	appendN(t, l, 2)
	must(t, os.Remove(path))
	_, _ = l.Append(context.Background(), rec(2)) // refused: ErrUnlinked
	_, err := l.Append(context.Background(), rec(3))
	must(t, err)
	ch, err := Stream(context.Background(), path, 2, func(int, int, *Line, []byte) {})
	must(t, err)
	want, err := Lines(path, func(int, []byte) error { return nil })
	must(t, err)
	if ch.Break != nil || !ch.FromMarker || !want.FromMarker || ch.Verified != 2 || want.Verified != 2 {
		t.Fatalf("Stream %+v, Lines %+v", ch, want)
	}
}

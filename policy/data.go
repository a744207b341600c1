package policy

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"

	"github.com/open-policy-agent/opa/v1/util"
)

// CodeDataError is the Problem code of a data document that does not load:
// bad JSON or YAML, a top level that is not an object, two documents that
// set the same value, or data under data.sluice (the library's).
const CodeDataError = "sluice_data_error"

// isDataFile reports whether name is a data document as OPA loads them
// beside Rego: data.json, data.yaml or data.yml.
func isDataFile(name string) bool {
	return name == "data.json" || name == "data.yaml" || name == "data.yml"
}

// dataDoc is one data document and where it goes under data.
type dataDoc struct {
	File string
	Path []string // data.<Path...>: the directories between the root path and the file
}

// dataFiles lists the data documents under paths, as OPA's loader places
// them: a data.json in dir/a/b of a listed directory dir is data.a.b; a
// data file listed by name is data itself. Dot directories are skipped as
// regoFiles skips them.
func dataFiles(paths []string) ([]dataDoc, error) {
	var out []dataDoc
	seen := map[string]bool{}
	for _, p := range paths {
		fi, err := os.Stat(p)
		if err != nil {
			return nil, fmt.Errorf("policy: load %s: %w", p, err)
		}
		if !fi.IsDir() {
			if c := filepath.Clean(p); isDataFile(filepath.Base(c)) && !seen[c] {
				seen[c] = true
				out = append(out, dataDoc{File: c})
			}
			continue
		}
		err = filepath.WalkDir(p, func(path string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if path != p && strings.HasPrefix(d.Name(), ".") {
				if d.IsDir() {
					return filepath.SkipDir
				}
				return nil
			}
			if d.IsDir() || !isDataFile(d.Name()) {
				return nil
			}
			c := filepath.Clean(path)
			if seen[c] {
				return nil
			}
			seen[c] = true
			rel, err := filepath.Rel(p, filepath.Dir(c))
			if err != nil {
				return err
			}
			var segs []string
			if rel != "." {
				segs = strings.Split(filepath.ToSlash(rel), "/")
			}
			out = append(out, dataDoc{File: c, Path: segs})
			return nil
		})
		if err != nil {
			return nil, fmt.Errorf("policy: load %s: %w", p, err)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].File < out[j].File })
	return out, nil
}

// loadData reads and merges the data documents under paths into one
// object for data. Every problem names its file and, for a syntax error,
// its line and column; a bad document fails the whole load, so that a
// reload keeps the previous policy rather than deciding on half the data.
func loadData(paths []string) (map[string]any, error) {
	docs, err := dataFiles(paths)
	if err != nil {
		return nil, err
	}
	root := map[string]any{}
	var problems []Problem
	owners := map[string]string{} // "a/b" → the file that set it, for conflicts
	for _, d := range docs {
		src, err := os.ReadFile(d.File)
		if err != nil {
			return nil, fmt.Errorf("policy: load %s: %w", d.File, err)
		}
		v, p := parseData(d.File, src)
		if p != nil {
			problems = append(problems, *p)
			continue
		}
		if err := mergeData(root, d.Path, v, d.File, owners); err != nil {
			problems = append(problems, Problem{File: d.File, Row: 1, Col: 1, Code: CodeDataError, Message: err.Error()})
		}
	}
	if len(problems) > 0 {
		return nil, &CompileError{Problems: problems}
	}
	return root, nil
}

// parseData decodes one data document; its top level must be an object.
func parseData(name string, src []byte) (map[string]any, *Problem) {
	var v any
	if strings.HasSuffix(name, ".json") {
		dec := json.NewDecoder(bytes.NewReader(src))
		dec.UseNumber()
		err := dec.Decode(&v)
		if err == nil {
			if _, terr := dec.Token(); terr != io.EOF {
				err = &json.SyntaxError{Offset: dec.InputOffset()}
				err = fmt.Errorf("invalid character after top-level value: %w", err)
			}
		}
		if err != nil {
			row, col := jsonPosition(src, err)
			return nil, &Problem{File: name, Row: row, Col: col, Code: CodeDataError, Message: "bad JSON: " + jsonMessage(err)}
		}
	} else if err := util.Unmarshal(src, &v); err != nil {
		row := yamlLine(err.Error())
		return nil, &Problem{File: name, Row: row, Col: 1, Code: CodeDataError, Message: "bad YAML: " + err.Error()}
	}
	obj, ok := v.(map[string]any)
	if !ok {
		return nil, &Problem{File: name, Row: 1, Col: 1, Code: CodeDataError,
			Message: fmt.Sprintf("top level is %s, want an object (a data document's keys become data.<path>.<key>)", jsonKind(v))}
	}
	return obj, nil
}

// jsonPosition turns the byte offset of a JSON error into line and column.
func jsonPosition(src []byte, err error) (row, col int) {
	var off int64 = -1
	var se *json.SyntaxError
	var te *json.UnmarshalTypeError
	switch {
	case errors.As(err, &se):
		off = se.Offset
	case errors.As(err, &te):
		off = te.Offset
	case errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, io.EOF):
		off = int64(len(src))
	}
	if off < 0 {
		return 1, 1
	}
	if off > int64(len(src)) {
		off = int64(len(src))
	}
	before := src[:off]
	row = bytes.Count(before, []byte("\n")) + 1
	col = int(off) - (bytes.LastIndexByte(before, '\n') + 1)
	if col < 1 {
		col = 1
	}
	return row, col
}

func jsonMessage(err error) string {
	if errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) {
		return "unexpected end of input"
	}
	return err.Error()
}

var yamlLineRE = regexp.MustCompile(`line (\d+)`)

func yamlLine(msg string) int {
	if m := yamlLineRE.FindStringSubmatch(msg); m != nil {
		if n, err := strconv.Atoi(m[1]); err == nil {
			return n
		}
	}
	return 1
}

func jsonKind(v any) string {
	switch v.(type) {
	case nil:
		return "null"
	case []any:
		return "an array"
	case string:
		return "a string"
	case bool:
		return "a boolean"
	case json.Number, float64:
		return "a number"
	}
	return fmt.Sprintf("%T", v)
}

// mergeData puts v at path under root, merging objects as OPA's loader
// does. Setting a value another document already set, or data under
// data.sluice (the library's and the configuration's), is an error naming
// the other file.
func mergeData(root map[string]any, path []string, v map[string]any, file string, owners map[string]string) error {
	if len(path) > 0 && path[0] == "sluice" {
		return errors.New("data.sluice is reserved for sluice's library and configuration: put data documents outside a sluice directory")
	}
	if _, ok := v["sluice"]; ok && len(path) == 0 {
		return errors.New("data.sluice is reserved for sluice's library and configuration: use another top-level key")
	}
	cur := root
	for i, seg := range path {
		key := strings.Join(path[:i+1], "/")
		next, ok := cur[seg]
		if !ok {
			m := map[string]any{}
			cur[seg] = m
			cur = m
			continue
		}
		m, ok := next.(map[string]any)
		if !ok {
			return fmt.Errorf("data.%s is already set by %s", strings.ReplaceAll(key, "/", "."), owners[key])
		}
		cur = m
	}
	return mergeInto(cur, v, strings.Join(path, "/"), file, owners)
}

func mergeInto(dst, src map[string]any, prefix, file string, owners map[string]string) error {
	keys := make([]string, 0, len(src))
	for k := range src {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		key := k
		if prefix != "" {
			key = prefix + "/" + k
		}
		sv := src[k]
		dv, exists := dst[k]
		if !exists {
			dst[k] = sv
			owners[key] = file
			continue
		}
		dm, dok := dv.(map[string]any)
		sm, sok := sv.(map[string]any)
		if !dok || !sok {
			return fmt.Errorf("data.%s is already set by %s", strings.ReplaceAll(key, "/", "."), owners[key])
		}
		if err := mergeInto(dm, sm, key, file, owners); err != nil {
			return err
		}
	}
	return nil
}

// sourceRevision is the revision of a policy loaded from files: a digest
// of every user .rego and data document (names and contents), so that a
// decision record says which policy decided it even without a bundle.
func sourceRevision(paths []string) (string, error) {
	files, err := regoFiles(paths)
	if err != nil {
		return "", err
	}
	docs, err := dataFiles(paths)
	if err != nil {
		return "", err
	}
	for _, d := range docs {
		files = append(files, d.File)
	}
	sort.Strings(files)
	h := sha256.New()
	for _, f := range files {
		if strings.HasSuffix(f, "_test.rego") {
			continue
		}
		src, err := os.ReadFile(f)
		if err != nil {
			return "", fmt.Errorf("policy: load %s: %w", f, err)
		}
		fmt.Fprintf(h, "%s\x00%d\x00", f, len(src))
		h.Write(src)
	}
	return "sha256:" + hex.EncodeToString(h.Sum(nil))[:16], nil
}

//go:build linux

package bench

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/getkin/kin-openapi/openapi3"

	"github.com/sluice-gw/sluice/connectors"
)

// largestSpec is the largest real vendor spec in the project's testdata:
// OpenAI's 3.1 document, 3.0 MB of YAML.
const largestSpec = "connectors/testdata/openai-3.1.yaml"

// responseArgs is a call of OpenAI's create_response, the operation with
// the largest argument schema in that spec, written as an agent sends it.
const responseArgs = `{"body":{"model":"gpt-4.1","input":[{"role":"user","content":[{"type":"input_text","text":"Summarise the ticket."}]}],"instructions":"Be brief.","temperature":0.2,"max_output_tokens":400,"metadata":{"ticket":"T-1"},"tools":[{"type":"function","name":"lookup","parameters":{"type":"object"},"strict":false}],"text":{"format":{"type":"text"}}}}`

// benchConnectors measures what issue 15 sets goals for: loading the
// largest spec (time, and the RSS of the real binary that loaded it) and
// validating a call's arguments for its largest operation.
func benchConnectors(t *testing.T, w *world) []*section {
	spec := filepath.Join(moduleRoot, largestSpec)
	load := &section{
		Title:    "Connectors: loading the largest vendor spec",
		Intro:    "Load time of OpenAI's 3.0 MB 3.1 spec (288 operations) into tools: parse, resolve, render and compile every tool's argument schema. Baseline: kin-openapi's parse and $ref resolution of the same file alone, the floor any loader pays.",
		Baseline: "parse only (kin-openapi)",
	}
	n := 10 // each load is about a second; a smoke run takes two
	if smoke() {
		n = 2
	}
	parse, perr := sample(n, 1, func() error {
		l := openapi3.NewLoader()
		l.IsExternalRefsAllowed = true
		_, err := l.LoadFromFile(spec)
		return err
	})
	load.lat("parse only (kin-openapi)", parse, perr, "")
	full, ferr := sample(n, 1, func() error {
		_, err := connectors.Load(context.Background(), connectors.Options{Slug: "openai", Spec: spec, BaseURL: "https://api.example"})
		return err
	})
	r := load.lat("connectors.Load (as serve loads)", full, ferr, "every tool's schema rendered and compiled, on every core")
	withDefects, derr := sample(n, 1, func() error {
		_, err := connectors.Load(context.Background(), connectors.Options{Slug: "openai", Spec: spec, BaseURL: "https://api.example", Defects: true})
		return err
	})
	dr := load.lat("connectors.Load with the defect pass (as validate loads)", withDefects, derr, "also compiles every named schema no tool uses")
	// The real binary: `sluice validate` must load the spec once (issue 17:
	// it used to load it twice, once to check and once to count).
	vcfg := filepath.Join(t.TempDir(), "validate.yaml")
	verr := os.WriteFile(vcfg, []byte(fmt.Sprintf("connectors:\n  - slug: openai\n    spec: %s\n    base_url: https://api.example\n", spec)), 0o644)
	var vrun []time.Duration
	if verr == nil {
		vrun, verr = sample(n, 1, func() error {
			out, err := exec.Command(sluiceBin, "validate", "--config", vcfg).CombinedOutput()
			if err != nil || !bytes.Contains(out, []byte("ok: 1 connectors, 288 tools")) {
				return fmt.Errorf("sluice validate: %v: %s", err, oneLine(string(out)))
			}
			return nil
		})
	}
	vr := load.lat("sluice validate (the real binary, this spec as its one connector)", vrun, verr, "process start, config, the spec loaded once with the defect pass, Rego compiled")
	if vr.measured() && dr.measured() {
		ratio := float64(pct(vr.Lat, 50)) / float64(pct(dr.Lat, 50))
		v := "met"
		if ratio > 1.5 {
			v = "not met"
		}
		load.Verdicts = append(load.Verdicts, fmt.Sprintf("issue 17: sluice validate loads each spec once, ≤ 1.5× one load with the defect pass: %s (%.2f×)", v, ratio))
	}
	if r.measured() {
		m := pct(r.Lat, 50)
		v := "met"
		if m > time.Second {
			v = "not met"
		}
		load.Verdicts = append(load.Verdicts, fmt.Sprintf("issue 15: load the largest (3 MB) spec in ≤ 1 s on these cores: %s (median %s)", v, fmtDur(m)))
	}

	mem := &section{
		Title:    "Connectors: memory of the real binary after loading the largest spec",
		Intro:    "Peak RSS (VmHWM of the process, read every 2 ms until it exits) of `sluice tools` listing the tools of a config with one connector on that spec. Baseline: the same command on a config with no connectors.",
		Baseline: "sluice tools, no connectors",
	}
	dir := t.TempDir()
	empty := filepath.Join(dir, "empty.yaml")
	one := filepath.Join(dir, "openai.yaml")
	werr := os.WriteFile(empty, []byte("connectors: []\n"), 0o644)
	if werr == nil {
		werr = os.WriteFile(one, []byte(fmt.Sprintf("connectors:\n  - slug: openai\n    spec: %s\n    base_url: https://api.example\n", spec)), 0o644)
	}
	for _, c := range []struct{ name, cfg string }{{"sluice tools, no connectors", empty}, {"sluice tools, OpenAI spec", one}} {
		if werr != nil {
			mem.skip(c.name, werr.Error())
			continue
		}
		rss, err := peakRSS(sluiceBin, "tools", "--config", c.cfg)
		if err != nil {
			mem.skip(c.name, err.Error())
			continue
		}
		mem.add(&row{Name: c.name, Bytes: rss})
	}
	if r := mem.find("sluice tools, OpenAI spec"); r != nil && r.measured() {
		v := "met"
		if r.Bytes > 150<<20 {
			v = "not met"
		}
		mem.Verdicts = append(mem.Verdicts, fmt.Sprintf("issue 15: RSS after loading a 3 MB spec ≤ 150 MB: %s (%.1f MiB)", v, float64(r.Bytes)/(1<<20)))
	}

	val := &section{
		Title:    "Connectors: validating a call's arguments (largest operation)",
		Intro:    "One openai.create_response call's arguments (a typical request: model, input messages, a function tool, text format) validated against its compiled schema, the largest of the spec. Baseline: decoding the same arguments document (strict JSON, duplicate keys refused), which every call pays first.",
		Baseline: "decode arguments",
	}
	c, err := connectors.Load(context.Background(), connectors.Options{Slug: "openai", Spec: spec, BaseURL: "https://api.example"})
	var tool *connectors.Tool
	if err == nil {
		for _, tl := range c.Tools {
			if tl.Name == "openai.create_response" {
				tool = tl
			}
		}
		if tool == nil {
			err = fmt.Errorf("no tool openai.create_response")
		}
	}
	if err != nil {
		val.skip("decode arguments", err.Error())
		val.skip("validate arguments", err.Error())
		return []*section{load, mem, val}
	}
	vn := iterations(20000)
	dec, derr := sample(vn, 100, func() error { _, err := connectors.DecodeArgs([]byte(responseArgs)); return err })
	val.lat("decode arguments", dec, derr, "")
	args, err := connectors.DecodeArgs([]byte(responseArgs))
	if err == nil {
		err = tool.Validate(args)
	}
	if err != nil {
		val.skip("validate arguments", err.Error())
		return []*section{load, mem, val}
	}
	vl, verr := sample(vn, 100, func() error { return tool.Validate(args) })
	val.lat("validate arguments", vl, verr, fmt.Sprintf("schema of %d KB with its $defs", len(tool.Schema)/1024))
	return []*section{load, mem, val}
}

// peakRSS runs argv and returns its peak resident set size in bytes: the
// VmHWM its /proc status shows last before it exits. (getrusage's maxrss
// is no use here: a child started by vfork inherits its parent's peak.)
func peakRSS(argv ...string) (int64, error) {
	cmd := exec.Command(argv[0], argv[1:]...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		return 0, err
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	status := fmt.Sprintf("/proc/%d/status", cmd.Process.Pid)
	var peak int64
	tick := time.NewTicker(2 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case err := <-done:
			if err != nil {
				return 0, fmt.Errorf("%v: %s", err, oneLine(out.String()))
			}
			if peak == 0 {
				return 0, fmt.Errorf("exited before its status could be read")
			}
			return peak, nil
		case <-tick.C:
			if kb := vmHWM(status); kb > peak {
				peak = kb
			}
		}
	}
}

// vmHWM reads the VmHWM line (KiB) of a /proc status file, in bytes.
func vmHWM(path string) int64 {
	data, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	for l := range strings.Lines(string(data)) {
		if rest, ok := strings.CutPrefix(l, "VmHWM:"); ok {
			f := strings.Fields(rest)
			if len(f) > 0 {
				kb, _ := strconv.ParseInt(f[0], 10, 64)
				return kb << 10
			}
		}
	}
	return 0
}

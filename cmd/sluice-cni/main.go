// Command sluice-cni is a chained CNI plugin that pins a Kubernetes pod's
// network namespace with the host's sandboxd before the pod's containers
// start: on ADD, for a pod its selection rule picks, it asks sandboxd
// (POST /v1/pods on its Unix socket) to remove every interface but lo and
// every route off lo, load the nftables backstop and open the host-side
// listeners (the proxy on 127.0.0.1:3128, the DNS stub) whose identity
// sandboxd.yaml's pods rules map from the pod's namespace. It then returns
// the previous plugin's result with its routes cleared. If sandboxd cannot
// be reached or refuses, ADD fails, so the pod never runs unpinned.
//
// DEL is idempotent (the pin's listeners closed and its session ended;
// a container with no pin is fine), CHECK asks sandboxd to verify the
// namespace is still closed, GC unpins every pod the runtime no longer
// has, and STATUS reports whether sandboxd answers.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/cni/pkg/version"
	"github.com/containernetworking/plugins/pkg/ns"
)

// DefaultSandboxd is sandboxd's API socket as deploy/sandboxd.yaml sets it.
const DefaultSandboxd = "/run/sluice-sandboxd/sandboxd.sock"

// AnnotationsCap is the capability containerd and CRI-O fill with the
// pod's annotations (runtimeConfig).
const AnnotationsCap = "io.kubernetes.cri.pod-annotations"

// Conf is the plugin's entry in the node's conflist.
type Conf struct {
	types.PluginConf
	// Sandboxd is sandboxd's API socket (default DefaultSandboxd).
	Sandboxd string `json:"sandboxd,omitempty"`
	// Select says which pods are pinned; others pass through unchanged.
	Select Select `json:"select"`
	// Timeout bounds each call to sandboxd (a Go duration; default 30s).
	Timeout string `json:"timeout,omitempty"`
	// Delegate is the interface plugin's configuration (e.g. bridge with
	// its ipam) when sluice-cni runs it itself instead of being chained
	// after it, so that the list's CHECK passes (delegate.go).
	Delegate json.RawMessage `json:"delegate,omitempty"`

	RuntimeConfig struct {
		Annotations map[string]string `json:"io.kubernetes.cri.pod-annotations,omitempty"`
	} `json:"runtimeConfig"`
	timeout time.Duration
}

// Select is the selection rule: a pod is pinned when its namespace is in
// Namespaces, or its annotation Annotation is "true", or All is set.
type Select struct {
	All        bool     `json:"all,omitempty"`
	Namespaces []string `json:"namespaces,omitempty"`
	Annotation string   `json:"annotation,omitempty"`
}

// K8sArgs are the CNI_ARGS the kubelet passes.
type K8sArgs struct {
	types.CommonArgs
	K8S_POD_NAMESPACE          types.UnmarshallableString //nolint:revive // CNI_ARGS key
	K8S_POD_NAME               types.UnmarshallableString //nolint:revive
	K8S_POD_UID                types.UnmarshallableString //nolint:revive
	K8S_POD_INFRA_CONTAINER_ID types.UnmarshallableString //nolint:revive
}

func parseConf(b []byte) (*Conf, error) {
	c := &Conf{}
	if err := json.Unmarshal(b, c); err != nil {
		return nil, fmt.Errorf("sluice-cni: config: %w", err)
	}
	if c.Sandboxd == "" {
		c.Sandboxd = DefaultSandboxd
	}
	var errs []error
	if !filepath.IsAbs(c.Sandboxd) {
		errs = append(errs, fmt.Errorf("sluice-cni: config: sandboxd: must be an absolute path, got %q", c.Sandboxd))
	}
	if !c.Select.All && len(c.Select.Namespaces) == 0 && c.Select.Annotation == "" {
		errs = append(errs, errors.New("sluice-cni: config: select: set all, namespaces or annotation (an empty rule would pin no pod)"))
	}
	c.timeout = 30 * time.Second
	if c.Timeout != "" {
		d, err := time.ParseDuration(c.Timeout)
		if err != nil || d <= 0 {
			errs = append(errs, fmt.Errorf("sluice-cni: config: timeout: must be a positive duration, got %q", c.Timeout))
		}
		c.timeout = d
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	if c.RawPrevResult != nil {
		if err := version.ParsePrevResult(&c.PluginConf); err != nil {
			return nil, fmt.Errorf("sluice-cni: config: prevResult: %w", err)
		}
	}
	return c, nil
}

// pod is the pod the runtime called about, and whether the rule picks it.
type pod struct {
	namespace, name, uid string
}

func podOf(c *Conf, args string) (pod, bool, error) {
	var k K8sArgs
	if err := types.LoadArgs(args, &k); err != nil {
		return pod{}, false, fmt.Errorf("sluice-cni: CNI_ARGS: %w", err)
	}
	p := pod{namespace: string(k.K8S_POD_NAMESPACE), name: string(k.K8S_POD_NAME), uid: string(k.K8S_POD_UID)}
	if p.namespace == "" || p.name == "" {
		// Not a Kubernetes pod: only "all" picks it, and then sandboxd
		// needs the names it maps identity from.
		if c.Select.All {
			return p, true, errors.New("sluice-cni: select.all: CNI_ARGS lacks K8S_POD_NAMESPACE and K8S_POD_NAME, which sandboxd maps the identity from")
		}
		return p, false, nil
	}
	sel := c.Select.All || slices.Contains(c.Select.Namespaces, p.namespace) ||
		(c.Select.Annotation != "" && c.RuntimeConfig.Annotations[c.Select.Annotation] == "true")
	return p, sel, nil
}

// client talks to sandboxd's API socket.
type client struct {
	sock string
	hc   *http.Client
}

func newClient(c *Conf) *client {
	return &client{sock: c.Sandboxd, hc: &http.Client{
		Timeout: c.timeout,
		Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", c.Sandboxd)
		}},
	}}
}

// unreachable is an error reaching sandboxd at all (as opposed to its answer).
type unreachable struct{ err error }

func (u unreachable) Error() string { return u.err.Error() }

// do sends a request and decodes a 2xx answer into out; any other status
// is an error carrying sandboxd's code and message.
func (cl *client) do(method, path string, body, out any) (int, error) {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return 0, err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, "http://sandboxd"+path, rd)
	if err != nil {
		return 0, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := cl.hc.Do(req)
	if err != nil {
		return 0, unreachable{fmt.Errorf("sandboxd at %s: %w", cl.sock, err)}
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if resp.StatusCode/100 != 2 {
		var e struct {
			Error struct{ Code, Message string } `json:"error"`
		}
		if json.Unmarshal(b, &e) == nil && e.Error.Code != "" {
			return resp.StatusCode, fmt.Errorf("sandboxd: %s %s: %d %s: %s", method, path, resp.StatusCode, e.Error.Code, e.Error.Message)
		}
		return resp.StatusCode, fmt.Errorf("sandboxd: %s %s: status %d", method, path, resp.StatusCode)
	}
	if out != nil && len(b) > 0 {
		if err := json.Unmarshal(b, out); err != nil {
			return resp.StatusCode, fmt.Errorf("sandboxd: %s %s: %w", method, path, err)
		}
	}
	return resp.StatusCode, nil
}

// cniError gives an error its CNI code: 11 (try again later) when sandboxd
// could not be reached, 100 (this plugin's) for everything it refused.
func cniError(step string, err error) error {
	var u unreachable
	if errors.As(err, &u) {
		return types.NewError(types.ErrTryAgainLater, "sluice-cni: "+step+": sandboxd unreachable; the pod must not start unpinned", err.Error())
	}
	var te *types.Error
	if errors.As(err, &te) {
		return te
	}
	return types.NewError(100, "sluice-cni: "+step+" refused", err.Error())
}

// pinned is what sandboxd answers for a pod's pin.
type pinned struct {
	ID      string `json:"id"`
	Agent   string `json:"agent"`
	Session string `json:"session"`
}

func cmdAdd(args *skel.CmdArgs) error {
	c, err := parseConf(args.StdinData)
	if err != nil {
		return types.NewError(types.ErrInvalidNetworkConfig, "sluice-cni: bad config", err.Error())
	}
	var res *current.Result
	switch {
	case c.Delegate != nil:
		if res, err = delegateAdd(c); err != nil {
			return err
		}
	case c.PrevResult == nil:
		return types.NewError(types.ErrInvalidNetworkConfig, "sluice-cni: bad config",
			"sluice-cni is a chained plugin: it needs the interface plugin's prevResult (or a delegate to run)")
	default:
		if res, err = current.NewResultFromResult(c.PrevResult); err != nil {
			return types.NewError(types.ErrDecodingFailure, "sluice-cni: prevResult", err.Error())
		}
	}
	p, sel, err := podOf(c, args.Args)
	if err != nil {
		return types.NewError(types.ErrInvalidEnvironmentVariables, "sluice-cni: CNI_ARGS", err.Error())
	}
	if !sel {
		return types.PrintResult(res, c.CNIVersion)
	}
	// The path must name a network namespace: checked here so a runtime
	// bug gets a clear error, and again by sandboxd, which holds it open.
	netns, err := ns.GetNS(args.Netns)
	if err != nil {
		return types.NewError(types.ErrInvalidEnvironmentVariables, "sluice-cni: CNI_NETNS", err.Error())
	}
	_ = netns.Close()
	var pin pinned
	if _, err := newClient(c).do(http.MethodPost, "/v1/pods", map[string]string{
		"container_id": args.ContainerID, "netns": args.Netns,
		"namespace": p.namespace, "name": p.name, "uid": p.uid,
	}, &pin); err != nil {
		return cniError("pin", err)
	}
	// The namespace has no route but lo's now; the result says so. The
	// addresses stay: they are the IPAM's bookkeeping (and what the
	// runtime reports), reachable from nowhere.
	res.Routes = nil
	for _, ip := range res.IPs {
		ip.Gateway = nil
	}
	return types.PrintResult(res, c.CNIVersion)
}

func cmdDel(args *skel.CmdArgs) error {
	c, err := parseConf(args.StdinData)
	if err != nil {
		return types.NewError(types.ErrInvalidNetworkConfig, "sluice-cni: bad config", err.Error())
	}
	// Every container is asked about, selected or not: the annotations
	// may have changed since ADD, and sandboxd answers 204 for a container
	// it never pinned.
	if _, err := newClient(c).do(http.MethodDelete, "/v1/pods/"+url.PathEscape(args.ContainerID), nil, nil); err != nil {
		return cniError("unpin", err)
	}
	if c.Delegate != nil {
		return delegateDel(c)
	}
	return nil
}

func cmdCheck(args *skel.CmdArgs) error {
	c, err := parseConf(args.StdinData)
	if err != nil {
		return types.NewError(types.ErrInvalidNetworkConfig, "sluice-cni: bad config", err.Error())
	}
	_, sel, err := podOf(c, args.Args)
	if err != nil {
		return types.NewError(types.ErrInvalidEnvironmentVariables, "sluice-cni: CNI_ARGS", err.Error())
	}
	if c.Delegate != nil {
		if err := delegateCheck(c); err != nil {
			return err
		}
	}
	if !sel {
		return nil
	}
	if c.PrevResult != nil {
		res, err := current.NewResultFromResult(c.PrevResult)
		if err != nil {
			return types.NewError(types.ErrDecodingFailure, "sluice-cni: prevResult", err.Error())
		}
		if len(res.Routes) > 0 {
			return types.NewError(100, "sluice-cni: check", "prevResult carries routes; sluice-cni must be the last plugin of the chain")
		}
	}
	var pin pinned
	if _, err := newClient(c).do(http.MethodGet, "/v1/pods/"+url.PathEscape(args.ContainerID), nil, &pin); err != nil {
		return cniError("check", err)
	}
	return nil
}

func cmdGC(args *skel.CmdArgs) error {
	c, err := parseConf(args.StdinData)
	if err != nil {
		return types.NewError(types.ErrInvalidNetworkConfig, "sluice-cni: bad config", err.Error())
	}
	keep := []string{}
	for _, a := range c.ValidAttachments {
		keep = append(keep, a.ContainerID)
	}
	if _, err := newClient(c).do(http.MethodPost, "/v1/pods/gc", map[string][]string{"keep": keep}, nil); err != nil {
		return cniError("gc", err)
	}
	return nil
}

func cmdStatus(args *skel.CmdArgs) error {
	c, err := parseConf(args.StdinData)
	if err != nil {
		return types.NewError(types.ErrInvalidNetworkConfig, "sluice-cni: bad config", err.Error())
	}
	if _, err := newClient(c).do(http.MethodGet, "/v1/pins", nil, nil); err != nil {
		return types.NewError(types.ErrPluginNotAvailable, "sluice-cni: sandboxd is not answering", err.Error())
	}
	return nil
}

func main() {
	if isInstall(os.Args) {
		if err := install(os.Args[2:], os.Stdout); err != nil {
			fmt.Fprintln(os.Stderr, "sluice-cni:", err)
			os.Exit(1)
		}
		return
	}
	skel.PluginMainFuncs(skel.CNIFuncs{Add: cmdAdd, Del: cmdDel, Check: cmdCheck, GC: cmdGC, Status: cmdStatus},
		version.PluginSupports("1.0.0", "1.1.0"), "sluice-cni: pins pods' network namespaces with sandboxd")
}

package sandboxd

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"path/filepath"
	"regexp"
	"sort"
)

// PodRef names the Kubernetes pod a pin belongs to, as the container
// runtime gave it to sluice-cni (CNI_CONTAINERID, K8S_POD_*).
type PodRef struct {
	ContainerID string `json:"container_id"`
	Namespace   string `json:"namespace"`
	Name        string `json:"name"`
	UID         string `json:"uid,omitempty"`
}

// PodPinRequest is POST /v1/pods: sluice-cni's ADD.
type PodPinRequest struct {
	ContainerID string `json:"container_id"`
	NetNS       string `json:"netns"`
	Namespace   string `json:"namespace"`
	Name        string `json:"name"`
	UID         string `json:"uid,omitempty"`
}

// PodGCRequest is POST /v1/pods/gc: sluice-cni's GC, with the attachments
// the runtime still has.
type PodGCRequest struct {
	Keep []string `json:"keep"` // container ids
}

// podIDs are what CNI and Kubernetes allow in a container id, a namespace,
// a pod name and a uid (no path separators, no spaces, bounded).
var podIDs = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,252}$`)

func (r PodPinRequest) validate() error {
	var errs []error
	for _, f := range []struct{ key, v string }{
		{"container_id", r.ContainerID}, {"namespace", r.Namespace}, {"name", r.Name},
	} {
		if !podIDs.MatchString(f.v) {
			errs = append(errs, fmt.Errorf("%w: %s: must match %s, got %q", ErrInvalid, f.key, podIDs, f.v))
		}
	}
	if r.UID != "" && !podIDs.MatchString(r.UID) {
		errs = append(errs, fmt.Errorf("%w: uid: must match %s, got %q", ErrInvalid, podIDs, r.UID))
	}
	if !filepath.IsAbs(r.NetNS) {
		errs = append(errs, fmt.Errorf("%w: netns: must be an absolute path, got %q", ErrInvalid, r.NetNS))
	}
	return errors.Join(errs...)
}

// podRule is the pods rule for namespace ns, or nil.
func (c Config) podRule(ns string) *PodRule {
	for i := range c.Pods {
		if c.Pods[i].Namespace == ns {
			return &c.Pods[i]
		}
	}
	return nil
}

// podSession is the session a pod's connections carry: the pod itself,
// so that ending it (DEL) ends that pod's holds and leases only.
func podSession(r PodPinRequest) string {
	s := r.Namespace + "/" + r.Name
	if r.UID != "" {
		s += "/" + r.UID
	}
	return s
}

// PinPod pins a pod's network namespace for sluice-cni's ADD, with the
// identity sandboxd.yaml's pods rule for its namespace gives. A pod no
// rule maps is ErrDenied: the ADD fails and the pod does not start. A
// second ADD for the same container and namespace returns the pin made by
// the first (runtimes retry); for another namespace it is ErrConflict.
func (m *Manager) PinPod(ctx context.Context, r PodPinRequest) (PinInfo, bool, error) {
	if err := r.validate(); err != nil {
		return PinInfo{}, false, err
	}
	rule := m.cfg.podRule(r.Namespace)
	if rule == nil {
		m.events.write(event{Event: "pod_refused", Sandbox: r.ContainerID, NetNS: r.NetNS, Error: "no pods rule maps namespace " + r.Namespace})
		return PinInfo{}, false, podRefusedf("pods: no rule in sandboxd.yaml maps namespace %q", r.Namespace)
	}
	if e := m.podPin(r.ContainerID); e != nil {
		if e.info.NetNS != r.NetNS {
			return PinInfo{}, false, fmt.Errorf("%w: container %s is pinned on %s", ErrConflict, r.ContainerID, e.info.NetNS)
		}
		// A runtime repeating the chain has run the interface plugin
		// again: close what it reopened before answering.
		if err := e.p.Reseal(ctx, m.log); err != nil {
			return PinInfo{}, false, fmt.Errorf("sandboxd: pin %s again: %w", r.NetNS, err)
		}
		m.events.write(event{Event: "pod_resealed", Sandbox: e.info.ID, Agent: e.info.Agent, Session: e.info.Session, NetNS: e.info.NetNS})
		return e.info, false, nil
	}
	var meta *podMeta
	if rule.needsPod() {
		var err error
		if meta, err = kubePod(ctx, m.cfg.KubeAPI, r.Namespace, r.Name, r.UID); err != nil {
			m.events.write(event{Event: "pod_refused", Sandbox: r.ContainerID, NetNS: r.NetNS, Error: err.Error()})
			return PinInfo{}, false, fmt.Errorf("%w: pods: %w", ErrFailed, err)
		}
	}
	agent, session, err := rule.podIdentity(r, meta)
	if err != nil {
		m.events.write(event{Event: "pod_refused", Sandbox: r.ContainerID, NetNS: r.NetNS, Error: err.Error()})
		return PinInfo{}, false, err
	}
	ref := &PodRef{ContainerID: r.ContainerID, Namespace: r.Namespace, Name: r.Name, UID: r.UID}
	in, err := m.pin(ctx, PinRequest{NetNS: r.NetNS, Agent: agent, Session: session, User: rule.User, Egress: rule.Egress}, pinAs{pod: ref})
	return in, err == nil, err
}

// podPin is the pin of container id, or nil.
func (m *Manager) podPin(id string) *pinEntry {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, e := range m.pins {
		if e.info.Pod != nil && e.info.Pod.ContainerID == id {
			return e
		}
	}
	return nil
}

// UnpinPod is sluice-cni's DEL: it unpins the container's pin (listeners
// closed, session ended, state removed). It is idempotent: a container
// with no pin (never pinned, unpinned already, or not selected) is fine.
func (m *Manager) UnpinPod(id string) error {
	e := m.podPin(id)
	if e == nil {
		return nil
	}
	if err := m.Unpin(e.info.ID); err != nil && !errors.Is(err, ErrNotFound) {
		return err
	}
	return nil
}

// CheckPod is sluice-cni's CHECK: the container's pin exists and its
// namespace is still closed (pin.Verify). ErrNotFound when there is no
// pin; ErrFailed naming the difference when the namespace was reopened.
func (m *Manager) CheckPod(ctx context.Context, id string) (PinInfo, error) {
	e := m.podPin(id)
	if e == nil {
		return PinInfo{}, fmt.Errorf("%w: no pin for container %q", ErrNotFound, id)
	}
	if err := e.p.Verify(ctx); err != nil {
		m.events.write(event{Event: "pod_check_failed", Sandbox: e.info.ID, Agent: e.info.Agent, Session: e.info.Session, NetNS: e.info.NetNS, Error: err.Error()})
		return e.info, fmt.Errorf("%w: %w", ErrFailed, err)
	}
	return e.info, nil
}

// GCPods is sluice-cni's GC: every pod pin whose container is not in keep
// is unpinned. It returns the container ids it removed, sorted; a pin
// that fails to unpin is reported in the error and the others go on.
func (m *Manager) GCPods(keep []string) ([]string, error) {
	k := map[string]bool{}
	for _, id := range keep {
		k[id] = true
	}
	var drop []string
	m.mu.Lock()
	for _, e := range m.pins {
		if e.info.Pod != nil && !k[e.info.Pod.ContainerID] {
			drop = append(drop, e.info.Pod.ContainerID)
		}
	}
	m.mu.Unlock()
	sort.Strings(drop)
	var errs []error
	for _, id := range drop {
		if err := m.UnpinPod(id); err != nil {
			errs = append(errs, fmt.Errorf("container %s: %w", id, err))
		}
	}
	return drop, errors.Join(errs...)
}

// podRoutes adds sluice-cni's API: POST /v1/pods (ADD), GET and DELETE
// /v1/pods/{container_id} (CHECK, DEL) and POST /v1/pods/gc (GC).
func (m *Manager) podRoutes(mux *http.ServeMux) {
	mux.HandleFunc("POST /v1/pods", func(w http.ResponseWriter, r *http.Request) {
		var b PodPinRequest
		if !decode(w, r, &b) {
			return
		}
		in, made, err := m.PinPod(r.Context(), b)
		if err != nil {
			fail(w, err)
			return
		}
		status := http.StatusOK
		if made {
			status = http.StatusCreated
		}
		reply(w, status, in)
	})
	mux.HandleFunc("GET /v1/pods/{id}", func(w http.ResponseWriter, r *http.Request) {
		in, err := m.CheckPod(r.Context(), r.PathValue("id"))
		if err != nil {
			fail(w, err)
			return
		}
		reply(w, http.StatusOK, in)
	})
	mux.HandleFunc("DELETE /v1/pods/{id}", func(w http.ResponseWriter, r *http.Request) {
		if err := m.UnpinPod(r.PathValue("id")); err != nil {
			fail(w, err)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	})
	mux.HandleFunc("POST /v1/pods/gc", func(w http.ResponseWriter, r *http.Request) {
		var b PodGCRequest
		if !decode(w, r, &b) {
			return
		}
		removed, err := m.GCPods(b.Keep)
		if err != nil {
			fail(w, err)
			return
		}
		if removed == nil {
			removed = []string{}
		}
		reply(w, http.StatusOK, map[string][]string{"removed": removed})
	})
}

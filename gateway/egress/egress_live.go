package egress

import (
	"net"
	"sync"
	"time"
)

// liveTunnelsWait bounds how long a stopping server waits for the tunnels
// it ended to write their result records.
const liveTunnelsWait = 5 * time.Second

// liveTunnels are the open CONNECT tunnels (plain and intercepted). A
// tunnel is a hijacked connection, so http.Server.Shutdown neither waits
// for it nor ends it: without this, a stopping gateway exited with its
// tunnels open and they got no result record. At close the server ends
// every tunnel and waits (at most liveTunnelsWait) until each has written
// its record, before the audit log closes.
type liveTunnels struct {
	mu     sync.Mutex
	closed bool
	m      map[*liveTunnel]struct{}
	wg     sync.WaitGroup
}

// liveTunnel is one registered tunnel: its client connection and, once
// dialled, its upstream.
type liveTunnel struct {
	set      *liveTunnels
	client   net.Conn
	upstream net.Conn
}

// add registers a tunnel on client. done must be called when the tunnel's
// result record has been written. After closeAll, client is closed at
// once, so the tunnel ends on its first read or write.
func (ts *liveTunnels) add(client net.Conn) *liveTunnel {
	t := &liveTunnel{set: ts, client: client}
	ts.mu.Lock()
	defer ts.mu.Unlock()
	ts.wg.Add(1)
	if ts.closed {
		_ = client.Close()
		return t
	}
	if ts.m == nil {
		ts.m = map[*liveTunnel]struct{}{}
	}
	ts.m[t] = struct{}{}
	return t
}

// dialled records the tunnel's upstream so that closeAll ends it too.
func (t *liveTunnel) dialled(up net.Conn) {
	t.set.mu.Lock()
	defer t.set.mu.Unlock()
	if t.set.closed {
		_ = up.Close()
		return
	}
	t.upstream = up
}

// done unregisters the tunnel.
func (t *liveTunnel) done() {
	t.set.mu.Lock()
	delete(t.set.m, t)
	t.set.mu.Unlock()
	t.set.wg.Done()
}

// closeAll ends every open tunnel and waits for their records.
func (ts *liveTunnels) closeAll() {
	ts.mu.Lock()
	ts.closed = true
	for t := range ts.m {
		_ = t.client.Close()
		if t.upstream != nil {
			_ = t.upstream.Close()
		}
	}
	ts.mu.Unlock()
	waited := make(chan struct{})
	go func() { ts.wg.Wait(); close(waited) }()
	select {
	case <-waited:
	case <-time.After(liveTunnelsWait):
	}
}

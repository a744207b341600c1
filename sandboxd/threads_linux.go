package sandboxd

import (
	"runtime"
	"sync"
	"sync/atomic"
)

// forkThreads keeps the threads sandboxd forks sandboxes' inits from. A
// fork moves its thread into the sandbox's cgroup and namespaces and on
// one CPU, and back; a thread that is back in every respect serves the
// next fork (sparing the runtime a new thread per sandbox), one that is
// not (a step back failed) is discarded: its goroutine ends while locked,
// and the runtime ends the thread with it. A thread here is locked to its
// goroutine for all of its life and runs nothing but forks, so its own
// working directory (the namespaces' root after a setns) touches no other
// code.
type forkThreads struct {
	idle   chan chan func() bool
	closed atomic.Bool
	// busy counts forks given to a thread and not yet back (leave included):
	// close waits for them, so what they touch last (sandboxd's own
	// namespaces) is not closed under them.
	busy sync.WaitGroup
}

func newForkThreads(n int) *forkThreads {
	return &forkThreads{idle: make(chan chan func() bool, n)}
}

// run runs fn on a fork thread and returns at once; fn reports whether it
// left the thread as it found it.
func (p *forkThreads) run(fn func() (clean bool)) {
	var w chan func() bool
	select {
	case w = <-p.idle:
	default:
		w = make(chan func() bool, 1)
		go p.serve(w)
	}
	p.busy.Add(1)
	w <- fn
}

func (p *forkThreads) serve(w chan func() bool) {
	runtime.LockOSThread() // never unlocked: see forkThreads
	for fn := range w {
		clean := fn()
		p.busy.Done()
		if !clean || p.closed.Load() {
			return
		}
		select {
		case p.idle <- w:
		default:
			return // enough idle threads
		}
	}
}

// close ends the idle threads and waits for the busy ones to finish their
// fork (they end after it).
func (p *forkThreads) close() {
	p.closed.Store(true)
	for {
		select {
		case w := <-p.idle:
			close(w)
		default:
			p.busy.Wait()
			return
		}
	}
}

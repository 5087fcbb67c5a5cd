package ws

import (
	"strings"
	"testing"

	"github.com/turnguard/turnguard/config"
)

// idleConn is a connection registered with e's server whose writer does
// not run: what is pushed to it stays queued, as for a client that does
// not read (or has not read yet).
func idleConn(e *env) *conn {
	c := newConn(e.srv, nil, nil, "192.0.2.9")
	e.srv.mu.Lock()
	e.srv.conns[c] = struct{}{}
	e.srv.mu.Unlock()
	e.t.Cleanup(func() {
		e.srv.mu.Lock()
		delete(e.srv.conns, c)
		e.srv.mu.Unlock()
		c.mu.Lock()
		c.dropQueueLocked()
		c.mu.Unlock()
	})
	return c
}

func mustFrame(n int) outFrame {
	return outFrame{data: []byte(`{"type":"res","id":"x","ok":true,"payload":"` + strings.Repeat("y", n) + `"}`)}
}

// TestProcessBudgetClosesTheHogsNotTheReader: four clients that do not
// read hold nearly their own budget each (1 MiB), together the process
// budget (4 MiB). A client that reads has one answer still queued when its
// run's final arrives. Before, the final did not fit the process budget and
// the reader was closed with 1013 while the hogs stayed; now the reader,
// within its fair share of the budget, gets its final, and the hogs, over
// theirs, are closed with 1013.
func TestProcessBudgetClosesTheHogsNotTheReader(t *testing.T) {
	e := newEngineEnv(t, envOpts{adjust: func(c *config.Config) {
		c.Server.SendQueueBytes = 1 << 20
		c.Server.SendBufferBytes = 4 << 20
	}})
	t.Cleanup(func() { e.srv.Shutdown(t.Context()) })
	var hogs []*conn
	for range 4 {
		h := idleConn(e)
		for range 4 {
			h.push(mustFrame(240 << 10)) // 4 × 240 KiB: within its own 1 MiB
		}
		hogs = append(hogs, h)
	}
	reader := idleConn(e)
	reader.push(mustFrame(200 << 10)) // an answer it is reading
	t.Logf("buffered %d of %d bytes", e.srv.buffered.Load(), e.srv.bufferBudget())

	reader.push(mustFrame(100 << 10)) // its run's final
	reader.mu.Lock()
	closed, queued := reader.closing, len(reader.queue)
	reader.mu.Unlock()
	if closed || queued != 2 {
		t.Fatalf("the reader: closing=%v (code %d), %d frames queued; want its final queued", closed, reader.closeCode, queued)
	}
	shed := 0
	for _, h := range hogs {
		h.mu.Lock()
		if h.closing && h.closeCode == CloseSlowConsumer {
			shed++
		}
		h.mu.Unlock()
	}
	if shed == 0 {
		t.Fatal("no client over its fair share was closed")
	}
	if b := e.srv.buffered.Load(); b > e.srv.bufferBudget() {
		t.Errorf("buffered %d bytes after shedding, over the budget %d", b, e.srv.bufferBudget())
	}
	// A hog that asks for more is closed itself.
	var open *conn
	for _, h := range hogs {
		if !h.isClosing() {
			open = h
		}
	}
	if open != nil {
		for range 8 {
			open.push(mustFrame(240 << 10))
		}
		if !open.isClosing() {
			t.Errorf("a client over its own budget was not closed")
		}
	}
}

package telegram

import (
	"context"
	"errors"
	"path/filepath"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

// lossyMarks is the store's outbox whose first MarkDelivered fails: the
// database restarted during it, before its commit (lost) or after it (the
// answer lost: it committed).
type lossyMarks struct {
	Outbox
	committed bool
	mu        sync.Mutex
	failed    bool
}

func (o *lossyMarks) MarkDelivered(ctx context.Context, id int64) error {
	o.mu.Lock()
	first := !o.failed
	o.failed = true
	o.mu.Unlock()
	if !first {
		return o.Outbox.MarkDelivered(ctx, id)
	}
	if o.committed {
		if err := o.Outbox.MarkDelivered(ctx, id); err != nil {
			return err
		}
	}
	return errors.New("mark delivered: connection reset by peer")
}

// TestDeliveredReplyNotResentAfterAFailedMark: Telegram accepted a turn's
// reply, then recording it as delivered failed (a database restart). The
// recording is tried again until the outbox takes it: the reply is not sent
// a second time by the next sweep (issue 20, defect 9), whether the failed
// mark had committed or not.
func TestDeliveredReplyNotResentAfterAFailedMark(t *testing.T) {
	for _, tc := range []struct {
		name      string
		committed bool
	}{
		{name: "mark lost"},
		{name: "mark committed, answer lost", committed: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				d := openStore(t, filepath.Join(t.TempDir(), "turnguard.db"))
				h := newHarness(t, setup{store: d, storeOutbox: &lossyMarks{Outbox: d.st, committed: tc.committed}})
				h.say(alice, "/steps say:hello")
				h.advance(2 * time.Second)
				h.wantScreen(alice, "hello")
				h.advance(2 * resendInterval) // the sweeps resend what is pending
				h.wantScreen(alice, "hello")
				pending, err := d.st.Pending(context.Background(), "telegram", 10)
				if err != nil || len(pending) != 0 {
					t.Errorf("outbox pending = %+v, %v; want none", pending, err)
				}
			})
		})
	}
}

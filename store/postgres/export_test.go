package postgres

import (
	"context"

	"github.com/turnguard/turnguard/event"
)

// WithCommitHooks returns o with hooks the writer goroutine calls inside a
// batch's transaction just before its commit and just after it; tests kill
// the process there to simulate a crash.
func WithCommitHooks(o Options, before, after func()) Options {
	o.beforeCommit, o.afterCommit = before, after
	return o
}

// WithCommitCheck returns o with a hook the writer goroutine calls inside
// each batch's transaction just before its commit, with the transaction's
// synchronous_commit.
func WithCommitCheck(o Options, check func(synchronousCommit string)) Options {
	o.commitCheck = check
	return o
}

// OwnerLock is the advisory lock key a gateway holds on its database.
const OwnerLock = ownerLock

// WriteBatch writes evs as the recorder's writer goroutine does, in one
// transaction.
func WriteBatch(ctx context.Context, s *Store, evs []event.Event) error {
	return writer{s}.WriteBatch(ctx, evs)
}

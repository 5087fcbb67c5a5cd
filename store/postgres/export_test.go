package postgres

// WithCommitHooks returns o with hooks the writer goroutine calls inside a
// batch's transaction just before its commit and just after it; tests kill
// the process there to simulate a crash.
func WithCommitHooks(o Options, before, after func()) Options {
	o.beforeCommit, o.afterCommit = before, after
	return o
}

// OwnerLock is the advisory lock key a gateway holds on its database.
const OwnerLock = ownerLock

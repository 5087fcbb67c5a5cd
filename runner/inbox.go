package runner

import "sync"

// Inbox carries the messages a person sends while a turn runs, when the
// session's busy mode is steer and the runner is a Steerer. The engine adds
// (Put); the runner takes them (Take) at its next opportunity, for example
// before its next model call. Safe for concurrent use; the zero value is
// ready.
//
// It also carries the gateway's notes to the runner (Note, TakeNotes): a
// budget warning, "N left, wrap up". A note is not a message of the
// person: it is never queued as a turn, and one not taken when the turn
// ends is dropped.
type Inbox struct {
	mu     sync.Mutex
	msgs   []string
	notes  []string
	closed bool
	// notesOnly: the inbox of a runner that takes notes but does not
	// steer (NotesOnly): Put refuses every message.
	notesOnly bool
	noted     chan struct{} // Noted's channel, made on first use
}

// NotesOnly returns an inbox for a runner that takes the gateway's notes
// but not the person's messages (a NoteTaker that does not steer): Put
// always refuses, so a message sent meanwhile is queued as a turn.
func NotesOnly() *Inbox { return &Inbox{notesOnly: true} }

// notedLocked returns the channel Noted hands out. Called with b.mu held.
func (b *Inbox) notedLocked() chan struct{} {
	if b.noted == nil {
		b.noted = make(chan struct{}, 1)
	}
	return b.noted
}

// Noted returns a channel that receives when a note is added (at most one
// wake-up waits: take every note with TakeNotes when it fires). For a
// runner that waits for notes while it works instead of looking between
// its steps.
func (b *Inbox) Noted() <-chan struct{} {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.notedLocked()
}

// maxNotes bounds the notes waiting in one inbox (the gateway sends at
// most one budget warning a turn; the bound only guards the contract).
const maxNotes = 8

// Note adds a note from the gateway for the runner and reports whether the
// runner can still take it (false once the inbox is closed, or when
// maxNotes are waiting).
func (b *Inbox) Note(text string) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed || len(b.notes) >= maxNotes {
		return false
	}
	b.notes = append(b.notes, text)
	select {
	case b.notedLocked() <- struct{}{}:
	default: // a wake-up is already waiting
	}
	return true
}

// TakeNotes returns and forgets the gateway's notes added since the last
// TakeNotes.
func (b *Inbox) TakeNotes() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	n := b.notes
	b.notes = nil
	return n
}

// Put adds a message and reports whether the turn can still take it
// (false once the runner closed the inbox: it returned, or will make no
// more model calls; always false for a NotesOnly inbox).
func (b *Inbox) Put(text string) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed || b.notesOnly {
		return false
	}
	b.msgs = append(b.msgs, text)
	return true
}

// Pending returns how many messages were added and not taken yet, and
// the bytes of their text.
func (b *Inbox) Pending() (n, bytes int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, m := range b.msgs {
		bytes += len(m)
	}
	return len(b.msgs), bytes
}

// Take returns and forgets the messages added since the last Take.
func (b *Inbox) Take() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	m := b.msgs
	b.msgs = nil
	return m
}

// Close stops the inbox taking messages and returns those never taken;
// notes never taken are dropped.
func (b *Inbox) Close() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.closed = true
	m := b.msgs
	b.msgs, b.notes = nil, nil
	return m
}

// Steerer is a runner that reads Turn.Inbox: a message steered into one of
// its turns reaches the model before the turn's next model call, and so
// does a note of the gateway (TakeNotes).
type Steerer interface {
	Runner
	// Steers reports whether this runner, as configured, reads the inbox.
	Steers() bool
}

// NoteTaker is a runner that reads the gateway's notes from Turn.Inbox
// (TakeNotes, Noted) without steering: the engine gives its turns a
// NotesOnly inbox. A Steerer that steers gets a full inbox instead.
type NoteTaker interface {
	Runner
	// TakesNotes reports whether this runner, as configured, reads notes.
	TakesNotes() bool
}

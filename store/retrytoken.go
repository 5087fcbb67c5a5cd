package store

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"time"
)

// RetryToken is a Retry button's capability (issue 19): the secret the
// button carries stands for one turn that ended in a retryable way, in one
// chat of one channel, and only its Sender may press it. A token starts at
// most one run (UsedBy).
type RetryToken struct {
	RunID     string    `json:"runId"`   // the turn whose message a press sends again
	Channel   string    `json:"channel"` // the channel and chat the button is in
	ChatRef   string    `json:"chatRef"`
	Sender    string    `json:"sender"` // who alone may press it, as the channel names them
	CreatedAt time.Time `json:"createdAt"`
	UsedBy    string    `json:"usedBy,omitempty"` // the run a press started; "" while unused
	UsedAt    time.Time `json:"usedAt,omitzero"`
}

// ErrTokenUsed: the retry token already started a run (UseRetryToken).
var ErrTokenUsed = errors.New("retry token already used")

// RetryTokens keeps Retry buttons' tokens. A store keeps only a token's
// SHA-256 (RetryTokenHash), never the secret: reading the database gives
// no button anyone could press.
type RetryTokens interface {
	// SaveRetryToken records secret as t's token (t.UsedBy is ignored).
	// Saving a secret again keeps the first row.
	SaveRetryToken(ctx context.Context, secret string, t RetryToken) error
	// RetryToken returns secret's token, or an error wrapping ErrNotFound.
	RetryToken(ctx context.Context, secret string) (RetryToken, error)
	// UseRetryToken marks secret's unused token as used by run usedBy, at
	// at, and returns it as it was before. It is atomic: of two presses
	// at once, one gets the token and the other ErrTokenUsed (with the
	// token, whose UsedBy says which run took it). An unknown secret is
	// ErrNotFound.
	UseRetryToken(ctx context.Context, secret, usedBy string, at time.Time) (RetryToken, error)
	// ReleaseRetryToken makes secret's token unused again if run usedBy
	// holds it (the press started nothing, or its message was dropped
	// before it ran); otherwise it changes nothing.
	ReleaseRetryToken(ctx context.Context, secret, usedBy string) error
}

// RetryTokenHash is the key under which a store keeps a retry token's
// secret: its SHA-256, in hex.
func RetryTokenHash(secret string) string {
	sum := sha256.Sum256([]byte(secret))
	return hex.EncodeToString(sum[:])
}

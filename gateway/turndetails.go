// Turn details: a finished turn's steps and settled approvals, loaded from
// the store for the clients that show them.

package gateway

import (
	"context"
	"fmt"
	"time"

	"github.com/turnguard/turnguard/event"
)

// TurnDetailsLoader reads the details of finished turns from the store:
// only runs that have any are in the map. It must bound what it reads.
type TurnDetailsLoader func(ctx context.Context, runIDs []string) (map[string]event.TurnDetail, error)

// turnDetailsTimeout bounds one TurnDetails read: a slow store delays a
// history by at most this long (the history is then answered without
// details).
const turnDetailsTimeout = 5 * time.Second

// TurnDetails returns the steps and settled approvals of the finished
// turns runIDs (a history's run ids), read from the store. Without a store
// (Options.TurnDetails nil) it returns nil, nil: the in-memory history has
// the texts only. An error means the details are unknown; the caller
// answers the history without them.
func (e *Engine) TurnDetails(ctx context.Context, runIDs []string) (map[string]event.TurnDetail, error) {
	if e.details == nil || len(runIDs) == 0 {
		return nil, nil
	}
	ctx, cancel := context.WithTimeout(ctx, turnDetailsTimeout)
	defer cancel()
	d, err := e.details(ctx, runIDs)
	if err != nil {
		return nil, fmt.Errorf("turn details of %d runs: %w", len(runIDs), err)
	}
	return d, nil
}

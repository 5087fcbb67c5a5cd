package store_test

import (
	"context"
	"testing"

	"github.com/turnguard/turnguard/store"
)

// Version 4 is the previous schema version since v5 (the queue): its rows
// survive the migration and the queue works on the migrated file.
func TestMigrateFromVersion4KeepsRowsAndQueues(t *testing.T) {
	s := openMigrated(t, 4)
	if err := s.AddQueued(context.Background(), store.QueuedMessage{RunID: "q", SessionKey: "telegram:42", Text: "next"}); err != nil {
		t.Fatalf("AddQueued on the migrated file: %v", err)
	}
	eqStrings(t, "queued", queuedTexts(t, s), []string{"q=next"})
}

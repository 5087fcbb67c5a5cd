package faketime

import (
	"strings"
	"testing"
	"testing/synctest"
	"time"
)

func TestAdvanceMovesTheBubbleClock(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		Advance(90 * time.Minute)
		if got := time.Since(start); got != 90*time.Minute {
			t.Fatalf("clock moved %v, want 1h30m", got)
		}
	})
}

func TestAdvanceRefusesRealTime(t *testing.T) {
	defer func() {
		p := recover()
		if p == nil || !strings.Contains(p.(string), "outside a synctest bubble") {
			t.Fatalf("Advance outside a bubble: recovered %v, want a panic", p)
		}
	}()
	Advance(time.Hour)
}

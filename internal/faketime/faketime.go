// Package faketime owns the one way tests move the clock. Timing tests run
// inside testing/synctest bubbles, where time.Sleep advances the bubble's
// fake clock at once; Advance says so in its name and refuses to run
// anywhere else, so no test can wait on the real clock by mistake.
package faketime

import (
	"fmt"
	"time"
)

// Advance moves the calling synctest bubble's fake clock forward by d (it
// returns once every goroutine in the bubble is blocked and the clock has
// reached the new time). It panics when called outside a bubble, where it
// would really sleep.
func Advance(d time.Duration) {
	if !InBubble() {
		panic(fmt.Sprintf("faketime.Advance(%v) called outside a synctest bubble: it would really sleep", d))
	}
	time.Sleep(d)
}

// InBubble reports whether the caller runs inside a synctest bubble, whose
// fake clock starts at midnight UTC on 1 January 2000 (no test advances it
// by a year).
func InBubble() bool { return time.Now().UTC().Year() == 2000 }

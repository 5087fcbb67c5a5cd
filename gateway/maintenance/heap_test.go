package maintenance

import (
	"math/rand/v2"
	"slices"
	"strconv"
	"testing"
	"testing/synctest"
	"time"

	"github.com/turnguard/turnguard/gateway/abort"
	"github.com/turnguard/turnguard/internal/faketime"
)

// TestShardHeapOrder: the 4-ary value heap pops in key order, whatever the
// size (the sizes cover an empty last level, a partial one and a deep one),
// also after a compaction rebuilt it.
func TestShardHeapOrder(t *testing.T) {
	for _, n := range []int{1, 2, 4, 5, 17, 1000, 5000} {
		t.Run(strconv.Itoa(n), func(t *testing.T) {
			reg := abort.New(nil)
			var sh shard
			var want []time.Duration
			for i := range n {
				r, err := reg.Register(t.Context(), abort.Spec{RunID: strconv.Itoa(i), SessionKey: "s"})
				if err != nil {
					t.Fatal(err)
				}
				when := time.Duration(1 + rand.IntN(n*4))
				r.SetArmed(when)
				sh.push(entry{when: when, run: r})
				sh.live++
				want = append(want, when)
			}
			// Half the runs are re-armed earlier: their old entries go stale.
			for i := 0; i < n; i += 2 {
				r := sh.h[i].run
				when := r.Armed() - 1
				if when <= 0 {
					continue
				}
				old := r.Armed()
				r.SetArmed(when)
				sh.push(entry{when: when, run: r})
				want[slices.Index(want, old)] = when
			}
			sh.compact()
			slices.Sort(want)
			var got []time.Duration
			for len(sh.h) > 0 {
				if e := sh.pop(); e.run.Armed() == e.when {
					got = append(got, e.when)
				}
			}
			if !slices.Equal(got, want) {
				t.Fatalf("popped %v\nwant %v", got, want)
			}
		})
	}
}

// TestStaleEntriesAreBounded: runs re-armed earlier again and again, then
// released, leave at most compactSlack entries per shard beyond twice the
// live runs, and none of them counts as live.
func TestStaleEntriesAreBounded(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, on)
		var runs []*abort.Run
		for i := range 3000 {
			runs = append(runs, h.start(t, "r"+strconv.Itoa(i), st(time.Hour, 2*time.Hour, 3*time.Hour, 0)))
		}
		for k := range 10 { // every round moves every run earlier: one stale entry each
			for _, r := range runs {
				h.sched.arm(r, 50*time.Minute-time.Duration(k)*time.Minute)
			}
		}
		check := func(when string) {
			t.Helper()
			for i := range h.sched.shards {
				sh := &h.sched.shards[i]
				sh.mu.Lock()
				n, live := len(sh.h), sh.live
				sh.mu.Unlock()
				if n > 2*live+compactSlack {
					t.Fatalf("%s: shard %d holds %d entries for %d live runs", when, i, n, live)
				}
			}
		}
		check("after re-arms")
		for _, r := range runs {
			h.reg.Release(r)
		}
		check("after release")
		if e := h.sched.Stats().Entries; e != 0 {
			t.Fatalf("entries = %d after every run was released", e)
		}
		faketime.Advance(time.Minute)
		synctest.Wait()
	})
}

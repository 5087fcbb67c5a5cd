package postgres_test

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/turnguard/turnguard/event"
	"github.com/turnguard/turnguard/internal/pgtest"
	"github.com/turnguard/turnguard/store"
	"github.com/turnguard/turnguard/store/postgres"
	"github.com/turnguard/turnguard/store/storetest"
)

// BenchmarkEndingCommit measures the write path a Telegram user waits on:
// from Handle of a turn's ending to the commit of its transaction (turn
// ended, history message, outbox rows — committed durably), seen as the
// store's OnOutbox call. One turn at a time, so each ending is a batch of
// its own; p50-ns and p99-ns are over b.N endings. Both stores write to
// this machine's disk; run with TURNGUARD_PGTEST_FSYNC=on for PostgreSQL
// to sync as in production (the test server does not by default):
//
//	TURNGUARD_PGTEST_FSYNC=on go test -run '^$' -bench EndingCommit -benchtime=2000x ./store/postgres/
func BenchmarkEndingCommit(b *testing.B) {
	for _, driver := range []string{"sqlite", "postgres"} {
		b.Run("store="+driver, func(b *testing.B) {
			committed := make(chan struct{}, 1)
			onOutbox := func(string) {
				select {
				case committed <- struct{}{}:
				default:
				}
			}
			var s store.Backend
			var err error
			ctx := context.Background()
			if driver == "sqlite" {
				s, err = store.Open(ctx, filepath.Join(b.TempDir(), "bench.db"), store.Options{
					Logger: storetest.Quiet, OutboxChannels: []string{"telegram"}, OnOutbox: onOutbox})
			} else {
				s, err = postgres.Open(ctx, pgtest.New(b), postgres.Options{
					Logger: storetest.Quiet, OutboxChannels: []string{"telegram"}, OnOutbox: onOutbox})
			}
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close()
			lat := make([]time.Duration, 0, b.N)
			b.ResetTimer()
			for i := range b.N {
				b.StopTimer()
				tr := storetest.NewTurn(fmt.Sprintf("run-%d", i), fmt.Sprintf("telegram:%d", i%100))
				s.Handle(tr.Ev(event.TurnStarted, 0, func(e *event.Event) { e.Text = "What's the weather?" }))
				storetest.Flush(b, s)
				b.StartTimer()
				start := time.Now()
				s.Handle(tr.Ev(event.Finished, time.Second, func(e *event.Event) {
					e.StopReason, e.FullText = event.ReasonStop, "Sunny, 21°C."
				}))
				<-committed
				lat = append(lat, time.Since(start))
			}
			b.StopTimer()
			slices.Sort(lat)
			b.ReportMetric(float64(lat[len(lat)/2].Nanoseconds()), "p50-ns")
			b.ReportMetric(float64(lat[len(lat)*99/100].Nanoseconds()), "p99-ns")
		})
	}
}

package natstest_test

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/turnguard/turnguard/internal/natstest"
	"github.com/turnguard/turnguard/internal/testwait"
)

// TestClusterSurvivesAKilledNode starts three real nodes, stores messages in
// a replicated memory stream, SIGKILLs one node, stores more through the
// others, restarts it and reads every message back through it.
func TestClusterSurvivesAKilledNode(t *testing.T) {
	c := natstest.Start(t, 3)
	if len(c.URLs()) != 3 {
		t.Fatalf("URLs() = %v", c.URLs())
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	connect := func(i int) jetstream.JetStream {
		nc, err := nats.Connect(c.URL(i))
		if err != nil {
			t.Fatalf("connect to node %d: %v", i, err)
		}
		t.Cleanup(nc.Close)
		js, err := jetstream.New(nc)
		if err != nil {
			t.Fatal(err)
		}
		return js
	}
	js := connect(1)
	_, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "T", Subjects: []string{"t.>"},
		Storage: jetstream.MemoryStorage, Replicas: 3})
	if err != nil {
		t.Fatalf("create stream: %v", err)
	}
	if _, err := js.Publish(ctx, "t.a", []byte("1")); err != nil {
		t.Fatalf("publish: %v", err)
	}

	c.Kill(0)
	// The stream's leader may have been node 0: publishing retries until
	// the remaining two elect a new one.
	testwait.NoError(t, 20*time.Second, func() error {
		pctx, pcancel := context.WithTimeout(ctx, time.Second)
		defer pcancel()
		_, err := js.Publish(pctx, "t.a", []byte("2"))
		return err
	})

	c.Restart(0)
	js0 := connect(0)
	testwait.NoError(t, 20*time.Second, func() error {
		gctx, gcancel := context.WithTimeout(ctx, time.Second)
		defer gcancel()
		s0, err := js0.Stream(gctx, "T")
		if err != nil {
			return err
		}
		m, err := s0.GetLastMsgForSubject(gctx, "t.a")
		if err != nil {
			return err
		}
		if string(m.Data) != "2" {
			t.Fatalf("last message %q, want \"2\"", m.Data)
		}
		return nil
	})
}

// TestSingleNode checks the one-node form answers JetStream.
func TestSingleNode(t *testing.T) {
	c := natstest.Start(t, 1)
	nc, err := nats.Connect(c.URLs()[0])
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := js.AccountInfo(ctx); err != nil {
		t.Fatalf("account info: %v", err)
	}
	c.Stop(0)
	if nc.FlushTimeout(200*time.Millisecond) == nil {
		t.Error("a flush succeeded with the only node stopped")
	}
}

package natsbus

import (
	"context"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/turnguard/turnguard/cluster/jsstream"
)

// Config names the stream and subjects; the exporters and watchers of one
// deployment share it. The zero Config is the defaults.
type Config struct {
	// Stream is the JetStream stream's name. Default "TG_EVENTS".
	Stream string
	// Prefix is the first subject token. Default "tg".
	Prefix string
	// Replicas of the stream: 3 in a three-node cluster (a kept event
	// survives one node's loss), 1 on a single node. Default 1.
	Replicas int
	// MaxAge is how long a kept frame stays repairable. Default 10 minutes.
	MaxAge time.Duration
	// MaxMsgsPerSubject bounds one session's kept frames (the newest stay)
	// and so a repair's walk. Default 1024.
	MaxMsgsPerSubject int64
	// MaxBytes bounds the memory the stream takes on each replica (the
	// oldest frames go first). Default 256 MiB.
	MaxBytes int64
	// Duplicates is the window in which a retried publish of a frame the
	// stream already stored is recognised (by its Nats-Msg-Id) and stored
	// once. Default 10 s: retries happen within seconds, and the window
	// costs memory per frame.
	Duplicates time.Duration
}

func (c Config) withDefaults() Config {
	if c.Stream == "" {
		c.Stream = "TG_EVENTS"
	}
	if c.Prefix == "" {
		c.Prefix = "tg"
	}
	if c.Replicas == 0 {
		c.Replicas = 1
	}
	if c.MaxAge == 0 {
		c.MaxAge = 10 * time.Minute
	}
	if c.MaxMsgsPerSubject == 0 {
		c.MaxMsgsPerSubject = 1024
	}
	if c.MaxBytes == 0 {
		c.MaxBytes = 256 << 20
	}
	if c.Duplicates == 0 {
		c.Duplicates = 10 * time.Second
	}
	return c
}

// EnsureStream creates the memory stream for cfg's kept subjects, or
// updates it to cfg. Deltas' subjects are not in it. Reads of a frame go to
// the stream's leader (no direct get from followers, which may lag the
// frames a watcher has already seen on the wire).
func EnsureStream(ctx context.Context, js jetstream.JetStream, cfg Config) (jetstream.Stream, error) {
	cfg = cfg.withDefaults()
	sc := jetstream.StreamConfig{
		Name:              cfg.Stream,
		Description:       "turnguard: kept events of every session, per-session sequence (cluster/natsbus)",
		Subjects:          []string{cfg.Prefix + ".ev.*.*"},
		Storage:           jetstream.MemoryStorage,
		Replicas:          cfg.Replicas,
		Retention:         jetstream.LimitsPolicy,
		Discard:           jetstream.DiscardOld,
		MaxAge:            cfg.MaxAge,
		MaxBytes:          cfg.MaxBytes,
		MaxMsgsPerSubject: cfg.MaxMsgsPerSubject,
		Duplicates:        cfg.Duplicates,
	}
	s, err := jsstream.Stream(ctx, js, sc)
	if err != nil {
		return nil, fmt.Errorf("natsbus: ensure stream %s: %w", cfg.Stream, err)
	}
	return s, nil
}

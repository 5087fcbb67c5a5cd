// Package tgupdates carries Telegram updates across gateway replicas
// (issue 12) through a JetStream stream partitioned by chat:
//
//   - PublishUpdate (Log) stores an update on its chat's partition and
//     returns only once the stream acknowledged it, so a poller advances
//     its getUpdates offset only past stored updates; a re-sent update
//     (same update_id, the Nats-Msg-Id) is stored once. A webhook handler
//     calls the same on any replica and answers Telegram 200 only after it
//     returned nil.
//   - Consume (Consumer) runs on every replica: the partitions are spread
//     over the live replicas (a membership bucket), and each partition's
//     consumer is pinned to one replica at a time (a JetStream priority
//     group with the pinned_client policy) and delivers one update at a
//     time (MaxAckPending 1), acknowledged only after the handler returned
//     nil: each chat's updates are handled in order, on one replica.
//
// Delivery is at least once: a replica that dies mid-update (or whose
// acknowledgement is lost) leaves that update unacknowledged, and the next
// replica pinned to the partition gets it again (Update.Delivery > 1). The
// Telegram side makes handling idempotent by deriving the turn's run id
// from the update (the chat and message ids, as it already does), which
// the engine deduplicates: a second Send with the same run id answers with
// the turn in progress or its outcome instead of starting another.
//
// The leader lease that decides which replica polls is package
// cluster/lease. This package imports nothing of turnguard's.
package tgupdates

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/turnguard/turnguard/cluster/jsstream"
)

// Config names the stream and its partitions; every replica of a
// deployment (publishers and consumers) must share it. The zero Config is
// the defaults.
type Config struct {
	// Stream is the stream's name. Default "TG_UPDATES".
	Stream string
	// Prefix is the first subject token: partition p is <Prefix>.upd.<p>.
	// Default "tgu".
	Prefix string
	// Partitions is how many partitions the chats are spread over (by a
	// hash of the chat id). Changing it moves chats between partitions, so
	// it changes only with the stream drained. Default 16.
	Partitions int
	// Replicas of the stream: 3 in a three-node cluster, so a stored
	// update survives one node's loss. Default 1.
	Replicas int
	// Duplicates is the window in which a re-sent update (same update id)
	// is stored once. It must cover a poll's re-delivery window: a poller
	// that dies after storing updates but before its next getUpdates
	// confirmed them leaves them to the next poller, which gets them again
	// within the lease's TTL plus one long poll. Telegram's webhook retries
	// can come later; those are caught by the engine's run-id idempotency.
	// Default 10 minutes.
	Duplicates time.Duration
	// MaxAge is how long an unhandled update is kept. Default 24 h (what
	// Telegram itself keeps).
	MaxAge time.Duration
	// MaxMsgs bounds the unhandled updates stored; past it PublishUpdate
	// fails (the stream discards new messages, never old ones), so the
	// poller stops advancing. Default 1,000,000.
	MaxMsgs int64
	// Sign, if set, signs each update PublishUpdate stores, binding the
	// headers it is given (the update and chat ids); Verify, if set,
	// checks it on consume: an update it refuses is never handled — it is
	// terminated, counted (Consumer.Refused) and reported to OnError at
	// most once every RefusedReportEvery. A cluster sets both (its
	// replicas' shared key): then only a replica — the poller or a webhook
	// handler — can put an update in front of the consumers, whoever else
	// can publish to the subjects.
	Sign   func(m *nats.Msg, bound ...string)
	Verify func(subject string, h nats.Header, data []byte, bound ...string) error
}

// RefusedReportEvery is the least time between two reports of refused
// (unsigned or forged) updates.
const RefusedReportEvery = 10 * time.Second

// boundHeaders are the headers an update's signature covers besides its
// subject and body.
var boundHeaders = []string{HeaderUpdateID, HeaderChatID}

func (c Config) withDefaults() Config {
	if c.Stream == "" {
		c.Stream = "TG_UPDATES"
	}
	if c.Prefix == "" {
		c.Prefix = "tgu"
	}
	if c.Partitions <= 0 {
		c.Partitions = 16
	}
	if c.Replicas <= 0 {
		c.Replicas = 1
	}
	if c.Duplicates <= 0 {
		c.Duplicates = 10 * time.Minute
	}
	if c.MaxAge <= 0 {
		c.MaxAge = 24 * time.Hour
	}
	if c.MaxMsgs <= 0 {
		c.MaxMsgs = 1_000_000
	}
	return c
}

// Partition returns the partition of chatID, in [0, Partitions).
func (c Config) Partition(chatID int64) int {
	c = c.withDefaults()
	h := fnv.New64a()
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], uint64(chatID))
	h.Write(b[:])
	return int(h.Sum64() % uint64(c.Partitions))
}

func (c Config) subject(p int) string { return c.Prefix + ".upd." + strconv.Itoa(p) }

// Headers of a stored update (besides Nats-Msg-Id, the update id).
const (
	HeaderUpdateID = "Tg-Update-Id"
	HeaderChatID   = "Tg-Chat-Id"
)

// EnsureStream creates the update stream, or updates it to cfg: file
// storage (an acknowledged update is on disk — the OS's page cache, as
// nats-server syncs every two minutes by default — on a quorum of
// Replicas, so it survives a gateway replica's crash and a NATS node's),
// work-queue retention (an update is removed once handled), new messages
// refused when full.
func EnsureStream(ctx context.Context, js jetstream.JetStream, cfg Config) (jetstream.Stream, error) {
	cfg = cfg.withDefaults()
	s, err := jsstream.Stream(ctx, js, jetstream.StreamConfig{
		Name:        cfg.Stream,
		Description: "turnguard: Telegram updates, partitioned by chat (cluster/tgupdates)",
		Subjects:    []string{cfg.Prefix + ".upd.*"},
		Storage:     jetstream.FileStorage,
		Replicas:    cfg.Replicas,
		Retention:   jetstream.WorkQueuePolicy,
		Discard:     jetstream.DiscardNew,
		MaxAge:      cfg.MaxAge,
		MaxMsgs:     cfg.MaxMsgs,
		Duplicates:  cfg.Duplicates,
	})
	if err != nil {
		return nil, fmt.Errorf("tgupdates: ensure stream %s: %w", cfg.Stream, err)
	}
	return s, nil
}

// Log publishes updates; safe for concurrent use.
type Log struct {
	cfg Config
	js  jetstream.JetStream
}

// NewLog ensures the stream (EnsureStream) and returns a Log on nc. The
// caller owns nc.
func NewLog(ctx context.Context, nc *nats.Conn, cfg Config) (*Log, error) {
	cfg = cfg.withDefaults()
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, fmt.Errorf("tgupdates: %w", err)
	}
	if _, err := EnsureStream(ctx, js, cfg); err != nil {
		return nil, err
	}
	return &Log{cfg: cfg, js: js}, nil
}

// PublishError is PublishUpdate's error: the update may or may not be
// stored. The caller must not advance past it; sending it again is safe
// (a stored copy makes the second one a duplicate).
type PublishError struct {
	UpdateID, ChatID int64
	Err              error
}

func (e *PublishError) Error() string {
	return fmt.Sprintf("tgupdates: update %d (chat %d) not confirmed stored: %v", e.UpdateID, e.ChatID, e.Err)
}

func (e *PublishError) Unwrap() error { return e.Err }

// PublishUpdate stores raw (the update's JSON as Telegram sent it) on
// chatID's partition, with updateID as its Nats-Msg-Id, and returns nil
// only after the stream acknowledged it — stored on a quorum of replicas,
// or recognised as a duplicate of an update stored within the Duplicates
// window. Any other outcome is a *PublishError. ctx bounds the wait (5 s
// when it has no deadline).
func (l *Log) PublishUpdate(ctx context.Context, updateID, chatID int64, raw []byte) error {
	id := strconv.FormatInt(updateID, 10)
	m := &nats.Msg{Subject: l.cfg.subject(l.cfg.Partition(chatID)), Data: raw, Header: nats.Header{}}
	m.Header.Set(HeaderUpdateID, id)
	m.Header.Set(HeaderChatID, strconv.FormatInt(chatID, 10))
	if l.cfg.Sign != nil {
		l.cfg.Sign(m, boundHeaders...)
	}
	ack, err := l.js.PublishMsg(ctx, m, jetstream.WithMsgID(id), jetstream.WithExpectStream(l.cfg.Stream))
	if err == nil && ack.Stream != l.cfg.Stream {
		err = fmt.Errorf("acknowledged by stream %q", ack.Stream)
	}
	if err != nil {
		return &PublishError{UpdateID: updateID, ChatID: chatID, Err: err}
	}
	return nil
}

// errBadHeaders: a message on an update subject without our headers.
var errBadHeaders = errors.New("not an update (missing or bad Tg-Update-Id / Tg-Chat-Id)")

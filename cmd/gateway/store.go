package main

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/turnguard/turnguard/config"
	"github.com/turnguard/turnguard/gateway/errlog"
	"github.com/turnguard/turnguard/store"
	"github.com/turnguard/turnguard/store/postgres"
)

// storeHooks are the store's calls back into the gateway.
type storeHooks struct {
	OnHealth func(err error)      // the store stopped or started being able to write
	OnOutbox func(channel string) // a batch put turn endings into the outbox
}

// openStore opens the store store.driver names: the SQLite file at
// store.path, or the PostgreSQL database at store.url. Its error says which
// store, and never shows the database password.
func openStore(ctx context.Context, cfg *config.Config, log *slog.Logger, h storeHooks) (store.Backend, error) {
	c := cfg.Store
	switch c.Driver {
	case config.StorePostgres:
		s, err := postgres.Open(ctx, c.URL, postgres.Options{
			QueueSize: c.QueueSize, Logger: log, Retention: retention(c.Retention),
			OnHealth: h.OnHealth, OutboxChannels: outboxChannels(cfg), OnOutbox: h.OnOutbox,
			Shared: cfg.Cluster.Enabled, // the replicas share it, coordinating through the lease table
		})
		if err != nil {
			// postgres.Open's error names the database with the password
			// redacted; the configured secrets are scrubbed once more.
			return nil, fmt.Errorf("store (store.driver postgres): %w", scrubbed(err, cfg.Secrets()))
		}
		return s, nil
	default:
		s, err := store.Open(ctx, c.Path, store.Options{
			QueueSize: c.QueueSize, Logger: log, Retention: retention(c.Retention),
			OnHealth: h.OnHealth, OutboxChannels: outboxChannels(cfg), OnOutbox: h.OnOutbox,
		})
		if err != nil {
			return nil, err // "open store <path>: …"
		}
		return s, nil
	}
}

// storeWhere names the store for the log: the SQLite file, or the database
// URL without its password.
func storeWhere(cfg *config.Config) string {
	if cfg.Store.Driver == config.StorePostgres {
		return postgres.Redact(cfg.Store.URL)
	}
	return cfg.Store.Path
}

// storeInstance identifies the store's state for the exec runner's run tags
// (execrunner.InstanceID): the SQLite file, or the PostgreSQL database
// without its password (and, for a replica, its id).
func storeInstance(cfg *config.Config) string {
	if cfg.Store.Driver == config.StorePostgres {
		if cfg.Cluster.Enabled {
			// Replicas share the database: each kills only its own
			// leftovers (a restarted replica keeps its cluster.replicaID).
			return "postgres:" + postgres.Redact(cfg.Store.URL) + "#" + replicaID(cfg)
		}
		return "postgres:" + postgres.Redact(cfg.Store.URL)
	}
	return cfg.Store.Path
}

// scrubbedError is an error whose text has the configured secrets
// replaced; errors.Is and errors.As still see the original.
type scrubbedError struct {
	msg string
	err error
}

func (e *scrubbedError) Error() string { return e.msg }
func (e *scrubbedError) Unwrap() error { return e.err }

func scrubbed(err error, secrets []string) error {
	return &scrubbedError{msg: errlog.NewRedactor(secrets).Redact(err.Error()), err: err}
}

package lease

import (
	"context"
	"errors"

	"github.com/nats-io/nats.go/jetstream"
)

// store is the little of a KV bucket a campaign uses, so its timing can be
// tested under testing/synctest without NATS. kvStore is the real one.
type store interface {
	// create writes key if it is absent: errExists if it is there.
	create(ctx context.Context, key string, val []byte) (rev uint64, err error)
	// update writes key if its latest revision is rev: errConflict if not
	// (including when the key is gone).
	update(ctx context.Context, key string, val []byte, rev uint64) (uint64, error)
	// get reads key's latest value: errNotFound if absent.
	get(ctx context.Context, key string) ([]byte, uint64, error)
	// del deletes key if its latest revision is rev: errConflict if not.
	del(ctx context.Context, key string, rev uint64) error
}

var (
	errExists   = errors.New("key exists")
	errConflict = errors.New("key revision mismatch")
	errNotFound = errors.New("key not found")
)

type kvStore struct{ kv jetstream.KeyValue }

func (s kvStore) create(ctx context.Context, key string, val []byte) (uint64, error) {
	rev, err := s.kv.Create(ctx, key, val)
	if errors.Is(err, jetstream.ErrKeyExists) {
		return 0, errExists
	}
	return rev, err
}

func (s kvStore) update(ctx context.Context, key string, val []byte, rev uint64) (uint64, error) {
	n, err := s.kv.Update(ctx, key, val, rev)
	if errors.Is(err, jetstream.ErrKeyRevisionMismatch) || errors.Is(err, jetstream.ErrKeyExists) {
		return 0, errConflict
	}
	return n, err
}

func (s kvStore) get(ctx context.Context, key string) ([]byte, uint64, error) {
	e, err := s.kv.Get(ctx, key)
	if errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyDeleted) {
		return nil, 0, errNotFound
	}
	if err != nil {
		return nil, 0, err
	}
	return e.Value(), e.Revision(), nil
}

func (s kvStore) del(ctx context.Context, key string, rev uint64) error {
	err := s.kv.Delete(ctx, key, jetstream.LastRevision(rev))
	if errors.Is(err, jetstream.ErrKeyRevisionMismatch) || errors.Is(err, jetstream.ErrKeyExists) {
		return errConflict
	}
	return err
}

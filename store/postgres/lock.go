package postgres

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// ownerLock is the session-level advisory lock key a gateway that is its
// database's only user holds for as long as its store is open ("tguard01"
// in ASCII; not migrationLock, which Open takes per transaction).
const ownerLock int64 = 0x7467756172643031

// lockWait is how long Open tries to take ownerLock before it reports the
// database in use: the server releases the lock of a gateway that just died
// (restarted after a crash) once it sees the connection end.
const (
	lockWait  = 3 * time.Second
	lockRetry = 100 * time.Millisecond
)

// InUseError is the error of Open when another gateway holds the database
// (Options.Shared false): two gateways on one database would mark each
// other's turns interrupted at start and answer one session twice.
type InUseError struct {
	Where  string // the database, password redacted
	Holder string // who holds it, as the server knows the holder's connection ("" if unknown)
}

func (e *InUseError) Error() string {
	who := ""
	if e.Holder != "" {
		who = " (" + e.Holder + ")"
	}
	return fmt.Sprintf("another gateway is using the database %s%s; stop it, or give this one another database", e.Where, who)
}

// lockOwner takes ownerLock on a connection of its own, taken out of the
// pool so that it lives as long as the store: the server releases the lock
// when that connection ends (Close, or the process dies). It fails with
// *InUseError when another connection still holds the lock after lockWait.
func lockOwner(ctx context.Context, pool *pgxpool.Pool, where string) (*pgx.Conn, error) {
	pc, err := pool.Acquire(ctx)
	if err != nil {
		return nil, fmt.Errorf("lock the database: %w", err)
	}
	conn := pc.Hijack()
	give := time.Now().Add(lockWait)
	for {
		var ok bool
		if err := conn.QueryRow(ctx, `SELECT pg_try_advisory_lock($1)`, ownerLock).Scan(&ok); err != nil {
			_ = conn.Close(ctx)
			return nil, fmt.Errorf("lock the database: %w", err)
		}
		if ok {
			return conn, nil
		}
		if time.Now().After(give) || ctx.Err() != nil {
			holder := lockHolder(ctx, conn)
			_ = conn.Close(ctx)
			return nil, &InUseError{Where: where, Holder: holder}
		}
		t := time.NewTimer(lockRetry)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
		}
	}
}

// lockHolder describes the connection that holds ownerLock, as far as the
// server tells this role: its client address, its server process and since
// when it is connected. Best effort: "" when it cannot be read.
func lockHolder(ctx context.Context, conn *pgx.Conn) string {
	var (
		addr  *string
		pid   int32
		since time.Time
	)
	err := conn.QueryRow(ctx, `
		SELECT host(a.client_addr), a.pid, a.backend_start
		FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
		WHERE l.locktype = 'advisory' AND l.granted
		  AND l.classid = ($1::bigint >> 32)::oid AND l.objid = ($1::bigint & 4294967295)::oid AND l.objsubid = 1
		LIMIT 1`, ownerLock).Scan(&addr, &pid, &since)
	if err != nil {
		return ""
	}
	var b strings.Builder
	b.WriteString("connected")
	if addr != nil && *addr != "" {
		b.WriteString(" from " + *addr)
	} else {
		b.WriteString(" over a local socket")
	}
	fmt.Fprintf(&b, " since %s, server pid %d", since.UTC().Format(time.RFC3339), pid)
	return b.String()
}

// closeOwner releases ownerLock by closing its connection.
func (s *Store) closeOwner() {
	s.ownerMu.Lock()
	defer s.ownerMu.Unlock()
	if s.owner != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = s.owner.Close(ctx)
		s.owner = nil
	}
}

// checkOwner runs on the writer goroutine (BatchWriter.Check). The server
// releases ownerLock when the connection holding it ends (the server
// restarted, a network cut): the store takes it again on a new connection.
// If another gateway took it meanwhile, the store is held unwritable — new
// turns are refused and readiness fails — until this gateway has it again;
// it reports false so that no probe ends that. A server that cannot be
// reached is left to the probes (true).
func (s *Store) checkOwner() bool {
	if s.shared {
		return true
	}
	s.ownerMu.Lock()
	defer s.ownerMu.Unlock()
	if s.owner == nil || !s.owner.IsClosed() && s.ping() == nil {
		return true
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_ = s.owner.Close(ctx)
	conn, err := lockOwner(ctx, s.pool, s.where)
	if err != nil {
		if iu, ok := errors.AsType[*InUseError](err); ok {
			s.ownerLost = true
			s.rec.Hold(iu)
			return false
		}
		return true // unreachable: the probes report it
	}
	s.owner = conn
	if s.ownerLost {
		s.ownerLost = false
		s.log.Info("store: this gateway holds the database again", "store", s.where)
		s.rec.Release()
	}
	return true
}

// ping checks the owner connection, under ownerMu.
func (s *Store) ping() error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return s.owner.Ping(ctx)
}

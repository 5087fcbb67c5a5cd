package postgres

import (
	"context"
	"errors"
	"net"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/turnguard/turnguard/store"
)

// classify says what an error of the server or the connection is (see
// store.Failure): the content of an event (an integrity or data error:
// SQLSTATE classes 23 and 22), or the state of the server (unreachable,
// shutting down, out of disk or connections, read-only, I/O errors).
func classify(err error) store.Failure {
	f := store.Failure{Reason: "writes to the database fail"}
	if _, ok := errors.AsType[*InUseError](err); ok {
		f.Storage, f.Reason = true, "another gateway is using the database"
		return f
	}
	if pe, ok := errors.AsType[*pgconn.PgError](err); ok {
		code := pe.Code
		switch {
		case strings.HasPrefix(code, "23"), strings.HasPrefix(code, "22"):
			f.EventSpecific = true
		case code == "53100":
			f.Storage, f.Reason = true, "the database server's disk is full"
		case strings.HasPrefix(code, "53"):
			f.Storage, f.Reason = true, "the database server is out of resources (memory or connections)"
		case strings.HasPrefix(code, "58"), code == "XX001", code == "XX002":
			f.Storage, f.Reason = true, "the database server reports I/O errors or corruption"
		case code == "25006":
			f.Storage, f.Reason = true, "the database is read-only (a standby, or default_transaction_read_only)"
		case strings.HasPrefix(code, "57P"):
			f.Storage, f.Reason = true, "the database server is shutting down or restarting"
		case strings.HasPrefix(code, "08"):
			f.Storage, f.Reason = true, "the database server cannot be reached"
		case code == "57014":
			f.Storage, f.Reason = true, "a statement on the database server timed out"
		case strings.HasPrefix(code, "40"):
			f.Storage, f.Reason = true, "the database server aborted the transaction (a conflict or deadlock)"
		}
		return f
	}
	var ne net.Error
	if pgconn.SafeToRetry(err) || errors.As(err, &ne) || errors.Is(err, context.DeadlineExceeded) ||
		isConnectError(err) || pgconn.Timeout(err) {
		f.Storage, f.Reason = true, "the database server cannot be reached"
	}
	return f
}

func isConnectError(err error) bool {
	_, ok := errors.AsType[*pgconn.ConnectError](err)
	return ok
}

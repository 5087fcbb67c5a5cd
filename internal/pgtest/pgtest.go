// Package pgtest owns the throwaway PostgreSQL server that tests run
// against: a real server from Debian's postgresql package, one per test
// binary, started on first use (initdb into a temporary directory, then
// postgres on a free loopback port and a private socket directory) and
// stopped when the test binary ends (Main) or dies (the server gets a
// signal when its parent goes). Each test gets its own database (New),
// dropped at the test's cleanup.
//
// The server runs with fsync off (a test's data need not survive a power
// loss; TURNGUARD_PGTEST_FSYNC=on turns it on for benchmarks) but
// synchronous_commit at its default (on), so a commit is still acknowledged
// only once written to the WAL, as in production.
//
// initdb and postgres refuse to run as root: when the test runs as root (CI
// and the development machines do) they run as the postgres user that the
// Debian package creates, and the directories are handed to it.
//
// Without the server's binaries a test calling New is skipped, unless
// TURNGUARD_REQUIRE_POSTGRES=1 (make test sets it), which fails it instead.
package pgtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/turnguard/turnguard/internal/tb"
	"github.com/turnguard/turnguard/internal/testproc"
)

// RequireEnv is the environment variable that turns a missing server into a
// test failure instead of a skip.
const RequireEnv = "TURNGUARD_REQUIRE_POSTGRES"

// FsyncEnv is the environment variable that, set to "on", starts the server
// with fsync on (as in production) for benchmarks of commit latency.
const FsyncEnv = "TURNGUARD_PGTEST_FSYNC"

// BinGlob is where Debian's postgresql package installs the server's
// binaries, one directory per major version.
const BinGlob = "/usr/lib/postgresql/*/bin"

const (
	startWait = 60 * time.Second // initdb plus the server's start-up
	stopWait  = 15 * time.Second // a fast shutdown before it is killed
	dbUser    = "postgres"
)

// server is the one server of this test binary.
type server struct {
	dir      string // removed on stop
	port     int
	password string
	cmd      *exec.Cmd
	exited   <-chan struct{} // closed when the postgres process has exited
	log      string          // the server's log file

	// what run needs to start the server again (Restart)
	bin, data, sock string
	cred            *syscall.Credential

	mu    sync.Mutex // guards admin
	admin *pgx.Conn
}

var (
	once     sync.Once
	srv      *server
	startErr error
	missing  bool // no binaries: skip (or fail, with RequireEnv)
	dbSeq    atomic.Int64
)

// Main runs the package's tests and then stops the server, if a test
// started one. Call it from TestMain: func TestMain(m *testing.M) {
// pgtest.Main(m) }.
func Main(m *testing.M) {
	code := m.Run()
	Stop()
	os.Exit(code)
}

// Stop stops the server and removes its files. It is safe to call when no
// server was started; New after Stop fails.
func Stop() {
	once.Do(func() { startErr = errors.New("pgtest: stopped") })
	if srv != nil {
		srv.stop()
		srv = nil
	}
}

// New creates a fresh, empty database on the test binary's server (starting
// the server on first use) and returns its URL: postgres://…@127.0.0.1:port/
// name, with the server's password. The database is dropped (its
// connections closed) when t ends.
func New(t tb.TB) string {
	t.Helper()
	once.Do(start)
	if missing {
		if os.Getenv(RequireEnv) == "1" {
			t.Fatalf("pgtest: %v (%s=1: PostgreSQL is required; `make test` installs it)", startErr, RequireEnv)
		}
		t.Skipf("pgtest: %v; skipping (install Debian's postgresql package, or run `make test`)", startErr)
	}
	if startErr != nil {
		t.Fatalf("pgtest: %v", startErr)
	}
	name := dbName(t.Name())
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := srv.exec(ctx, "CREATE DATABASE "+name); err != nil {
		t.Fatalf("pgtest: create database %s: %v", name, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if srv == nil {
			return
		}
		if err := srv.exec(ctx, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)"); err != nil {
			t.Errorf("pgtest: drop database %s: %v", name, err)
		}
	})
	return srv.url(name)
}

// Password returns the server's password (it is in every URL New returns),
// for tests that check it never shows; "" before a server started.
func Password() string {
	if srv == nil {
		return ""
	}
	return srv.password
}

// PID returns the test binary's server's process id (the postmaster,
// whose children are the backends and the background processes), 0 when
// no server runs: load tests read the CPU of the whole server from it.
func PID() int {
	if srv == nil || srv.cmd == nil || srv.cmd.Process == nil {
		return 0
	}
	return srv.cmd.Process.Pid
}

var unsafeChars = regexp.MustCompile(`[^a-z0-9_]+`)

// dbName is a unique database name derived from the test's name.
func dbName(test string) string {
	base := unsafeChars.ReplaceAllString(strings.ToLower(test), "_")
	prefix := fmt.Sprintf("t%d_", dbSeq.Add(1))
	if n := 63 - len(prefix); len(base) > n {
		base = base[:n]
	}
	return prefix + base
}

func (s *server) url(db string) string {
	u := url.URL{Scheme: "postgres", User: url.UserPassword(dbUser, s.password),
		Host: net.JoinHostPort("127.0.0.1", strconv.Itoa(s.port)), Path: "/" + db, RawQuery: "sslmode=disable"}
	return u.String()
}

// exec runs an administrative statement on the postgres database.
func (s *server) exec(ctx context.Context, sql string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.admin == nil || s.admin.IsClosed() {
		c, err := pgx.Connect(ctx, s.url("postgres"))
		if err != nil {
			return err
		}
		s.admin = c
	}
	_, err := s.admin.Exec(ctx, sql)
	return err
}

// binDir finds the newest installed server.
func binDir() (string, error) {
	dirs, _ := filepath.Glob(BinGlob)
	dirs = slices.DeleteFunc(dirs, func(d string) bool {
		_, err := os.Stat(filepath.Join(d, "initdb"))
		return err != nil
	})
	if len(dirs) == 0 {
		return "", fmt.Errorf("no PostgreSQL server binaries (initdb) under %s", BinGlob)
	}
	slices.SortFunc(dirs, func(a, b string) int { return majorOf(a) - majorOf(b) })
	return dirs[len(dirs)-1], nil
}

func majorOf(dir string) int {
	n, _ := strconv.Atoi(filepath.Base(filepath.Dir(dir)))
	return n
}

func start() {
	bin, err := binDir()
	if err != nil {
		missing, startErr = true, err
		return
	}
	s, err := launch(bin)
	if err != nil {
		startErr = fmt.Errorf("start the test server (%s): %w", bin, err)
		return
	}
	srv = s
}

// launch runs initdb and starts postgres; on failure it cleans up.
func launch(bin string) (_ *server, err error) {
	dir, err := os.MkdirTemp("", "turnguard-pgtest-")
	if err != nil {
		return nil, err
	}
	s := &server{dir: dir, log: filepath.Join(dir, "server.log")}
	defer func() {
		if err != nil {
			s.stop()
		}
	}()
	cred, err := credential()
	if err != nil {
		return nil, err
	}
	data, sock := filepath.Join(dir, "data"), filepath.Join(dir, "sock")
	for _, d := range []string{data, sock} {
		if err := os.Mkdir(d, 0o700); err != nil {
			return nil, err
		}
	}
	pw := make([]byte, 16)
	if _, err := rand.Read(pw); err != nil {
		return nil, err
	}
	s.password = hex.EncodeToString(pw)
	pwFile := filepath.Join(dir, "pwfile")
	if err := os.WriteFile(pwFile, []byte(s.password+"\n"), 0o600); err != nil {
		return nil, err
	}
	if cred != nil {
		// The postgres user must reach its directories: the temporary
		// directory is traversable, the rest is its own.
		if err := os.Chmod(dir, 0o711); err != nil {
			return nil, err
		}
		for _, p := range []string{data, sock, pwFile} {
			if err := os.Chown(p, int(cred.Uid), int(cred.Gid)); err != nil {
				return nil, err
			}
		}
	}
	initdb := exec.Command(filepath.Join(bin, "initdb"), "-D", data, "-U", dbUser, "--pwfile", pwFile,
		"--auth-host=scram-sha-256", "--auth-local=trust", "-E", "UTF8", "--locale=C", "--no-sync")
	initdb.Dir = dir
	initdb.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	if out, err := initdb.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("initdb: %w\n%s", err, out)
	}
	_ = os.Remove(pwFile)
	s.bin, s.data, s.sock, s.cred = bin, data, sock, cred

	// The port is chosen free and may be taken before postgres binds it:
	// try a few.
	for range 5 {
		if s.port, err = freePort(); err != nil {
			return nil, err
		}
		if err = s.run(bin, data, sock, cred); err == nil {
			return s, nil
		}
		if !errors.Is(err, errExited) {
			return nil, err
		}
	}
	return nil, err
}

var errExited = errors.New("postgres exited during start-up")

// run starts postgres and waits until it accepts connections.
func (s *server) run(bin, data, sock string, cred *syscall.Credential) error {
	logf, err := os.OpenFile(s.log, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
	if err != nil {
		return err
	}
	defer logf.Close()
	// A test server: no fsync (nothing has to survive a power loss);
	// synchronous_commit stays on, so commits behave as in production.
	// FsyncEnv=on (benchmarks of commit latency) syncs like production.
	fsync := "off"
	if os.Getenv(FsyncEnv) == "on" {
		fsync = "on"
	}
	args := []string{"-D", data, "-k", sock, "-p", strconv.Itoa(s.port),
		"-c", "listen_addresses=127.0.0.1",
		"-c", "fsync=" + fsync, "-c", "full_page_writes=" + fsync,
		"-c", "max_connections=300", "-c", "shared_buffers=32MB"}
	// pg_stat_statements, when the installation has it, lets tests count
	// the statements a turn costs (CREATE EXTENSION in their database).
	if _, err := os.Stat(filepath.Join(bin, "..", "lib", "pg_stat_statements.so")); err == nil {
		args = append(args, "-c", "shared_preload_libraries=pg_stat_statements")
	}
	cmd := exec.Command(filepath.Join(bin, "postgres"), args...)
	cmd.Dir = s.dir
	cmd.Stdout, cmd.Stderr = logf, logf
	// The server must not outlive a test binary that dies without Main's
	// clean-up: it gets SIGQUIT (an immediate shutdown that ends its own
	// children) when the thread that started it ends.
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred, Setpgid: true}
	exited, err := testproc.Start(cmd, syscall.SIGQUIT)
	if err != nil {
		return fmt.Errorf("postgres: %w", err)
	}
	s.cmd, s.exited = cmd, exited
	deadline := time.Now().Add(startWait)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		c, err := pgx.Connect(ctx, s.url("postgres"))
		cancel()
		if err == nil {
			s.admin = c
			return nil
		}
		select {
		case <-exited:
			out, _ := os.ReadFile(s.log)
			return fmt.Errorf("%w: %s", errExited, out)
		default:
		}
		if time.Now().After(deadline) {
			out, _ := os.ReadFile(s.log)
			return fmt.Errorf("postgres did not accept connections within %s: %v\n%s", startWait, err, out)
		}
		select {
		case <-exited:
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// credential is who runs initdb and postgres: nil (this user) unless the
// test runs as root, which they refuse; then the postgres user.
func credential() (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	u, err := user.Lookup(dbUser)
	if err != nil {
		return nil, fmt.Errorf("running as root, and initdb refuses root: no %q user to run it as (Debian's postgresql package creates it): %w", dbUser, err)
	}
	uid, err1 := strconv.ParseUint(u.Uid, 10, 32)
	gid, err2 := strconv.ParseUint(u.Gid, 10, 32)
	if err := errors.Join(err1, err2); err != nil {
		return nil, fmt.Errorf("user %s: %w", dbUser, err)
	}
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
}

// freePort returns a loopback TCP port nothing listens on now.
func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// Restart stops the test binary's server (a fast shutdown: every
// connection is closed), runs down while it is stopped, and starts it again
// on the same port with the same data: committed data survives, as after a
// real server restart. Call it only from a test that does not run in
// parallel with others (the server is every test's), after New.
func Restart(t tb.TB, down func()) {
	t.Helper()
	if srv == nil {
		t.Fatal("pgtest: Restart before New: no server")
	}
	srv.halt()
	down()
	if err := srv.run(srv.bin, srv.data, srv.sock, srv.cred); err != nil {
		t.Fatalf("pgtest: start the server again: %v", err)
	}
}

// stop shuts the server down (fast shutdown, then a kill) and removes its
// directory.
func (s *server) stop() {
	s.halt()
	_ = os.RemoveAll(s.dir)
}

// halt shuts the server down (fast shutdown, then a kill), keeping its
// files.
func (s *server) halt() {
	s.mu.Lock()
	if s.admin != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_ = s.admin.Close(ctx)
		cancel()
		s.admin = nil
	}
	s.mu.Unlock()
	if s.cmd != nil && s.cmd.Process != nil {
		_ = s.cmd.Process.Signal(syscall.SIGINT) // fast shutdown
		select {
		case <-s.exited:
		case <-time.After(stopWait):
			_ = s.cmd.Process.Kill()
			<-s.exited
		}
		s.cmd = nil
	}
}

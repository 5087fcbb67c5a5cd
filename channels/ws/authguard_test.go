package ws

import (
	"fmt"
	"testing"
	"testing/synctest"
	"time"

	"github.com/turnguard/turnguard/internal/faketime"
)

// authAttempt connects from remote with token tok and returns the connect
// response.
func authAttempt(t *testing.T, e *env, remote, tok string) frame {
	t.Helper()
	c := e.connectRaw(remote)
	c.read() // challenge
	res := c.call("connect", connectFixture(t, "cli", tok))
	if !res.OK {
		c.closed()
	}
	c.ws.Close()
	return res
}

// TestFailedLoginsNeverLockOutAnInnocentAddress: once more than 4,096
// addresses had failed, every new address shared one allowance, so an
// attacker draining it locked out a user at an address that had never
// failed, right token and all (the review locked out ::1 for 6 s). Now the
// oldest record is forgotten instead: a user whose network never failed
// is checked, and gets in, however many others are failing.
func TestFailedLoginsNeverLockOutAnInnocentAddress(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const token = "the-right-token-123"
		e := newPipeEnv(t, envOpts{opts: Options{Token: token}})
		for i := range authMaxAddrs + 10 {
			e.srv.auth.fail(fmt.Sprintf("198.18.%d.%d", i/256, i%256), "cli", "AUTH_TOKEN_MISMATCH", time.Now())
		}
		for i := range 30 {
			authAttempt(t, e, fmt.Sprintf("198.19.0.%d:4000", i), "guess")
		}
		for _, innocent := range []string{"[::1]:5000", "203.0.113.7:5000", "[2001:db8:feed::1]:5000"} {
			if res := authAttempt(t, e, innocent, token); !res.OK {
				t.Errorf("the right token from %s, which never failed: %s", innocent, res.raw)
			}
		}
	})
}

// TestFailedLoginsRotatingAddressesAreBounded: rotating source addresses
// bypassed the per-address throttle (~1,775 guesses/s in the first minute
// from 127.x.y.z). Now all of 127.0.0.0/8 is one network, as is an IPv6
// /64, and a process-wide failure bucket caps the guesses of every
// network that has already failed. An attacker trying 40 times a second
// for 30 s gets its token checked at most: 15 times from loopback or one
// /64 (10, then one per 6 s); from 64 networks of its own, once each plus
// what the process-wide bucket allows. A user with the right token at an
// address that never failed still gets in.
func TestFailedLoginsRotatingAddressesAreBounded(t *testing.T) {
	const (
		token   = "the-right-token-123"
		seconds = 30
		perSec  = 40
	)
	tests := []struct {
		name   string
		remote func(i int) string
		max    int
	}{
		{"127.0.0.0/8", func(i int) string { return fmt.Sprintf("127.%d.%d.%d:4000", i/65536%256, i/256%256, i%254+1) }, 10 + seconds/6 + 1},
		{"one IPv6 /64", func(i int) string { return fmt.Sprintf("[2001:db8:1:2::%x]:4000", i+1) }, 10 + seconds/6 + 1},
		{"64 IPv4 addresses", func(i int) string { return fmt.Sprintf("198.51.100.%d:4000", i%64) }, 64 + authGlobalBurst + authGlobalRate*seconds},
		{"64 IPv6 /64s", func(i int) string { return fmt.Sprintf("[2001:db8:%x::1]:4000", i%64) }, 64 + authGlobalBurst + authGlobalRate*seconds},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				e := newPipeEnv(t, envOpts{opts: Options{Token: token}})
				checked, n := 0, 0
				for range seconds {
					for range perSec {
						if detailCode(authAttempt(t, e, tc.remote(n), "guess")) == "AUTH_TOKEN_MISMATCH" {
							checked++
						}
						n++
					}
					faketime.Advance(time.Second)
				}
				t.Logf("%d of %d guesses checked in %d s", checked, n, seconds)
				if checked > tc.max {
					t.Errorf("%d guesses checked in %d s, want at most %d", checked, seconds, tc.max)
				}
				if res := authAttempt(t, e, "203.0.113.9:5000", token); !res.OK {
					t.Errorf("the right token from an address that never failed, during the attack: %s", res.raw)
				}
			})
		})
	}
}

// The busy phase: turns past their step timeout at a fixed rate, and the
// p99 of how late each replica aborted them (its abort-lateness metric).

package main

import (
	"fmt"
	"io"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/turnguard/turnguard/internal/clusterrig"
	"github.com/turnguard/turnguard/internal/tb"
)

// nopTB is the tb.TB of connections made on a goroutine of their own: the
// connection is closed by its owner, and a failure comes back as an error
// (DialErr), so nothing here is called.
type nopTB struct{ tb.TB }

func (nopTB) Cleanup(func()) {}

// abortLateP99 reads g's turnguard_abort_late_seconds (every stop reason)
// and returns the upper bound of the bucket holding the 99th percentile.
func abortLateP99(g *clusterrig.Gateway) (string, int64, error) {
	req, err := http.NewRequest(http.MethodGet, g.HTTP()+"/metrics", nil)
	if err != nil {
		return "", 0, err
	}
	req.Header.Set("Authorization", "Bearer "+clusterrig.OperatorToken)
	cl := http.Client{Timeout: 10 * time.Second}
	res, err := cl.Do(req)
	if err != nil {
		return "", 0, err
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		return "", 0, err
	}
	if res.StatusCode != http.StatusOK {
		return "", 0, fmt.Errorf("status %d", res.StatusCode)
	}
	return lateP99(string(b))
}

// lateP99 sums the abort_late_seconds buckets over the stop reasons and
// returns the bound of the bucket the 99th percentile falls in.
func lateP99(metrics string) (string, int64, error) {
	buckets := map[string]int64{}
	var bounds []float64
	for _, line := range strings.Split(metrics, "\n") {
		if !strings.HasPrefix(line, "turnguard_abort_late_seconds_bucket{") {
			continue
		}
		i := strings.Index(line, `le="`)
		j := strings.LastIndexByte(line, ' ')
		if i < 0 || j < 0 {
			continue
		}
		le := line[i+4 : i+4+strings.IndexByte(line[i+4:], '"')]
		v, err := strconv.ParseFloat(line[j+1:], 64)
		if err != nil {
			return "", 0, fmt.Errorf("metrics line %q: %w", line, err)
		}
		if _, ok := buckets[le]; !ok {
			f, err := strconv.ParseFloat(le, 64) // "+Inf" parses
			if err != nil {
				return "", 0, fmt.Errorf("metrics bound %q: %w", le, err)
			}
			bounds = append(bounds, f)
		}
		buckets[le] += int64(v)
	}
	sort.Float64s(bounds)
	if len(bounds) == 0 {
		return "n/a (no histogram)", 0, nil
	}
	total := buckets[fmtBound(bounds[len(bounds)-1])]
	if total == 0 {
		return "n/a", 0, nil
	}
	lo := "0"
	for _, b := range bounds {
		hi := time.Duration(b * float64(time.Second)).String()
		if float64(buckets[fmtBound(b)]) >= 0.99*float64(total) {
			return fmt.Sprintf("%s (bucket %s–%s)", hi, lo, hi), total, nil
		}
		lo = hi
	}
	return "+Inf", total, nil
}

func fmtBound(f float64) string { return strconv.FormatFloat(f, 'g', -1, 64) }

// busyPhase: a session held by a hanging turn on replica 0; busy sends
// through replica 0 (the owner) and through replica 1 (claim → held
// elsewhere → forwarded → the owner's answer), one at a time.
func busyPhase(r *tb.Run, co clusterOptions, c *clusterrig.Cluster) error {
	tr := newTracker(co.counters)
	d := &dialer{c: c, r: r, tr: tr}
	own, _ := d.dial(0)
	sess := "agent:main:busy-check"
	if err := sendStarted(own, sess, "/steps shell:hang", "busy-holder", nil, 0); err != nil {
		return err
	}
	for _, via := range []int{0, 1} {
		cl := own
		if via != 0 {
			cl, _ = d.dial(via)
		}
		var lat latencies
		for k := range co.busySamples {
			if co.stopping.Load() {
				break
			}
			t0 := time.Now()
			a, err := cl.SendErr(sess, "are you busy", fmt.Sprintf("busy-%d-%d", via, k))
			took := time.Since(t0)
			if err != nil {
				return fmt.Errorf("busy send via %s: %w", c.Gateway(via).ID, err)
			}
			if a.OK || a.Err == nil || a.Err.Details["code"] != "SESSION_BUSY" || a.Err.Details["runId"] != "busy-holder" {
				return fmt.Errorf("busy send via %s: not the busy answer naming busy-holder: ok=%v err=%v", c.Gateway(via).ID, a.OK, a.Err)
			}
			lat = append(lat, took)
		}
		what := "the owner"
		if via != 0 {
			what = "another replica (forwarded)"
		}
		fmt.Fprintf(co.out, "busy answer through %s (%s): p50 %s  p99 %s  max %s  (%d sends, one at a time)\n",
			what, c.Gateway(via).ID, ms(lat.q(0.5)), ms(lat.q(0.99)), ms(lat.q(1)), len(lat))
	}
	// Free the session again.
	if f, err := own.CallErr("chat.abort", map[string]any{"sessionKey": sess}); err != nil || !f.OK {
		return fmt.Errorf("abort busy-holder: %v %v", err, f.Error)
	}
	return nil
}

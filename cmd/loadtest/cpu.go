// CPU of the rig's processes and of the machine during a phase
// (/proc/PID/stat and /proc/stat).

package main

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/turnguard/turnguard/internal/clusterrig"
)

// procCPU is a process's own user+system CPU time from /proc/PID/stat (0
// when unreadable).
func procCPU(pid int) time.Duration {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	p, err := parseProcStat(b)
	if err != nil {
		return 0
	}
	return ticks(p.utime + p.stime)
}

// machineCPU is the busy and total CPU time of the whole machine from
// /proc/stat.
func machineCPU() (busy, total time.Duration) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, 0
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	var sum, idle int64
	for k, v := range f[1:] {
		n, _ := strconv.ParseInt(v, 10, 64)
		sum += n
		if k == 3 || k == 4 { // idle, iowait
			idle += n
		}
	}
	return time.Duration(sum-idle) * time.Second / 100, time.Duration(sum) * time.Second / 100
}

// cpuWatch measures a phase's CPU: the gateways', this process's and the
// machine's.
type cpuWatch struct {
	c             *clusterrig.Cluster
	gw            []time.Duration
	self          time.Duration
	mBusy, mTotal time.Duration
}

func startCPU(c *clusterrig.Cluster) *cpuWatch {
	w := &cpuWatch{c: c}
	for _, g := range c.Gateways() {
		w.gw = append(w.gw, procCPU(g.PID()))
	}
	w.self = procCPU(os.Getpid())
	w.mBusy, w.mTotal = machineCPU()
	return w
}

// String is the CPU used since startCPU.
func (w *cpuWatch) String() string {
	var parts []string
	for i, g := range w.c.Gateways() {
		parts = append(parts, fmt.Sprintf("%s %.1fs", g.ID, (procCPU(g.PID())-w.gw[i]).Seconds()))
	}
	busy, total := machineCPU()
	pct := 0.0
	if total > w.mTotal {
		pct = 100 * float64(busy-w.mBusy) / float64(total-w.mTotal)
	}
	return fmt.Sprintf("gateways %s; load client %.1fs; machine %.0f%% busy (all processes, both cores)",
		strings.Join(parts, ", "), (procCPU(os.Getpid()) - w.self).Seconds(), pct)
}

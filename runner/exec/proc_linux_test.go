package exec

import "testing"

// BenchmarkProcScan is what ending a turn adds: a scan of /proc for the
// group's processes (killGroup) and, for an exec turn, one for its run tag
// (killTagged), here with nothing to kill. Its cost grows with the number
// of processes on the machine.
func BenchmarkProcScan(b *testing.B) {
	b.Run("group", func(b *testing.B) {
		for b.Loop() {
			killGroup(1 << 30) // no such group
		}
	})
	b.Run("tag", func(b *testing.B) {
		want := []byte(RunTagEnv + "=bench:none")
		for b.Loop() {
			_, _ = killTagged(func(e []byte) bool { return string(e) == string(want) })
		}
	})
}

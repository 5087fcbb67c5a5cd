package config

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

// FuzzLoad feeds arbitrary bytes as the YAML file. Load must never panic:
// it returns either a configuration that passes Validate (and can be used:
// printed, resolved into turn settings, rendered) or an error.
//
//	go test -run '^$' -fuzz FuzzLoad -fuzztime 20s ./config
func FuzzLoad(f *testing.F) {
	files, _ := filepath.Glob("testdata/*/*.yaml")
	more, _ := filepath.Glob("testdata/*.yaml")
	for _, path := range append(files, more...) {
		data, err := os.ReadFile(path)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := load("fuzz.yaml", bytesProvider(data), nil)
		if err != nil {
			if c != nil {
				t.Fatalf("both a config and an error: %v", err)
			}
			if err.Error() == "" {
				t.Fatal("an empty error")
			}
			return
		}
		if err := c.Validate(); err != nil {
			t.Fatalf("Load accepted a config that Validate refuses: %v", err)
		}
		_ = c.String()
		for _, ch := range []string{ChannelWS, ChannelTelegram, "other"} {
			for _, req := range []time.Duration{0, -1, time.Second, 1 << 62} {
				s := c.TurnSettings(ch, req)
				if s.Timeout <= 0 || s.ProgressRepeat <= 0 || s.AbortGrace <= 0 {
					t.Fatalf("TurnSettings(%s, %v) = %+v: a limit that must be positive is not", ch, req, s)
				}
				if s.MaxTurnTime > 0 && s.Timeout > s.MaxTurnTime {
					t.Fatalf("TurnSettings(%s, %v) = %+v: wall clock past the ceiling", ch, req, s)
				}
			}
			if r := c.RunnerFor(ch); r != RunnerDemo && r != RunnerOpenAI && r != RunnerExec {
				t.Fatalf("RunnerFor(%s) = %q", ch, r)
			}
		}
		if c.MessageSet() == nil {
			t.Fatal("no message set")
		}
	})
}

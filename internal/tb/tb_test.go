package tb

import (
	"errors"
	"os"
	"strings"
	"testing"
)

// Fatalf stops the function, the clean-ups run last first, and the error
// carries every message.
func TestDoFatalRunsCleanupsAndReturnsTheMessages(t *testing.T) {
	var order []string
	var dir string
	err := Do("x", func(string) {}, func(r *Run) error {
		dir = r.TempDir()
		r.Cleanup(func() { order = append(order, "first") })
		r.Cleanup(func() { order = append(order, "second") })
		r.Errorf("soft %d", 1)
		r.Fatalf("hard %d", 2)
		order = append(order, "after Fatalf")
		return nil
	})
	if err == nil || !strings.Contains(err.Error(), "soft 1") || !strings.Contains(err.Error(), "hard 2") {
		t.Fatalf("err = %v, want both messages", err)
	}
	if strings.Join(order, ",") != "second,first" {
		t.Fatalf("order = %v", order)
	}
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("temporary directory %s left behind: %v", dir, err)
	}
}

func TestDoPassesTheFunctionsError(t *testing.T) {
	want := errors.New("plain")
	if err := Do("x", nil, func(*Run) error { return want }); !errors.Is(err, want) {
		t.Fatalf("err = %v", err)
	}
	if err := Do("x", nil, func(r *Run) error { r.Logf("hello"); return nil }); err != nil {
		t.Fatalf("err = %v", err)
	}
}

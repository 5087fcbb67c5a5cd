package acp_test

import (
	"context"
	"errors"
	"slices"
	"testing"

	"github.com/turnguard/turnguard/runner/acp"
)

// TestConfigOptions: the config options session/new gives (a select in
// groups, a boolean) are kept for the conversation; SetConfigOption sends
// session/set_config_option for a known option and value — which the agent
// then uses — and refuses others without a call.
func TestConfigOptions(t *testing.T) {
	r, _, _ := newRunner(t, grace, nil)
	ctx := context.Background()
	if _, ok := r.ConfigOptions("k"); ok {
		t.Error("config options before any turn")
	}
	if err := r.SetConfigOption(ctx, "k", "model", "smart"); !errors.Is(err, acp.ErrNoSession) {
		t.Errorf("before any turn: %v, want ErrNoSession", err)
	}
	c := &conv{key: "k", id: "c"}
	if got := mustSay(t, r, c.turn("settings")); got != "model fast verbose false" {
		t.Fatalf("settings: %q", got)
	}
	want := []acp.ConfigOption{
		{ID: "model", Name: "Model", Current: "fast", Values: []acp.ConfigValue{{ID: "fast", Name: "Fast"}, {ID: "smart", Name: "Smart"}}},
		{ID: "verbose", Name: "Verbose", Boolean: true, Current: "off"},
	}
	optsEqual := func(got []acp.ConfigOption) bool {
		return slices.EqualFunc(got, want, func(a, b acp.ConfigOption) bool {
			return a.ID == b.ID && a.Name == b.Name && a.Boolean == b.Boolean && a.Current == b.Current && slices.Equal(a.Values, b.Values)
		})
	}
	if got, ok := r.ConfigOptions("k"); !ok || !optsEqual(got) {
		t.Fatalf("config options %+v, want %+v", got, want)
	}
	for _, tc := range []struct {
		id, value string
		err       error
	}{
		{"model", "genius", acp.ErrUnknownValue},
		{"temperature", "hot", acp.ErrUnknownOption},
		{"verbose", "maybe", acp.ErrUnknownValue},
		{"model", "smart", nil},
		{"verbose", "on", nil},
	} {
		if err := r.SetConfigOption(ctx, "k", tc.id, tc.value); !errors.Is(err, tc.err) || (tc.err == nil && err != nil) {
			t.Errorf("SetConfigOption(%s, %s) = %v, want %v", tc.id, tc.value, err, tc.err)
		}
	}
	want[0].Current, want[1].Current = "smart", "on"
	if got, _ := r.ConfigOptions("k"); !optsEqual(got) {
		t.Errorf("after setting: %+v, want %+v", got, want)
	}
	if got := mustSay(t, r, c.turn("settings")); got != "model smart verbose true" {
		t.Errorf("the agent's settings after setting them: %q", got)
	}
}

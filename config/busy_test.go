package config

import (
	"errors"
	"strings"
	"testing"
	"time"
)

// TestBusyFor: a channel's busy keys override agents.defaults.busy key by
// key; other channels get the defaults.
func TestBusyFor(t *testing.T) {
	n := func(v int) *int { return &v }
	c := Default()
	c.Agents.Defaults.Busy = Busy{Mode: BusyCollect, MaxQueued: n(7)}
	c.Channels.Telegram.Busy = Busy{Mode: BusyInterrupt}
	c.Channels.WS.Busy = Busy{MaxQueued: n(0)}
	for _, tc := range []struct {
		channel string
		mode    string
		max     int
	}{
		{ChannelTelegram, BusyInterrupt, 7},
		{ChannelWS, BusyCollect, 0},
		{"loopback", BusyCollect, 7},
	} {
		if mode, max := c.BusyFor(tc.channel); mode != tc.mode || max != tc.max {
			t.Errorf("BusyFor(%s) = %s, %d; want %s, %d", tc.channel, mode, max, tc.mode, tc.max)
		}
	}
	if mode, max := Default().BusyFor(ChannelWS); mode != BusyQueue || max != 5 {
		t.Errorf("default BusyFor = %s, %d; want queue, 5", mode, max)
	}
	c.Agents.Defaults.Busy.MaxQueuedBytes = n(4096)
	c.Channels.Telegram.Busy.MaxQueuedBytes = n(100)
	for channel, want := range map[string]int{ChannelTelegram: 100, ChannelWS: 4096} {
		if got := c.QueuedBytesFor(channel); got != want {
			t.Errorf("QueuedBytesFor(%s) = %d, want %d", channel, got, want)
		}
	}
	if got := Default().QueuedBytesFor(ChannelWS); got != 1<<20 {
		t.Errorf("default QueuedBytesFor = %d, want 1 MiB", got)
	}
	c.Agents.Defaults.Busy.Overflow, c.Agents.Defaults.Busy.DebounceMs = OverflowDropOld, n(500)
	c.Channels.Telegram.Busy.Overflow, c.Channels.WS.Busy.DebounceMs = OverflowDropNew, n(0)
	for _, tc := range []struct {
		channel, overflow string
		debounce          time.Duration
	}{
		{ChannelTelegram, OverflowDropNew, 500 * time.Millisecond},
		{ChannelWS, OverflowDropOld, 0},
		{"loopback", OverflowDropOld, 500 * time.Millisecond},
	} {
		if got := c.OverflowFor(tc.channel); got != tc.overflow {
			t.Errorf("OverflowFor(%s) = %s, want %s", tc.channel, got, tc.overflow)
		}
		if got := c.DebounceFor(tc.channel); got != tc.debounce {
			t.Errorf("DebounceFor(%s) = %v, want %v", tc.channel, got, tc.debounce)
		}
	}
	if o, d := Default().OverflowFor(ChannelWS), Default().DebounceFor(ChannelWS); o != OverflowReject || d != 0 {
		t.Errorf("default overflow, debounce = %s, %v; want reject, 0", o, d)
	}
}

// TestBusyValidation: an unknown mode and an out-of-range maxQueued are
// refused with a problem naming the key and what is allowed.
func TestBusyValidation(t *testing.T) {
	n := func(v int) *int { return &v }
	for _, tc := range []struct {
		key, errSub string
		set         func(*Config)
	}{
		{"agents.defaults.busy.mode", `must be one of queue, collect, steer, interrupt, reject, got "later"`,
			func(c *Config) { c.Agents.Defaults.Busy.Mode = "later" }},
		{"channels.telegram.busy.mode", `got "steering"`, func(c *Config) { c.Channels.Telegram.Busy.Mode = "steering" }},
		{"agents.defaults.busy.maxQueued", "from 0 (nothing waits) to 100, got 101",
			func(c *Config) { c.Agents.Defaults.Busy.MaxQueued = n(101) }},
		{"channels.ws.busy.maxQueued", "got -1", func(c *Config) { c.Channels.WS.Busy.MaxQueued = n(-1) }},
		{"agents.defaults.busy.maxQueuedBytes", "from 1 to 67108864 (64 MiB), got 0",
			func(c *Config) { c.Agents.Defaults.Busy.MaxQueuedBytes = n(0) }},
		{"channels.telegram.busy.maxQueuedBytes", "from 1 to 67108864 (64 MiB), got 67108865",
			func(c *Config) { c.Channels.Telegram.Busy.MaxQueuedBytes = n(64<<20 + 1) }},
		{"agents.defaults.busy.maxQueuedBytes", "must be set", func(c *Config) { c.Agents.Defaults.Busy.MaxQueuedBytes = nil }},
		{"agents.defaults.busy.overflow", `must be one of reject, drop-old, drop-new, got "summarize"`,
			func(c *Config) { c.Agents.Defaults.Busy.Overflow = "summarize" }},
		{"channels.ws.busy.overflow", `got "old"`, func(c *Config) { c.Channels.WS.Busy.Overflow = "old" }},
		{"agents.defaults.busy.debounceMs", "from 0 (off) to 10000 (10 s), got 10001",
			func(c *Config) { c.Agents.Defaults.Busy.DebounceMs = n(10001) }},
		{"channels.telegram.busy.debounceMs", "got -1", func(c *Config) { c.Channels.Telegram.Busy.DebounceMs = n(-1) }},
		{"agents.defaults.busy.debounceMs", "must be set", func(c *Config) { c.Agents.Defaults.Busy.DebounceMs = nil }},
	} {
		c := Default()
		tc.set(c)
		var ce *Error
		if err := c.Validate(); !errors.As(err, &ce) || len(ce.Problems) != 1 || ce.Problems[0].Key != tc.key ||
			!strings.Contains(ce.Problems[0].Text, tc.errSub) {
			t.Errorf("%s: %v, want one problem naming it (%q)", tc.key, err, tc.errSub)
		}
	}
}

// TestBusyFromEnvironment: the busy keys load from GATEWAY_ variables,
// including a channel's maxQueued (a pointer: unset inherits).
func TestBusyFromEnvironment(t *testing.T) {
	c, err := load("", nil, []string{
		"GATEWAY_AGENTS__DEFAULTS__BUSY__MODE=collect",
		"GATEWAY_CHANNELS__TELEGRAM__BUSY__MAX_QUEUED=2",
	})
	if err != nil {
		t.Fatal(err)
	}
	if mode, max := c.BusyFor(ChannelTelegram); mode != BusyCollect || max != 2 {
		t.Errorf("telegram: %s, %d", mode, max)
	}
	if mode, max := c.BusyFor(ChannelWS); mode != BusyCollect || max != 5 {
		t.Errorf("ws: %s, %d", mode, max)
	}
	if _, err := load("", nil, []string{"GATEWAY_AGENTS__DEFAULTS__BUSY__MODE=later"}); err == nil ||
		!strings.Contains(err.Error(), "agents.defaults.busy.mode: must be one of queue, collect, steer, interrupt, reject") {
		t.Errorf("unknown mode from the environment: %v", err)
	}
}

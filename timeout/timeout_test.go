package timeout

import (
	"math"
	"strings"
	"testing"
	"time"
)

func p(v float64) *float64 { return &v }

// builtin is what a turn gets with nothing configured.
var builtin = Settings{
	Timeout:             30 * time.Minute,
	StepTimeout:         5 * time.Minute,
	MaxTurnTime:         time.Hour,
	ProgressNotifyAfter: 30 * time.Second,
	ProgressRepeat:      time.Minute,
	AbortGrace:          10 * time.Second,
	ApprovalTimeout:     5 * time.Minute,
	LivenessResetOn:     LivenessStep,
	BudgetWarningRatio:  0.8,
}

// with returns builtin with f applied.
func with(f func(s *Settings)) Settings {
	s := builtin
	f(&s)
	return s
}

func TestDefaults(t *testing.T) {
	if got := Defaults(); got != builtin {
		t.Errorf("Defaults() = %+v, want %+v", got, builtin)
	}
	if got := Resolve(0, Keys{}, Keys{}); got != builtin {
		t.Errorf("Resolve with empty layers = %+v, want the built-in defaults", got)
	}
}

func TestResolvePrecedence(t *testing.T) {
	channel := Keys{StepTimeoutSeconds: p(30), TimeoutSeconds: p(100)}
	defaults := Keys{StepTimeoutSeconds: p(60), TimeoutSeconds: p(200), AbortGraceSeconds: p(5), ProgressRepeatSeconds: p(45)}
	tests := []struct {
		name    string
		request time.Duration
		layers  []Keys
		want    Settings
	}{
		{"built-in when nothing is set", 0, nil, builtin},
		{"agents.defaults over built-in", 0, []Keys{defaults}, with(func(s *Settings) {
			s.StepTimeout, s.Timeout, s.AbortGrace, s.ProgressRepeat = 60*time.Second, 200*time.Second, 5*time.Second, 45*time.Second
		})},
		{"channel over agents.defaults, per key", 0, []Keys{channel, defaults}, with(func(s *Settings) {
			s.StepTimeout, s.Timeout = 30*time.Second, 100*time.Second     // channel
			s.AbortGrace, s.ProgressRepeat = 5*time.Second, 45*time.Second // defaults
		})},
		{"request over channel and defaults: wall clock only", 20 * time.Second, []Keys{channel, defaults}, with(func(s *Settings) {
			s.Timeout = 20 * time.Second
			s.StepTimeout, s.AbortGrace, s.ProgressRepeat = 30*time.Second, 5*time.Second, 45*time.Second
		})},
		{"0 in a higher layer is a value, not 'unset'", 0, []Keys{{StepTimeoutSeconds: p(0)}, defaults}, with(func(s *Settings) {
			s.StepTimeout = 0
			s.Timeout, s.AbortGrace, s.ProgressRepeat = 200*time.Second, 5*time.Second, 45*time.Second
		})},
		{"a lower layer's ceiling applies to a higher layer's wall clock", 0,
			[]Keys{{TimeoutSeconds: p(7200)}, {MaxTurnTimeSeconds: p(600)}}, with(func(s *Settings) {
				s.Timeout, s.MaxTurnTime = 600*time.Second, 600*time.Second
			})},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := Resolve(tt.request, tt.layers...); got != tt.want {
				t.Errorf("got  %+v\nwant %+v", got, tt.want)
			}
		})
	}
}

func TestResolveLiveness(t *testing.T) {
	tests := []struct {
		name   string
		layers []Keys
		want   LivenessMode
	}{
		{"default", nil, LivenessStep},
		{"from defaults", []Keys{{}, {LivenessResetOn: LivenessActivity}}, LivenessActivity},
		{"channel over defaults", []Keys{{LivenessResetOn: LivenessStep}, {LivenessResetOn: LivenessActivity}}, LivenessStep},
		{"channel activity", []Keys{{LivenessResetOn: LivenessActivity}, {LivenessResetOn: LivenessStep}}, LivenessActivity},
		{"unknown value → step, not the lower layer", []Keys{{LivenessResetOn: "tokens"}, {LivenessResetOn: LivenessActivity}}, LivenessStep},
		{"case matters", []Keys{{LivenessResetOn: "Activity"}}, LivenessStep},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := Resolve(0, tt.layers...).LivenessResetOn; got != tt.want {
				t.Errorf("LivenessResetOn = %q, want %q", got, tt.want)
			}
		})
	}
}

// TestResolveClamping covers every rule of Resolve's doc comment (and the
// table in docs/configuration.md), one key at a time.
func TestResolveClamping(t *testing.T) {
	nan, inf := math.NaN(), math.Inf(1)
	noCeiling := func(k Keys) Keys { k.MaxTurnTimeSeconds = p(0); return k }
	tests := []struct {
		name string
		keys Keys
		got  func(Settings) time.Duration
		want time.Duration
	}{
		// timeoutSeconds: never disabled; ≤ 7 days; ≤ the ceiling.
		{"timeout NaN → min", Keys{TimeoutSeconds: p(nan)}, wall, Min},
		{"timeout negative → min", Keys{TimeoutSeconds: p(-5)}, wall, Min},
		{"timeout -Inf → min", Keys{TimeoutSeconds: p(math.Inf(-1))}, wall, Min},
		{"timeout 0 → min (cannot be disabled)", Keys{TimeoutSeconds: p(0)}, wall, Min},
		{"timeout below min → min", Keys{TimeoutSeconds: p(0.05)}, wall, Min},
		{"timeout far below 1 ns → min", Keys{TimeoutSeconds: p(1e-12)}, wall, Min},
		{"timeout fraction", Keys{TimeoutSeconds: p(0.5)}, wall, 500 * time.Millisecond},
		{"timeout exactly min", Keys{TimeoutSeconds: p(0.1)}, wall, Min},
		{"timeout above ceiling → ceiling", Keys{TimeoutSeconds: p(5000)}, wall, time.Hour},
		{"timeout above 7 days, no ceiling → 7 days", noCeiling(Keys{TimeoutSeconds: p(1e12)}), wall, MaxWallClock},
		{"timeout +Inf, no ceiling → 7 days", noCeiling(Keys{TimeoutSeconds: p(inf)}), wall, MaxWallClock},
		{"timeout 1 day, no ceiling", noCeiling(Keys{TimeoutSeconds: p(86400)}), wall, 24 * time.Hour},

		// stepTimeoutSeconds: 0 disables; ≤ 24 h.
		{"step 0 disables", Keys{StepTimeoutSeconds: p(0)}, step, 0},
		{"step NaN → min", Keys{StepTimeoutSeconds: p(nan)}, step, Min},
		{"step negative → min", Keys{StepTimeoutSeconds: p(-1)}, step, Min},
		{"step below 1 ns → min, not disabled", Keys{StepTimeoutSeconds: p(1e-12)}, step, Min},
		{"step below min → min", Keys{StepTimeoutSeconds: p(0.01)}, step, Min},
		{"step fraction", Keys{StepTimeoutSeconds: p(0.5)}, step, 500 * time.Millisecond},
		{"step 24 h", Keys{StepTimeoutSeconds: p(86400)}, step, MaxStep},
		{"step above 24 h → 24 h", Keys{StepTimeoutSeconds: p(1e9)}, step, MaxStep},
		{"step +Inf → 24 h", Keys{StepTimeoutSeconds: p(inf)}, step, MaxStep},

		// maxTurnTimeSeconds: 0 = none; ≤ 7 days.
		{"ceiling 0 = none", Keys{MaxTurnTimeSeconds: p(0)}, ceiling, 0},
		{"ceiling negative → min", Keys{MaxTurnTimeSeconds: p(-1)}, ceiling, Min},
		{"ceiling NaN → min", Keys{MaxTurnTimeSeconds: p(nan)}, ceiling, Min},
		{"ceiling above 7 days → 7 days", Keys{MaxTurnTimeSeconds: p(1e9)}, ceiling, MaxCeiling},
		{"ceiling fraction", Keys{MaxTurnTimeSeconds: p(90.5)}, ceiling, 90500 * time.Millisecond},
		{"a negative ceiling pulls the wall clock to min", Keys{MaxTurnTimeSeconds: p(-1)}, wall, Min},
		{"no ceiling leaves the wall clock", Keys{MaxTurnTimeSeconds: p(0)}, wall, 30 * time.Minute},

		// progressNotifyAfterSeconds: 0 disables; ≤ 24 h.
		{"progress 0 disables", Keys{ProgressNotifyAfterSeconds: p(0)}, notify, 0},
		{"progress negative → min", Keys{ProgressNotifyAfterSeconds: p(-1)}, notify, Min},
		{"progress below 1 ns → min", Keys{ProgressNotifyAfterSeconds: p(1e-15)}, notify, Min},
		{"progress above 24 h → 24 h", Keys{ProgressNotifyAfterSeconds: p(1e9)}, notify, MaxProgress},
		{"progress fraction", Keys{ProgressNotifyAfterSeconds: p(0.25)}, notify, 250 * time.Millisecond},

		// progressRepeatSeconds: 0 → min; ≤ 24 h.
		{"repeat 0 → min", Keys{ProgressRepeatSeconds: p(0)}, repeat, Min},
		{"repeat negative → min", Keys{ProgressRepeatSeconds: p(-1)}, repeat, Min},
		{"repeat NaN → min", Keys{ProgressRepeatSeconds: p(nan)}, repeat, Min},
		{"repeat above 24 h → 24 h", Keys{ProgressRepeatSeconds: p(1e9)}, repeat, MaxProgress},
		{"repeat fraction", Keys{ProgressRepeatSeconds: p(1.5)}, repeat, 1500 * time.Millisecond},

		// abortGraceSeconds: 0 → min; ≤ 10 min.
		{"grace 0 → min", Keys{AbortGraceSeconds: p(0)}, grace, Min},
		{"grace negative → min", Keys{AbortGraceSeconds: p(-3)}, grace, Min},
		{"grace above 10 min → 10 min", Keys{AbortGraceSeconds: p(601)}, grace, MaxAbortGrace},
		{"grace huge → 10 min", Keys{AbortGraceSeconds: p(1e300)}, grace, MaxAbortGrace},
		{"grace just below 10 min", Keys{AbortGraceSeconds: p(599.5)}, grace, 599500 * time.Millisecond},
		{"approval unset → 5 min", Keys{}, approval, 5 * time.Minute},
		{"approval 0 → min", Keys{ApprovalTimeoutSeconds: p(0)}, approval, Min},
		{"approval above 24 h → 24 h", Keys{ApprovalTimeoutSeconds: p(90000)}, approval, MaxApproval},
		{"approval 60 s", Keys{ApprovalTimeoutSeconds: p(60)}, approval, time.Minute},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.got(Resolve(0, tt.keys)); got != tt.want {
				t.Errorf("got %v, want %v", got, tt.want)
			}
		})
	}
}

func wall(s Settings) time.Duration     { return s.Timeout }
func step(s Settings) time.Duration     { return s.StepTimeout }
func ceiling(s Settings) time.Duration  { return s.MaxTurnTime }
func notify(s Settings) time.Duration   { return s.ProgressNotifyAfter }
func repeat(s Settings) time.Duration   { return s.ProgressRepeat }
func grace(s Settings) time.Duration    { return s.AbortGrace }
func approval(s Settings) time.Duration { return s.ApprovalTimeout }

// TestResolveRequest: the per-request override replaces the wall clock,
// shorter or longer, and is clamped like timeoutSeconds.
func TestResolveRequest(t *testing.T) {
	cfg := Keys{TimeoutSeconds: p(600), MaxTurnTimeSeconds: p(3600)}
	noCeiling := Keys{TimeoutSeconds: p(600), MaxTurnTimeSeconds: p(0)}
	tests := []struct {
		name    string
		request time.Duration
		keys    Keys
		want    time.Duration
	}{
		{"none: the configured wall clock", 0, cfg, 600 * time.Second},
		{"shorter", 20 * time.Second, cfg, 20 * time.Second},
		{"longer", 40 * time.Minute, cfg, 40 * time.Minute},
		{"longer than the ceiling → the ceiling", 2 * time.Hour, cfg, time.Hour},
		{"no ceiling: longer is allowed", 2 * time.Hour, noCeiling, 2 * time.Hour},
		{"no ceiling: above 7 days → 7 days", 30 * 24 * time.Hour, noCeiling, MaxWallClock},
		{"below min → min", time.Millisecond, cfg, Min},
		{"1 ns → min", 1, cfg, Min},
		{"negative → min", -time.Second, cfg, Min},
		{"most negative → min", math.MinInt64, cfg, Min},
		{"largest → the ceiling", math.MaxInt64, cfg, time.Hour},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := Resolve(tt.request, tt.keys)
			if s.Timeout != tt.want {
				t.Errorf("Timeout = %v, want %v", s.Timeout, tt.want)
			}
			base := Resolve(0, tt.keys)
			base.Timeout = s.Timeout
			if s != base {
				t.Errorf("the request changed more than the wall clock: %+v", s)
			}
		})
	}
}

// TestResolveInvariants: whatever the input, the always-positive limits are
// positive, no limit exceeds its maximum, and the wall clock never passes a
// ceiling.
func TestResolveInvariants(t *testing.T) {
	values := []float64{math.NaN(), math.Inf(-1), -1e300, -1, -1e-300, 0, 1e-300, 1e-9, 0.1, 0.5, 1, 59.9, 3600,
		86400, 604800, 1e12, math.MaxFloat64, math.Inf(1)}
	requests := []time.Duration{math.MinInt64, -1, 0, 1, time.Second, time.Hour, math.MaxInt64}
	for _, v := range values {
		for _, req := range requests {
			k := Keys{TimeoutSeconds: p(v), StepTimeoutSeconds: p(v), MaxTurnTimeSeconds: p(v),
				ProgressNotifyAfterSeconds: p(v), ProgressRepeatSeconds: p(v), AbortGraceSeconds: p(v)}
			s := Resolve(req, k)
			switch {
			case s.Timeout < Min || s.Timeout > MaxWallClock,
				s.ProgressRepeat < Min || s.ProgressRepeat > MaxProgress,
				s.AbortGrace < Min || s.AbortGrace > MaxAbortGrace,
				s.StepTimeout != 0 && (s.StepTimeout < Min || s.StepTimeout > MaxStep),
				s.ProgressNotifyAfter != 0 && (s.ProgressNotifyAfter < Min || s.ProgressNotifyAfter > MaxProgress),
				s.MaxTurnTime != 0 && (s.MaxTurnTime < Min || s.MaxTurnTime > MaxCeiling),
				s.MaxTurnTime != 0 && s.Timeout > s.MaxTurnTime:
				t.Errorf("Resolve(%v, all keys %v) = %+v breaks a bound", req, v, s)
			}
			if v != 0 && (s.StepTimeout == 0 || s.ProgressNotifyAfter == 0 || s.MaxTurnTime == 0) {
				t.Errorf("Resolve(%v, all keys %v) = %+v: a non-zero value disabled a tier", req, v, s)
			}
		}
	}
}

func TestCheck(t *testing.T) {
	tests := []struct {
		name string
		keys Keys
		want string // "" = no error
	}{
		{"empty", Keys{}, ""},
		{"all set, zeros allowed", Keys{TimeoutSeconds: p(0), StepTimeoutSeconds: p(0), MaxTurnTimeSeconds: p(0),
			ProgressNotifyAfterSeconds: p(0), ProgressRepeatSeconds: p(0), AbortGraceSeconds: p(0), LivenessResetOn: LivenessStep}, ""},
		{"fractions and huge values are clamped, not refused", Keys{StepTimeoutSeconds: p(0.5), TimeoutSeconds: p(1e12)}, ""},
		{"activity", Keys{LivenessResetOn: LivenessActivity}, ""},
		{"negative", Keys{StepTimeoutSeconds: p(-1)}, "agents.defaults.stepTimeoutSeconds: must be a number ≥ 0, got -1"},
		{"NaN", Keys{TimeoutSeconds: p(math.NaN())}, "agents.defaults.timeoutSeconds: must be a number ≥ 0, got NaN"},
		{"+Inf", Keys{MaxTurnTimeSeconds: p(math.Inf(1))}, "agents.defaults.maxTurnTimeSeconds: must be a number ≥ 0, got +Inf"},
		{"-Inf", Keys{ProgressNotifyAfterSeconds: p(math.Inf(-1))}, "agents.defaults.progressNotifyAfterSeconds: must be a number ≥ 0, got -Inf"},
		{"progressRepeat", Keys{ProgressRepeatSeconds: p(-0.5)}, "agents.defaults.progressRepeatSeconds: must be a number ≥ 0, got -0.5"},
		{"abortGrace", Keys{AbortGraceSeconds: p(-2)}, "agents.defaults.abortGraceSeconds: must be a number ≥ 0, got -2"},
		{"budgetWarningRatio 0 (off)", Keys{BudgetWarningRatio: p(0)}, ""},
		{"budgetWarningRatio just below 1", Keys{BudgetWarningRatio: p(0.99)}, ""},
		{"budgetWarningRatio 1", Keys{BudgetWarningRatio: p(1)},
			"agents.defaults.budgetWarningRatio: must be a number from 0 (off) to below 1, got 1"},
		{"budgetWarningRatio negative", Keys{BudgetWarningRatio: p(-0.1)}, "agents.defaults.budgetWarningRatio:"},
		{"budgetWarningRatio NaN", Keys{BudgetWarningRatio: p(math.NaN())}, "agents.defaults.budgetWarningRatio:"},
		{"unknown livenessResetOn", Keys{LivenessResetOn: "tokens"},
			`agents.defaults.livenessResetOn: must be "step" or "activity", got "tokens"`},
		{"the first problem in key order", Keys{AbortGraceSeconds: p(-1), TimeoutSeconds: p(-1), LivenessResetOn: "x"},
			"agents.defaults.timeoutSeconds:"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.keys.Check("agents.defaults")
			switch {
			case tt.want == "" && err != nil:
				t.Errorf("Check = %v, want nil", err)
			case tt.want != "" && (err == nil || !strings.HasPrefix(err.Error(), tt.want)):
				t.Errorf("Check = %v, want %q", err, tt.want)
			}
		})
	}
	if err := (Keys{StepTimeoutSeconds: p(-1)}).Check("channels.ws.timeouts"); err == nil ||
		!strings.HasPrefix(err.Error(), "channels.ws.timeouts.stepTimeoutSeconds:") {
		t.Errorf("Check does not use its prefix: %v", err)
	}
}

// TestResolveBudgetWarningRatio: the ratio's precedence and clamping (0
// off; out of [0, 1) the default).
func TestResolveBudgetWarningRatio(t *testing.T) {
	tests := []struct {
		name   string
		layers []Keys
		want   float64
	}{
		{"default", nil, DefaultBudgetWarningRatio},
		{"from defaults", []Keys{{}, {BudgetWarningRatio: p(0.5)}}, 0.5},
		{"channel over defaults", []Keys{{BudgetWarningRatio: p(0.9)}, {BudgetWarningRatio: p(0.5)}}, 0.9},
		{"0 turns it off", []Keys{{BudgetWarningRatio: p(0)}, {BudgetWarningRatio: p(0.5)}}, 0},
		{"1 → the default", []Keys{{BudgetWarningRatio: p(1)}}, DefaultBudgetWarningRatio},
		{"negative → the default", []Keys{{BudgetWarningRatio: p(-1)}}, DefaultBudgetWarningRatio},
		{"NaN → the default", []Keys{{BudgetWarningRatio: p(math.NaN())}}, DefaultBudgetWarningRatio},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := Resolve(0, tt.layers...).BudgetWarningRatio; got != tt.want {
				t.Errorf("BudgetWarningRatio = %v, want %v", got, tt.want)
			}
		})
	}
}

// TestWarnAt: the warning is due at the ratio's share of the time to the
// earlier of the wall clock and the ceiling; never with ratio 0.
func TestWarnAt(t *testing.T) {
	const start = 10 * time.Second
	tests := []struct {
		name             string
		ratio            float64
		wall, ceiling    time.Duration
		wantAt, wantDead time.Duration
		wantOK           bool
	}{
		{"wall clock", 0.8, start + 100*time.Second, 0, start + 80*time.Second, start + 100*time.Second, true},
		{"ceiling first", 0.5, start + 100*time.Second, start + 60*time.Second, start + 30*time.Second, start + 60*time.Second, true},
		{"wall clock before the ceiling", 0.5, start + 60*time.Second, start + 100*time.Second, start + 30*time.Second, start + 60*time.Second, true},
		{"off", 0, start + 100*time.Second, 0, 0, 0, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			at, dead, ok := Settings{BudgetWarningRatio: tt.ratio}.WarnAt(start, tt.wall, tt.ceiling)
			if at != tt.wantAt || dead != tt.wantDead || ok != tt.wantOK {
				t.Errorf("WarnAt = %v, %v, %v; want %v, %v, %v", at, dead, ok, tt.wantAt, tt.wantDead, tt.wantOK)
			}
		})
	}
}

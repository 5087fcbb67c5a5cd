// Package timeout owns the rules that turn configured timeout keys into the
// effective durations of one turn. Everything here is a pure function: no
// clock, no I/O, no globals, so the precedence and clamping tables are tested
// exhaustively on their own (see docs/configuration.md for the table).
//
// Precedence, highest first: a per-request override of the wall clock (a
// WebSocket chat.send may pass timeoutMs), the channel's override
// (channels.<name>.timeouts), agents.defaults, the built-in defaults.
package timeout

import (
	"fmt"
	"math"
	"time"
)

// LivenessMode says what resets a turn's per-step liveness deadline.
type LivenessMode string

const (
	// LivenessStep resets the deadline when a step completes (and on an
	// explicit runner heartbeat). Streamed tokens do not count.
	LivenessStep LivenessMode = "step"
	// LivenessActivity also resets it on any activity: streamed tokens.
	LivenessActivity LivenessMode = "activity"
)

// Built-in defaults, in seconds.
const (
	DefaultTimeoutSeconds             = 1800
	DefaultStepTimeoutSeconds         = 300
	DefaultMaxTurnTimeSeconds         = 3600
	DefaultProgressNotifyAfterSeconds = 30
	DefaultProgressRepeatSeconds      = 60
	DefaultAbortGraceSeconds          = 10
	DefaultApprovalTimeoutSeconds     = 300
	// DefaultBudgetWarningRatio is the share of a turn's time limit after
	// which the runner and the person are warned (budgetWarningRatio).
	DefaultBudgetWarningRatio = 0.8
)

// Clamping bounds. A positive duration below Min is raised to Min; each key
// has its own maximum (see Resolve). These bounds are part of the documented
// contract in docs/configuration.md.
const (
	Min             = 100 * time.Millisecond
	MaxWallClock    = 7 * 24 * time.Hour
	MaxCeiling      = 7 * 24 * time.Hour
	MaxStep         = 24 * time.Hour
	MaxProgress     = 24 * time.Hour
	MaxAbortGrace   = 10 * time.Minute
	MaxApproval     = 24 * time.Hour
	DefaultLiveness = LivenessStep
)

// Keys is one layer of timeout configuration, as written in YAML. A nil
// pointer or empty string means "not set in this layer".
type Keys struct {
	TimeoutSeconds             *float64     `koanf:"timeoutSeconds" json:"timeoutSeconds,omitempty"`
	StepTimeoutSeconds         *float64     `koanf:"stepTimeoutSeconds" json:"stepTimeoutSeconds,omitempty"`
	MaxTurnTimeSeconds         *float64     `koanf:"maxTurnTimeSeconds" json:"maxTurnTimeSeconds,omitempty"`
	ProgressNotifyAfterSeconds *float64     `koanf:"progressNotifyAfterSeconds" json:"progressNotifyAfterSeconds,omitempty"`
	ProgressRepeatSeconds      *float64     `koanf:"progressRepeatSeconds" json:"progressRepeatSeconds,omitempty"`
	AbortGraceSeconds          *float64     `koanf:"abortGraceSeconds" json:"abortGraceSeconds,omitempty"`
	ApprovalTimeoutSeconds     *float64     `koanf:"approvalTimeoutSeconds" json:"approvalTimeoutSeconds,omitempty"`
	LivenessResetOn            LivenessMode `koanf:"livenessResetOn" json:"livenessResetOn,omitempty"`
	// BudgetWarningRatio is a share, not seconds: in [0, 1), 0 = no
	// warning.
	BudgetWarningRatio *float64 `koanf:"budgetWarningRatio" json:"budgetWarningRatio,omitempty"`
}

// Settings are the effective durations of one turn. A zero StepTimeout,
// MaxTurnTime or ProgressNotifyAfter means that tier is disabled; Timeout,
// ProgressRepeat and AbortGrace are always positive.
type Settings struct {
	Timeout             time.Duration // wall clock, already clamped to MaxTurnTime
	StepTimeout         time.Duration // liveness window; 0 = disabled
	MaxTurnTime         time.Duration // hard ceiling; 0 = none
	ProgressNotifyAfter time.Duration // 0 = no progress notices
	ProgressRepeat      time.Duration
	AbortGrace          time.Duration
	// ApprovalTimeout is how long a question to the person (an approval)
	// waits for an answer before it is denied; always positive. The turn's
	// wall clock and ceiling still run meanwhile.
	ApprovalTimeout time.Duration
	LivenessResetOn LivenessMode
	// BudgetWarningRatio is the share of the turn's time limit (the wall
	// clock or the ceiling, whichever ends first) after which the runner
	// is told to wrap up and the person that the turn will be stopped; in
	// [0, 1), 0 = no warning.
	BudgetWarningRatio float64
}

// Defaults returns the built-in settings.
func Defaults() Settings { return Resolve(0) }

// Resolve computes the settings of a turn. request is the per-request wall
// clock override (0 = none; negative is treated as the minimum). layers are
// the configured layers in precedence order, highest first (typically the
// channel's timeouts, then agents.defaults); a key unset in every layer takes
// its built-in default.
//
// Clamping rules (never turning a value into "no timeout"):
//   - NaN or a negative value of any key → the minimum (0.1 s), except that
//     0 keeps its meaning where it has one (disabled / none).
//   - timeoutSeconds: 0 → the minimum (the wall clock cannot be disabled);
//     above 7 days → 7 days; above the ceiling → the ceiling.
//   - stepTimeoutSeconds: 0 disables; above 24 h → 24 h.
//   - maxTurnTimeSeconds: 0 = no ceiling; above 7 days → 7 days.
//   - progressNotifyAfterSeconds: 0 disables; above 24 h → 24 h.
//   - progressRepeatSeconds: 0 → the minimum; above 24 h → 24 h.
//   - abortGraceSeconds: 0 → the minimum; above 10 min → 10 min.
//   - approvalTimeoutSeconds: 0 → the minimum; above 24 h → 24 h.
//   - the request override replaces the wall clock (shorter or longer) and is
//     then clamped like timeoutSeconds, so never past the ceiling.
//   - an unknown livenessResetOn value → "step".
//   - budgetWarningRatio: 0 disables; NaN, negative, or 1 and above → the
//     default 0.8 (a warning at or past the kill would say nothing).
func Resolve(request time.Duration, layers ...Keys) Settings {
	pick := func(get func(Keys) *float64, def float64) float64 {
		for _, l := range layers {
			if v := get(l); v != nil {
				return *v
			}
		}
		return def
	}
	s := Settings{
		StepTimeout:         clamp(pick(func(k Keys) *float64 { return k.StepTimeoutSeconds }, DefaultStepTimeoutSeconds), true, MaxStep),
		MaxTurnTime:         clamp(pick(func(k Keys) *float64 { return k.MaxTurnTimeSeconds }, DefaultMaxTurnTimeSeconds), true, MaxCeiling),
		ProgressNotifyAfter: clamp(pick(func(k Keys) *float64 { return k.ProgressNotifyAfterSeconds }, DefaultProgressNotifyAfterSeconds), true, MaxProgress),
		ProgressRepeat:      clamp(pick(func(k Keys) *float64 { return k.ProgressRepeatSeconds }, DefaultProgressRepeatSeconds), false, MaxProgress),
		AbortGrace:          clamp(pick(func(k Keys) *float64 { return k.AbortGraceSeconds }, DefaultAbortGraceSeconds), false, MaxAbortGrace),
		ApprovalTimeout:     clamp(pick(func(k Keys) *float64 { return k.ApprovalTimeoutSeconds }, DefaultApprovalTimeoutSeconds), false, MaxApproval),
		LivenessResetOn:     DefaultLiveness,
		BudgetWarningRatio:  ratio(pick(func(k Keys) *float64 { return k.BudgetWarningRatio }, DefaultBudgetWarningRatio)),
	}
	for _, l := range layers {
		if l.LivenessResetOn != "" {
			if l.LivenessResetOn == LivenessActivity {
				s.LivenessResetOn = LivenessActivity
			}
			break
		}
	}
	if request != 0 {
		s.Timeout = clampDuration(request, false, MaxWallClock)
	} else {
		s.Timeout = clamp(pick(func(k Keys) *float64 { return k.TimeoutSeconds }, DefaultTimeoutSeconds), false, MaxWallClock)
	}
	if s.MaxTurnTime > 0 && s.Timeout > s.MaxTurnTime {
		s.Timeout = s.MaxTurnTime
	}
	return s
}

// ratio applies budgetWarningRatio's rule: in [0, 1), else the default.
func ratio(v float64) float64 {
	if math.IsNaN(v) || v < 0 || v >= 1 {
		return DefaultBudgetWarningRatio
	}
	return v
}

// WarnAt returns when a turn that started at start (any time base) is due
// its budget warning, in the same time base, and the deadline it warns of
// (the earlier of the wall clock and the ceiling): start plus the ratio's
// share of the time up to that deadline. ceiling is 0 when there is none.
// ok is false when the warning is off (BudgetWarningRatio 0).
func (s Settings) WarnAt(start, wall, ceiling time.Duration) (at, deadline time.Duration, ok bool) {
	if s.BudgetWarningRatio <= 0 || s.BudgetWarningRatio >= 1 {
		return 0, 0, false
	}
	deadline = wall
	if ceiling > 0 && ceiling < deadline {
		deadline = ceiling
	}
	return start + time.Duration(s.BudgetWarningRatio*float64(deadline-start)), deadline, true
}

// clamp converts seconds to a duration and applies the rules above.
func clamp(seconds float64, zeroDisables bool, max time.Duration) time.Duration {
	switch {
	case math.IsNaN(seconds) || seconds < 0:
		return Min
	case seconds == 0:
		if zeroDisables {
			return 0
		}
		return Min
	case seconds >= max.Seconds():
		return max
	}
	d := time.Duration(seconds * float64(time.Second))
	if d < Min {
		// Positive but below the minimum; without this a value under 1 ns
		// would truncate to 0 and disable the tier.
		return Min
	}
	return clampDuration(d, zeroDisables, max)
}

func clampDuration(d time.Duration, zeroDisables bool, max time.Duration) time.Duration {
	switch {
	case d < 0:
		return Min
	case d == 0 && zeroDisables:
		return 0
	case d < Min:
		return Min
	case d > max:
		return max
	}
	return d
}

// Named is one seconds key of a layer: its YAML name and its value (nil
// when unset).
type Named struct {
	Name string
	V    *float64
}

// Named lists the layer's seconds keys in the documented order.
func (k Keys) Named() []Named {
	return []Named{
		{"timeoutSeconds", k.TimeoutSeconds},
		{"stepTimeoutSeconds", k.StepTimeoutSeconds},
		{"maxTurnTimeSeconds", k.MaxTurnTimeSeconds},
		{"progressNotifyAfterSeconds", k.ProgressNotifyAfterSeconds},
		{"progressRepeatSeconds", k.ProgressRepeatSeconds},
		{"abortGraceSeconds", k.AbortGraceSeconds},
		{"approvalTimeoutSeconds", k.ApprovalTimeoutSeconds},
	}
}

// Check reports the first problem with the keys of one configuration layer,
// for config validation: a negative or non-finite value, or an unknown
// livenessResetOn, or a budgetWarningRatio outside [0, 1). prefix names the layer in the error (e.g.
// "agents.defaults"). Resolve would clamp such values; Check lets the loader
// refuse them instead, naming the key.
func (k Keys) Check(prefix string) error {
	for _, f := range k.Named() {
		if f.V == nil {
			continue
		}
		if v := *f.V; math.IsNaN(v) || math.IsInf(v, 0) || v < 0 {
			return fmt.Errorf("%s.%s: must be a number ≥ 0, got %v", prefix, f.Name, v)
		}
	}
	if r := k.BudgetWarningRatio; r != nil && !(*r >= 0 && *r < 1) {
		return fmt.Errorf("%s.budgetWarningRatio: must be a number from 0 (off) to below 1, got %v", prefix, *r)
	}
	switch k.LivenessResetOn {
	case "", LivenessStep, LivenessActivity:
	default:
		return fmt.Errorf("%s.livenessResetOn: must be %q or %q, got %q", prefix, LivenessStep, LivenessActivity, k.LivenessResetOn)
	}
	return nil
}

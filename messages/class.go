package messages

// TurnClass is the /status line that says what a running turn is doing:
// its stall class (maintenance.Class's names: working, long_running,
// stalled, stuck), "" for none or an unknown one.
func TurnClass(class string) string {
	switch class {
	case "working":
		return "🟢 Making progress."
	case "long_running":
		return "🟡 One step is taking long, but it still shows signs of life."
	case "stalled":
		return "🟠 No sign of progress lately; it will be stopped if none comes before the no-progress limit."
	case "stuck":
		return "🔴 Stuck: it is past its limit and the work has not stopped yet."
	}
	return ""
}

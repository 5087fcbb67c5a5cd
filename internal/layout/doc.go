// Package layout holds no code: its test checks the import rules that keep
// turnguard's rooms apart (see docs/architecture.md). The vocabulary
// (event, messages, timeout) imports nothing of turnguard's; what the engine
// builds on (runner, store, config) never imports the engine, a channel or
// the operator side; the engine imports no channel and no operator package;
// channels and the operator side do not import each other.
package layout

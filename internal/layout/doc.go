// Package layout holds no code: its test checks the import rules that keep
// turnguard's rooms apart (see docs/architecture.md). The vocabulary
// (event, messages, timeout) imports nothing of turnguard's but event (the
// user texts render events); the abort registry and the scheduler carry
// facts and do not import the user texts; what the engine builds on
// (runner, store, config, and cluster/pgcoord, the cluster's coordination
// on the store's schema) never imports the engine, a channel or the
// operator side, and the store never imports the cluster; the cluster
// transport (cluster/natsbus) imports only the vocabulary; the engine
// imports no channel and no operator package; channels and the operator
// side do not import each other; and no channel imports the engine's
// machinery (gateway/abort, gateway/maintenance) itself: channels see
// turns as values (gateway.TurnStatus, StopResult).
package layout

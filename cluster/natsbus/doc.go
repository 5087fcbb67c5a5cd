// Package natsbus owns the live event transport between gateway replicas
// (issue 12): how one replica's event.Events reach the clients watching the
// same session through another replica, over NATS JetStream. It is the bus
// (event.Bus) stretched across processes, hence the name; it decides
// nothing and keeps nothing that matters after a restart — PostgreSQL
// does. It imports only the vocabulary (event/).
//
// Four parts:
//
//   - the wire: a binary frame per NATS message carrying every Event field
//     but Locals, plus the transport's per-session sequence (wire.go);
//   - Exporter, the owner side: numbers a session's kept events (every kind
//     but Delta) with a per-session sequence that continues across owners,
//     and publishes them to a JetStream memory stream; deltas go to a core
//     subject outside the stream and may drop;
//   - Interest, the replicas' registry of the sessions each shows to
//     someone, so an owner publishes a turn's live events only while
//     another replica will deliver them (interest.go);
//   - Watcher, the other side: delivers one session's (or every session's)
//     events in sequence order, drops late and duplicate frames, repairs a
//     gap from the stream and, when it cannot, reports it (OnGap, a
//     *GapError) so a WebSocket connection closes with 1012 and its client
//     reloads history: never a silent gap. A watcher of every
//     session follows in sequence only the sessions its replica shows
//     (WatchOptions.Follow) and decodes nothing it will not deliver: of
//     the others only turns' ends, and none of its own exporter's frames
//     (their head keeps the sequence).
//
// The guarantee, and where it ends: a watcher either delivers a session's
// kept events exactly in sequence with none missing, or calls OnGap. Three
// mechanisms make a missing event visible even when nothing follows it: the
// exporter publishes a frameLost for events its full buffer dropped and a
// frameSync after a kept event it could not store; a watcher checks the
// stream's last frame of every session it follows after a reconnect or
// after its own subscription dropped messages; and it checks a session
// whose turn is still running (its last event is not terminal) when it has
// heard nothing for TailCheck. The window it cannot close: an owner that
// dies between numbering an event and any copy of it reaching NATS — the
// next owner continues after the stream's last frame, and that event is
// simply not part of the live sequence (the store is the record).
package natsbus

package acp

import "time"

// session is the ACP session that serves one turnguard conversation.
type session struct {
	conv     string // turnguard's Turn.SessionID
	key      string // turnguard's Turn.SessionKey
	id       string // the agent's sessionId; "" until session/new answered
	ag       *agent
	lastUsed time.Time
	busy     int // turns running on it
	grants   grants
}

// table is the runner's bookkeeping of ACP sessions: which agent session
// serves which conversation and since when it is unused. It holds no lock
// and reads no clock (the runner passes now), so its rules are tested
// alone.
//
// Rules: a conversation keeps its session while the session's agent lives,
// is not retiring, and the session was used within idle. A session key
// whose conversation changed (/new) drops the old conversation's session at
// once. An agent none of whose sessions is left and that runs no turn is
// idle: the runner stops it.
type table struct {
	idle  time.Duration
	convs map[string]*session // by conversation
	keys  map[string]string   // session key → its current conversation
}

func newTable(idle time.Duration) *table {
	return &table{idle: idle, convs: map[string]*session{}, keys: map[string]string{}}
}

// usable reports whether s may serve another turn at now on agent ag.
func (t *table) usable(s *session, ag *agent, now time.Time) bool {
	return s.ag == ag && s.id != "" && !ag.isDead() && (s.busy > 0 || now.Sub(s.lastUsed) < t.idle)
}

// take returns the session of conversation conv (of session key key) for a
// turn on agent ag at now, marked busy: the existing one when usable, else
// a new one without an id (fresh), which the caller opens with session/new
// and fills in (or drops with release on failure). gone is the session of
// the key's previous conversation (after /new) that take dropped, if any:
// the caller closes it.
func (t *table) take(key, conv string, ag *agent, now time.Time) (s *session, fresh bool, gone *session) {
	if old, ok := t.keys[key]; ok && old != conv {
		if s := t.convs[old]; s != nil && s.busy == 0 {
			delete(t.convs, old)
			gone = s
		}
	}
	t.keys[key] = conv
	if s := t.convs[conv]; s != nil && t.usable(s, ag, now) {
		s.busy++
		return s, false, gone
	}
	s = &session{conv: conv, key: key, ag: ag, lastUsed: now, busy: 1}
	t.convs[conv] = s
	return s, true, gone
}

// release ends a turn on s at now; a session that failed to open (no id)
// or whose agent died is forgotten.
func (t *table) release(s *session, now time.Time) {
	s.busy--
	s.lastUsed = now
	if (s.id == "" || s.ag.isDead()) && s.busy == 0 && t.convs[s.conv] == s {
		delete(t.convs, s.conv)
	}
}

// expire forgets the sessions unused for idle at now (and those of dead
// agents), and returns when the next one expires (zero: none left).
func (t *table) expire(now time.Time) (next time.Time) {
	for conv, s := range t.convs {
		if s.busy > 0 {
			continue
		}
		at := s.lastUsed.Add(t.idle)
		if !now.Before(at) || s.ag.isDead() {
			delete(t.convs, conv)
			if t.keys[s.key] == conv {
				delete(t.keys, s.key)
			}
			continue
		}
		if next.IsZero() || at.Before(next) {
			next = at
		}
	}
	return next
}

// held reports whether a session of ag other than a fresh one already has
// the agent's session id id: an agent that answers session/new with it
// again would mix two conversations.
func (t *table) held(ag *agent, id string) bool {
	for _, s := range t.convs {
		if s.ag == ag && s.id == id {
			return true
		}
	}
	return false
}

// uses counts the sessions (busy or not) held on ag.
func (t *table) uses(ag *agent) int {
	n := 0
	for _, s := range t.convs {
		if s.ag == ag {
			n++
		}
	}
	return n
}

package busauth

import (
	"encoding/hex"
	"strconv"
	"strings"
)

// The subject layout, as the permissions see it. A replica's own
// subjects carry its id in hex (a host name's dots would be subject
// tokens), so a permission can name exactly one replica's.

// RPCPrefix is the first two tokens of replica's forwarded-request
// subjects (<RPCPrefix>.send, .abort, .resolve, .stop): only replica
// subscribes there.
func RPCPrefix(replica string) string { return "tgrpc." + hex.EncodeToString([]byte(replica)) }

// InboxPrefix is the prefix of replica's reply subjects (nats.Conn's
// custom inbox prefix): only replica subscribes there, so no other client
// reads the answers to its requests or its JetStream traffic.
func InboxPrefix(replica string) string { return "_INBOX_" + hex.EncodeToString([]byte(replica)) }

// User is one user of the nats-server authorization block.
type User struct {
	Name, Password string
	// Publish and Subscribe are the subjects the user may use; both nil
	// gives the user every right (an operator's tool, a test harness).
	Publish, Subscribe []string
	// AllowResponses lets the user answer the requests it receives (on
	// their reply subjects, whatever they are).
	AllowResponses bool
}

// ReplicaUser is the user a replica connects as, with the rights a
// replica needs and no more: it publishes forwarded requests to any
// replica and events, Telegram updates, JetStream API calls and
// acknowledgements, leases and memberships (KV); it subscribes to its own
// forwarded requests, its own inbox and the events (every replica watches
// every session); it answers the requests it receives. It cannot
// subscribe to another replica's requests or inbox.
func ReplicaUser(replica, password string) User {
	return User{
		Name:     replica,
		Password: password,
		Publish: []string{"tgrpc.*.*", "tg.>", "tgu.upd.*",
			"$JS.API.>", "$JS.ACK.>", "$JS.FC.>", "$KV.>"},
		Subscribe:      []string{RPCPrefix(replica) + ".*", InboxPrefix(replica) + ".>", "tg.>"},
		AllowResponses: true,
	}
}

// Authorization renders the nats-server configuration block that admits
// exactly users (include it in the server's configuration file, or run
// the server with it as its -c file plus the listen and JetStream flags).
func Authorization(users []User) string {
	var b strings.Builder
	b.WriteString("authorization {\n  users = [\n")
	for _, u := range users {
		b.WriteString("    {user: " + strconv.Quote(u.Name) + ", password: " + strconv.Quote(u.Password))
		if u.Publish != nil || u.Subscribe != nil {
			b.WriteString(", permissions: {publish: {allow: " + list(u.Publish) + "}, subscribe: {allow: " + list(u.Subscribe) + "}")
			if u.AllowResponses {
				b.WriteString(", allow_responses: true")
			}
			b.WriteString("}")
		}
		b.WriteString("}\n")
	}
	b.WriteString("  ]\n}\n")
	return b.String()
}

func list(subjects []string) string {
	q := make([]string, len(subjects))
	for i, s := range subjects {
		q[i] = strconv.Quote(s)
	}
	return "[" + strings.Join(q, ", ") + "]"
}
